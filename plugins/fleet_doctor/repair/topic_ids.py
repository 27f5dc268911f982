"""The preventive repair of ``topic-id-missing-in-zk``: a topic znode that lost its ``topic_id`` gets back the ID every
replica's ``partition.metadata`` agrees on, before a controller failover mints a new one (kafka-reference.md §5,
§6, KAFKA-14190). Its own approval in the repair DAG; no broker restarts."""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Callable, Iterable
from typing import Any

from fleet_doctor.probe import PARTITION_METADATA, parse_partition_metadata
from fleet_doctor.remote import Remote
from fleet_doctor.repair.errors import RepairError
from fleet_doctor.repair.plan import ZkAction
from fleet_doctor.zookeeper.cluster import Cluster, topic_path

LOG = logging.getLogger(__name__)


def replica_topic_ids(
    connect: Callable[[int], Any], inventory: Any, topic: str, assignment: dict[str, list[int]]
) -> dict[str, str | None]:
    """``partition.metadata`` topic ID of every assigned replica of ``topic``, read over SSH from the brokers
    (``<broker>:<partition>`` -> ID, None when the file is missing or unreadable)."""
    out: dict[str, str | None] = {}
    by_broker: dict[int, list[str]] = {}
    for p, replicas in assignment.items():
        for bid in replicas:
            by_broker.setdefault(int(bid), []).append(p)
    for bid, parts in sorted(by_broker.items()):
        files = [f"{d}/{topic}-{p}/{PARTITION_METADATA}" for p in parts for d in inventory.broker(bid).log_dirs]
        # each file present as NUL, its path, NUL, its bytes: paths and contents cannot be confused
        script = (
            "for f in "
            + " ".join(shlex.quote(f) for f in files)
            + '; do [ -f "$f" ] && printf \'\\0%s\\0\' "$f" && cat -- "$f"; done; true'
        )
        remote = Remote(connect(bid), bid)
        try:
            raw = remote.run(script, timeout=60).stdout.encode("utf-8", errors="surrogateescape")
        finally:
            remote.close()
        found: dict[str, str | None] = {}
        chunks = raw.split(b"\0")[1:]
        for name, body in zip(chunks[0::2], chunks[1::2], strict=False):
            path = name.decode(errors="replace")
            try:
                found[path.rsplit("/", 2)[-2]] = parse_partition_metadata(body, path)["topic_id"]
            except ValueError:
                found[path.rsplit("/", 2)[-2]] = None
        for p in parts:
            out[f"{bid}:{p}"] = found.get(f"{topic}-{p}")
    return out


def restore_topic_ids(
    cluster: Cluster,
    actions: Iterable[ZkAction],
    connect: Callable[[int], Any],
    inventory: Any,
    dry_run: bool = False,
    done: list[str] | None = None,
) -> list[str]:
    """Write each action's topic ID back. Re-checked right before the write (the znode still lacks it, every replica
    still holds it) and written with a version-checked ``set``: a concurrent change (a controller minting, an admin
    tool) makes it stop, not overwrite. ``done``: the list each outcome is appended to as it happens (the caller
    records it even when a later topic fails)."""
    from kazoo.exceptions import BadVersionError

    done = [] if done is None else done
    for a in actions:
        path = topic_path(a.topic)
        znode, version = cluster.topic_znode(a.topic)
        if znode.get("topic_id") == a.topic_id:
            done.append(f"{a.topic}: already {a.topic_id}")
            continue
        if znode.get("topic_id"):
            raise RepairError(f"{path} now holds topic_id {znode['topic_id']}, not the planned {a.topic_id}: stale")
        # replicas without partition.metadata (partitions added since the ID was lost) take the ID from ZooKeeper
        # once it is back; a replica holding another ID would be made inconsistent: stop
        ids = replica_topic_ids(connect, inventory, a.topic, znode["partitions"])
        disagree = {k: v for k, v in ids.items() if v is not None and v != a.topic_id}
        if disagree or a.topic_id not in ids.values():
            raise RepairError(f"{a.topic}: replicas no longer agree on {a.topic_id}: {disagree or ids}")
        znode.update(topic_id=a.topic_id, version=max(3, int(znode.get("version", 1))))
        znode.setdefault("adding_replicas", {})
        znode.setdefault("removing_replicas", {})
        if dry_run:
            LOG.info("dry run: would set %s (zkVersion %d) to %s", path, version, json.dumps(znode))
            done.append(f"{a.topic}: would write {a.topic_id}")
            continue
        try:
            cluster.write_topic_znode(a.topic, znode, version)
        except BadVersionError:
            raise RepairError(f"{path} changed while its topic ID was restored: nothing written") from None
        LOG.info("wrote topic_id %s into %s (was zkVersion %d)", a.topic_id, path, version)
        holding = sum(v == a.topic_id for v in ids.values())
        done.append(f"{a.topic}: wrote {a.topic_id} ({holding} of {len(ids)} replicas hold it, none another)")
    return done
