"""What the repair reads from and writes to Kafka's ZooKeeper metadata while it acts (znodes: kafka-reference.md §5).

``Cluster`` wraps a started kazoo client (``fleet_doctor.zookeeper.session``) whose hosts string carries Kafka's
chroot: the health gates between restarts (registered brokers, controller, partition state, min ISR) and the one
write a repair makes to Kafka's znodes, a topic's lost ``topic_id`` put back with a version-checked ``set``.

A partition's ``min.insync.replicas`` is resolved as Kafka resolves a topic's log config (``LogConfig`` over the
broker defaults): the topic's override in ``/config/topics/<topic>``, else the dynamic cluster-wide default in
``/config/brokers/<default>`` (``ConfigEntityName.Default``), else the static default of the brokers'
``server.properties`` (which ZooKeeper does not hold: the caller passes it, from the inventory or a DAG param), else
Kafka's built-in 1. A broker's own dynamic value (``/config/brokers/<id>``: ``min.insync.replicas`` is a cluster-wide
config that Kafka also accepts per broker) stands above the cluster-wide default for that broker; the leader enforces
its own, and a stop moves leadership to another replica, so a partition without a topic override takes the strictest
value among its replicas' brokers.
"""

from __future__ import annotations

import json
from typing import Any

DEFAULT_ENTITY = "<default>"  # Kafka's ConfigEntityName.Default: the cluster-wide dynamic broker config
MIN_ISR = "min.insync.replicas"
KAFKA_DEFAULT_MIN_ISR = 1  # ServerLogConfigs.MIN_IN_SYNC_REPLICAS_DEFAULT
CLUSTER_DEFAULT_PATH = f"/config/brokers/{DEFAULT_ENTITY}"  # the cluster-wide dynamic broker config


def topic_path(topic: str) -> str:
    return f"/brokers/topics/{topic}"


def _min_isr_value(raw: Any, where: str) -> int:
    """A ``min.insync.replicas`` value as Kafka stores it (a string): an int of at least 1, else ValueError."""
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{where}: min.insync.replicas {raw!r} is not a positive integer: fix the config")
    return value


