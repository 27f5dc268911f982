"""The KRaft repair tests' lab (``tests/test_kraft_repair.py``, ``tests/test_kraft_fault_matrix.py``): the session's
shared KRaft snapshot (3 combined nodes) with three incidents replayed on each restore, all on voters:

- a ``-stray`` replica on node 2 (as Kafka 3.7+ renames a replica it finds stray) whose ``partition.metadata`` names
  a topic ID the metadata never held: proven stray;
- on node 2 too, the oldest segment of its orders-0 renamed ``*.deleted`` by retention and never deleted (the broker
  died within ``file.delete.delay.ms``): leftovers Kafka deletes at its next start, which the plan quarantines;
- seed-000's kill -9 of node 3: it stays down with its active segments' indexes untrimmed, once the quorum has
  fenced it and taken it out of every ISR (what the audit then sees, every time).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from fleet_lab import fleet as lab
from fleet_lab.incidents import inject
from fleet_lab.kafka_files import write_partition_metadata

VICTIM, STRAY_NODE = 3, 2
LEFTOVER_PARTITION = ("orders", 0)  # node 2's replica whose oldest segment is left as *.deleted
STRAY_TOPIC_ID = "U3RyYXlTdHJheVN0cmF5AA"  # a topic ID the lab's metadata never held (an older incarnation's)


def stray_dir(state: lab.LabState) -> Path:
    """Node 2's -stray replica: a copy of its orders-0 named as Kafka renames a stray replica (a fixed uid: the plan,
    made from the snapshot's audit, names it)."""
    return Path(state.broker(STRAY_NODE).log_dirs[0]) / f"orders-0.{'5' * 32}-stray"


def incidents(state: lab.LabState) -> None:
    """The stray replica planted on node 2 and its orders-0's oldest segment left as *.deleted, then seed-000's
    kill -9 of node 3, until the quorum has fenced it."""
    dst = stray_dir(state)
    shutil.copytree(dst.parent / "orders-0", dst)
    write_partition_metadata(dst, STRAY_TOPIC_ID)
    topic, partition = LEFTOVER_PARTITION
    inject(state, "segment-leftover", broker=STRAY_NODE, topic=topic, partition=partition)
    inject(state, "kill9-untrimmed-index", broker=VICTIM)
    deadline = time.monotonic() + 60
    while True:
        records = lab.read_metadata(state)
        fenced = any(r["kind"] == "broker" and r["broker_id"] == VICTIM and r["fenced"] for r in records)
        in_isr = [r for r in records if r["kind"] == "partition_state" and VICTIM in r["isr"] and len(r["isr"]) > 1]
        if fenced and not in_isr:
            return
        assert time.monotonic() < deadline, f"node {VICTIM} not fenced and out of ISR within 60 s"
        time.sleep(0.2)


def snapshot(shared: Any) -> Any:
    """The session's audited KRaft snapshot with ``incidents``."""
    return shared.snapshot(None, lab.DEFAULT_KRAFT_VERSION, incidents, metadata="kraft")
