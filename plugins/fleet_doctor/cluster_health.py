"""The health gates' view of a cluster, written once for both metadata modes: what the executor asks between
restarts (registered brokers, the controller, partitions with their ISR and ``min.insync.replicas``, under-replicated
and offline partitions, min ISR kept if a broker stops). ``zookeeper.cluster.Cluster`` reads it from ZooKeeper,
``repair.kraft_cluster.KraftCluster`` from the committed metadata of a KRaft quorum; each gives ``registered``,
``controller``, ``partitions`` and where a config lives (``config``), and the rules here are the same for both.

A partition's ``min.insync.replicas`` is resolved as Kafka resolves a topic's log config (``LogConfig`` over the
broker defaults): the topic's override, else the broker's own dynamic value, else the dynamic cluster-wide default
(ZooKeeper's ``/config/brokers/<default>``, KRaft's ConfigRecord of broker resource ""), else the static default of the
brokers' ``server.properties`` (which the metadata does not hold: the caller passes it, from the inventory or a DAG
param), else Kafka's built-in 1. The leader enforces its own value, and a stop moves leadership to another replica, so
a partition without a topic override takes the strictest value among its replicas' brokers.
"""

from __future__ import annotations

from typing import Any

MIN_ISR = "min.insync.replicas"
KAFKA_DEFAULT_MIN_ISR = 1  # ServerLogConfigs.MIN_IN_SYNC_REPLICAS_DEFAULT
CLUSTER_DEFAULT = None  # the config entity of the cluster-wide dynamic broker config (``config("broker", None)``)


def min_isr_value(raw: Any, where: str) -> int:
    """A ``min.insync.replicas`` value as Kafka stores it (a string): an int of at least 1, else ValueError."""
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{where}: min.insync.replicas {raw!r} is not a positive integer: fix the config")
    return value


class ClusterHealth:
    """The gates' rules over what a subclass reads: ``registered``, ``controller``, ``partitions``, ``config``."""

    default_min_isr: int | None = None  # the brokers' static min.insync.replicas (server.properties), when known
    registration = "/brokers/ids entry"  # what ``registered`` reads, for messages

    # ---- what a metadata mode reads
    def registered(self) -> set[int]:
        """The brokers up and serving: registered in ZooKeeper, or registered and unfenced on KRaft."""
        raise NotImplementedError

    def controller(self) -> int | None:
        """The active controller (ZooKeeper's ``/controller``, KRaft's quorum leader); None when none is known."""
        raise NotImplementedError

    def partitions(self) -> list[dict[str, Any]]:
        """Every partition: topic, partition, replicas, isr, leader, min_isr, min_isr_source."""
        raise NotImplementedError

    def config(self, kind: str, name: str | int | None) -> tuple[dict[str, Any], str]:
        """The dynamic config of a topic (``kind`` "topic") or a broker ("broker"; ``name`` None: the cluster-wide
        default) and where it is kept, for messages; {} when there is none."""
        raise NotImplementedError

    def racks(self) -> dict[int, str | None]:
        """Each registered broker's ``broker.rack`` (None: it has none)."""
        raise NotImplementedError

    def voters(self) -> frozenset[int]:
        """The nodes that are KRaft voters (none on ZooKeeper): restarted after the brokers, one at a time."""
        return frozenset()

    def restart_refusal(self, node_id: int) -> str | None:
        """Why ``node_id`` may not be stopped now beyond the partition gates (KRaft: the quorum); None: it may."""
        return None

    # ---- min.insync.replicas, resolved as Kafka does
    def cluster_min_isr(self) -> tuple[int, str]:
        """The ``min.insync.replicas`` of a topic without an override, and where it comes from."""
        cfg, where = self.config("broker", CLUSTER_DEFAULT)
        if MIN_ISR in cfg:
            return min_isr_value(cfg[MIN_ISR], where), where
        if self.default_min_isr is not None:
            return self.default_min_isr, "the brokers' static default (inventory or parameter)"
        return KAFKA_DEFAULT_MIN_ISR, "Kafka's default"

    def topic_min_isr(self, topic: str) -> tuple[int, str] | None:
        """A topic's own ``min.insync.replicas`` override and where it is kept; None when it has none."""
        cfg, where = self.config("topic", topic)
        if MIN_ISR in cfg:
            return min_isr_value(cfg[MIN_ISR], where), where
        return None

    def broker_min_isr(self, broker_id: int, cluster_default: tuple[int, str]) -> tuple[int, str]:
        """A broker's ``min.insync.replicas`` for topics without an override: its own dynamic value, else
        ``cluster_default`` (``cluster_min_isr``)."""
        cfg, where = self.config("broker", broker_id)
        if MIN_ISR in cfg:
            return min_isr_value(cfg[MIN_ISR], where), where
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

    def partition(
        self,
        topic: str,
        partition: int,
        replicas: list[int],
        isr: list[int],
        leader: int,
        resolved: tuple[dict[str, tuple[int, str] | None], tuple[int, str], dict[int, tuple[int, str]]],
    ) -> dict[str, Any]:
        """One entry of ``partitions()``, its min ISR resolved; ``resolved``: (topic overrides read so far, the
        cluster default, brokers' values read so far), shared by one call of ``partitions()`` (``resolver``)."""
        topics, cluster_default, brokers = resolved
        if topic not in topics:
            topics[topic] = self.topic_min_isr(topic)
        min_isr, source = topics[topic] or self.replicas_min_isr(replicas, cluster_default, brokers)
        return {
            "topic": topic,
            "partition": partition,
            "replicas": replicas,
            "isr": isr,
            "leader": leader,
            "min_isr": min_isr,
            "min_isr_source": source,
        }

    def resolver(self) -> tuple[dict[str, tuple[int, str] | None], tuple[int, str], dict[int, tuple[int, str]]]:
        """What ``partition`` shares within one read of every partition."""
        return {}, self.cluster_min_isr(), {}

    # ---- the gates
    def problems(
        self,
        expected: set[int],
        tolerate: frozenset[int] = frozenset(),
        pending: frozenset[tuple[str, int, int]] = frozenset(),
        partitions: list[dict[str, Any]] | None = None,
    ) -> list[str]:
        """Brokers not up, under-replicated and offline partitions. Not counted: a replica missing from ISR when its
        broker is in ``tolerate`` (the broker about to be repaired: its restart is what brings it back; it may be
        down already, as in seed-000 where the broker refusing to start is the one to repair), or when it is in
        ``pending`` as (topic, partition, broker): a replica this plan repairs later (seed-004: every broker whose
        ``partition.metadata`` is wrong is out of ISR for that partition until its turn). ``partitions``:
        ``partitions()`` as the caller just read it (read here when None)."""
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
