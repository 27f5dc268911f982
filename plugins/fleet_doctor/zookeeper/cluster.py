"""What the repair reads from and writes to Kafka's ZooKeeper metadata while it acts (znodes: kafka-reference.md §5).

``Cluster`` wraps a started kazoo client (``fleet_doctor.zookeeper.session``) whose hosts string carries Kafka's
chroot: the health gates between restarts (``fleet_doctor.cluster_health``: registered brokers, controller, partition
state, min ISR, racks), read here from ZooKeeper, the one write a repair makes to Kafka's znodes, a topic's lost
``topic_id`` put back with a version-checked ``set``, and a roll's request to the controller, a preferred-leader
election (``/admin/preferred_replica_election``). A topic's ``min.insync.replicas`` override is in
``/config/topics/<topic>``, a broker's in ``/config/brokers/<id>``, the dynamic cluster-wide default in
``/config/brokers/<default>`` (``ConfigEntityName.Default``).
"""

from __future__ import annotations

import json
import time
from typing import Any

from fleet_doctor.cluster_health import KAFKA_DEFAULT_MIN_ISR, MIN_ISR, ClusterHealth
from fleet_doctor.cluster_health import min_isr_value as _min_isr_value

__all__ = ["CLUSTER_DEFAULT_PATH", "DEFAULT_ENTITY", "KAFKA_DEFAULT_MIN_ISR", "MIN_ISR", "Cluster", "topic_path"]

DEFAULT_ENTITY = "<default>"  # Kafka's ConfigEntityName.Default: the cluster-wide dynamic broker config
CLUSTER_DEFAULT_PATH = f"/config/brokers/{DEFAULT_ENTITY}"  # the cluster-wide dynamic broker config
PREFERRED_ELECTION = "/admin/preferred_replica_election"  # PreferredReplicaElectionZNode: the controller deletes it


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

    def racks(self) -> dict[int, str | None]:
        return {b: r.get("rack") for b, r in self.registrations().items()}

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

    def elect_preferred(self, partitions: list[tuple[str, int]], timeout: float) -> dict[str, str | None]:
        """A preferred-leader election of exactly ``partitions`` through ``/admin/preferred_replica_election`` (the
        znode every ZooKeeper-mode controller watches; Kafka's own tool before 2.4): written once no other election
        is in progress, then waited for until the controller deletes it, within ``timeout``. Each partition's
        outcome: None when its preferred replica (the first of its replicas) leads it now, else why not."""
        from kazoo.exceptions import NodeExistsError

        body = {"version": 1, "partitions": [{"topic": t, "partition": p} for t, p in sorted(set(partitions))]}
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.zk.create(PREFERRED_ELECTION, json.dumps(body, separators=(",", ":")).encode(), makepath=True)
                break
            except NodeExistsError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"another preferred replica election is in progress ({PREFERRED_ELECTION}) for {timeout:.0f} s"
                    ) from None
                time.sleep(0.2)
        while self.zk.exists(PREFERRED_ELECTION):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the controller did not complete the preferred election within {timeout:.0f} s")
            time.sleep(0.1)
        from kazoo.exceptions import NoNodeError

        out: dict[str, str | None] = {}
        for t, p in sorted(set(partitions)):
            try:
                replicas = json.loads(self.zk.get(topic_path(t))[0])["partitions"].get(str(p)) or []
                leader = json.loads(self.zk.get(f"{topic_path(t)}/partitions/{p}/state")[0])["leader"]
            except NoNodeError:
                out[f"{t}-{p}"] = "gone from ZooKeeper (the topic deleted since the roll's plan?)"
                continue
            out[f"{t}-{p}"] = (
                None
                if replicas and leader == replicas[0]
                else f"led by {leader} after the election: its preferred replica {replicas[:1]} not alive or not in ISR"
            )
        return out

    def partitions(self) -> list[dict[str, Any]]:
        out = []
        resolved = self.resolver()
        for topic in self.zk.get_children("/brokers/topics"):
            znode = json.loads(self.zk.get(f"/brokers/topics/{topic}")[0])
            for p, replicas in znode["partitions"].items():
                st = json.loads(self.zk.get(f"/brokers/topics/{topic}/partitions/{p}/state")[0])
                out.append(self.partition(topic, int(p), replicas, st["isr"], st["leader"], resolved))
        return out
