"""What the repair reads from and writes to Kafka's ZooKeeper metadata while it acts (znodes: kafka-reference.md §5).

``Cluster`` wraps a started kazoo client (``fleet_doctor.zookeeper.session``) whose hosts string carries Kafka's
chroot: the health gates between restarts (``fleet_doctor.cluster_health``: registered brokers, controller, partition
state, min ISR), read here from ZooKeeper, and the one write a repair makes to Kafka's znodes, a topic's lost
``topic_id`` put back with a version-checked ``set``. A topic's ``min.insync.replicas`` override is in
``/config/topics/<topic>``, a broker's in ``/config/brokers/<id>``, the dynamic cluster-wide default in
``/config/brokers/<default>`` (``ConfigEntityName.Default``).
"""

from __future__ import annotations

import json
from typing import Any

from fleet_doctor.cluster_health import KAFKA_DEFAULT_MIN_ISR, MIN_ISR, ClusterHealth
from fleet_doctor.cluster_health import min_isr_value as _min_isr_value

__all__ = ["CLUSTER_DEFAULT_PATH", "DEFAULT_ENTITY", "KAFKA_DEFAULT_MIN_ISR", "MIN_ISR", "Cluster", "topic_path"]

DEFAULT_ENTITY = "<default>"  # Kafka's ConfigEntityName.Default: the cluster-wide dynamic broker config
CLUSTER_DEFAULT_PATH = f"/config/brokers/{DEFAULT_ENTITY}"  # the cluster-wide dynamic broker config


def topic_path(topic: str) -> str:
    return f"/brokers/topics/{topic}"


class Cluster(ClusterHealth):
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

    def config(self, kind: str, name: str | int | None) -> tuple[dict[str, Any], str]:
        if kind == "topic":
            path = f"/config/topics/{name}"
        else:
            path = CLUSTER_DEFAULT_PATH if name is None else f"/config/brokers/{name}"
        return self._config(path), path

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
        resolved = self.resolver()
        for topic in self.zk.get_children("/brokers/topics"):
            znode = json.loads(self.zk.get(f"/brokers/topics/{topic}")[0])
            for p, replicas in znode["partitions"].items():
                st = json.loads(self.zk.get(f"/brokers/topics/{topic}/partitions/{p}/state")[0])
                out.append(self.partition(topic, int(p), replicas, st["isr"], st["leader"], resolved))
        return out