class Cluster:
    """What the health gates read from ZooKeeper (kazoo client, chroot in its hosts string)."""

    def __init__(self, zk: Any, default_min_isr: int | None = None) -> None:
        """``default_min_isr``: the brokers' static ``min.insync.replicas`` (server.properties), used for a topic
        that has no override when ZooKeeper holds no cluster-wide default either; None: Kafka's default, 1."""
        if default_min_isr is not None:
            _min_isr_value(default_min_isr, "default_min_isr")
        self.zk = zk
        self.default_min_isr = default_min_isr

    def _config(self, path: str) -> dict[str, Any]:
        """The ``config`` map of a config znode (``{"version":1,"config":{...}}``); {} when there is none."""
        from kazoo.exceptions import NoNodeError

        try:
            raw = self.zk.get(path)[0]
        except NoNodeError:
            return {}
        try:
            return dict(json.loads(raw or b"{}").get("config") or {})
        except (ValueError, AttributeError, TypeError) as e:
            raise ValueError(f"{path}: not a Kafka config znode ({e}): fix it before a repair") from None

    def cluster_min_isr(self) -> tuple[int, str]:
        """The ``min.insync.replicas`` of a topic without an override, and where it comes from."""
        path = CLUSTER_DEFAULT_PATH
        cfg = self._config(path)
        if MIN_ISR in cfg:
            return _min_isr_value(cfg[MIN_ISR], path), path
        if self.default_min_isr is not None:
            return self.default_min_isr, "the brokers' static default (inventory or parameter)"
        return KAFKA_DEFAULT_MIN_ISR, "Kafka's default"

    def topic_min_isr(self, topic: str) -> tuple[int, str] | None:
        """A topic's own ``min.insync.replicas`` override and its znode; None when it has none."""
        path = f"/config/topics/{topic}"
        cfg = self._config(path)
        if MIN_ISR in cfg:
            return _min_isr_value(cfg[MIN_ISR], path), path
        return None

    def broker_min_isr(self, broker_id: int, cluster_default: tuple[int, str]) -> tuple[int, str]:
        """A broker's ``min.insync.replicas`` for topics without an override: its own dynamic value
        (``/config/brokers/<id>``), else ``cluster_default`` (``cluster_min_isr``)."""
        path = f"/config/brokers/{broker_id}"
        cfg = self._config(path)
        if MIN_ISR in cfg:
            return _min_isr_value(cfg[MIN_ISR], path), path
        return cluster_default

    def replicas_min_isr(
        self, replicas: list[int], cluster_default: tuple[int, str], brokers: dict[int, tuple[int, str]]
    ) -> tuple[int, str]:
        """The ``min.insync.replicas`` of a partition without a topic override: the strictest of its replicas'
        brokers (``broker_min_isr``, cached in ``brokers``): whichever of them leads enforces its own."""
        for r in replicas:
            if r not in brokers:
                brokers[r] = self.broker_min_isr(r, cluster_default)
        return max((brokers[r] for r in replicas), key=lambda v: v[0], default=cluster_default)

    def cluster_id(self) -> str | None:
        """``/cluster/id``'s ``id`` (Kafka 0.10.1+ writes it once, at the first broker's start); None when absent."""
        from kazoo.exceptions import NoNodeError

        try:
            raw = self.zk.get("/cluster/id")[0]
        except NoNodeError:
            return None
        try:
            return str(json.loads(raw)["id"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"/cluster/id: not Kafka's cluster id znode ({e!r}): fix it before a repair") from None

    def registered(self) -> set[int]:
        return {int(i) for i in self.zk.get_children("/brokers/ids")}

    def controller(self) -> int | None:
        try:
            return json.loads(self.zk.get("/controller")[0])["brokerid"]
        except Exception:  # no controller elected right now
            return None

    def registrations(self) -> dict[int, dict[str, Any]]:
        """``/brokers/ids/<id>`` of every registered broker: its JSON (``{}`` when unreadable)."""
        out: dict[int, dict[str, Any]] = {}
        for child in self.zk.get_children("/brokers/ids"):
            try:
                out[int(child)] = json.loads(self.zk.get(f"/brokers/ids/{child}")[0])
            except ValueError:
                out[int(child)] = {}
        return out

    def topic_id(self, topic: str) -> str | None:
        return self.topic_znode(topic)[0].get("topic_id")

    def topic_znode(self, topic: str) -> tuple[dict[str, Any], int]:
        """``/brokers/topics/<topic>`` and its znode version (for a version-checked write)."""
        raw, stat = self.zk.get(topic_path(topic))
        return json.loads(raw), stat.version

    def write_topic_znode(self, topic: str, znode: dict[str, Any], version: int) -> None:
        """Replace ``/brokers/topics/<topic>`` if it is still at ``version`` (kazoo's BadVersionError otherwise):
        a concurrent change (a controller minting a topic ID, an admin tool) is never overwritten."""
        self.zk.set(topic_path(topic), json.dumps(znode, separators=(",", ":")).encode(), version=version)

    def partitions(self) -> list[dict[str, Any]]:
        out = []
        cluster_default = self.cluster_min_isr()
        brokers: dict[int, tuple[int, str]] = {}
        for topic in self.zk.get_children("/brokers/topics"):
            znode = json.loads(self.zk.get(f"/brokers/topics/{topic}")[0])
            own = self.topic_min_isr(topic)
            for p, replicas in znode["partitions"].items():
                st = json.loads(self.zk.get(f"/brokers/topics/{topic}/partitions/{p}/state")[0])
                min_isr, source = own or self.replicas_min_isr(replicas, cluster_default, brokers)
                out.append(
                    {
                        "topic": topic,
                        "partition": int(p),
                        "replicas": replicas,
                        "isr": st["isr"],
                        "leader": st["leader"],
                        "min_isr": min_isr,
                        "min_isr_source": source,
                    }
                )
        return out

    def problems(
        self,
        expected: set[int],
        tolerate: frozenset[int] = frozenset(),
        pending: frozenset[tuple[str, int, int]] = frozenset(),
        partitions: list[dict[str, Any]] | None = None,
    ) -> list[str]:
        """Unregistered brokers, under-replicated and offline partitions. Not counted: a replica missing from ISR
        when its broker is in ``tolerate`` (the broker about to be repaired: its restart is what brings it back;
        it may be down already, as in seed-000 where the broker refusing to start is the one to repair), or when
        it is in ``pending`` as (topic, partition, broker): a replica this plan repairs later (seed-004: every
        broker whose ``partition.metadata`` is wrong is out of ISR for that partition until its turn).
        ``partitions``: ``partitions()`` as the caller just read it (read here when None)."""
        live = self.registered()
        out = [f"broker {b} not registered" for b in sorted(expected - live - tolerate)]
        for p in self.partitions() if partitions is None else partitions:
            missing = {
                r
                for r in set(p["replicas"]) - set(p["isr"])
                if r not in tolerate and (p["topic"], p["partition"], r) not in pending
            }
            if p["leader"] not in live:
                out.append(f"{p['topic']}-{p['partition']} offline")
            elif missing:
                out.append(f"{p['topic']}-{p['partition']} under-replicated (ISR {p['isr']})")
        return out

    @staticmethod
    def in_isr(partitions: list[dict[str, Any]], broker_id: int) -> tuple[int, int]:
        """Of the partitions (``partitions()``) that have a replica on ``broker_id``: how many have it in their ISR,
        and how many there are."""
        mine = [p for p in partitions if broker_id in p["replicas"]]
        return sum(broker_id in p["isr"] for p in mine), len(mine)

    def below_min_isr_if_stopped(self, broker_id: int) -> list[str]:
        """Strimzi's rule: stopping the broker must not take any partition below min.insync.replicas."""
        return [
            f"{p['topic']}-{p['partition']} (ISR {p['isr']}, min.insync.replicas {p['min_isr']} from "
            f"{p['min_isr_source']})"
            for p in self.partitions()
            if broker_id in p["isr"] and len(p["isr"]) - 1 < p["min_isr"]
        ]
