"""The repair DAG on a KRaft cluster, end to end on the session's live Airflow (harness.shared): 3 combined KRaft nodes
of the lab (Kafka 3.7's metadata log, the lab's quorum, a real sshd per node), no ZooKeeper anywhere.

Three incidents, one plan:

- seed-000 on KRaft: node 3 killed with kill -9 leaves its active segments' indexes preallocated (untrimmed) and no
  clean-shutdown marker;
- a ``-stray`` replica on node 2 (KRaft 3.7+ renames a replica it finds stray and keeps it: KAFKA-15605 leaves it to
  the operator) whose ``partition.metadata`` names a topic ID the metadata does not hold: proven stray;
- on node 2 too, its orders-0's oldest segment left as ``*.deleted`` (retention's asynchronous delete never ran).

The approved plan quarantines exactly those: the indexes and the leftovers in their partition dir (the leftovers never
copied into a backup), the stray replica whole, beside its log dir. The repair takes its lock in the shared repairs dir
(keyed by the cluster.id the voters were formatted with), passes the partition gates read from the quorum's committed
metadata and the quorum gate before each node (both are voters: the others must be caught up, so node 2 waits until node
3 is back), starts each node, waits until it is unfenced and back in every ISR, post-verifies it through detection, and
releases the lock. Node 1 has nothing to repair and is never restarted.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor import lock_state
from fleet_lab import fleet as lab
from harness.kraft_repair import LEFTOVER_PARTITION, STRAY_NODE, STRAY_TOPIC_ID, VICTIM, snapshot, stray_dir
from harness.live_stack import FAST, PURGE, REPAIR, attempt_of, events, plan_dir
from harness.shared import live

pytestmark = pytest.mark.timeout(2400)


@pytest.fixture
def fleet(shared: Any) -> dict[str, Any]:
    return live(shared, snapshot(shared))


def digests(paths: list[str]) -> dict[str, str]:
    return {p: hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths}


def test_seed_000_and_a_stray_replica_on_kraft_are_quarantined_through_the_approval(fleet: dict[str, Any]) -> None:
    state: lab.LabState = fleet["state"]
    af = fleet["af"]
    assert state.kraft and lab.running_pid(state.broker(VICTIM).config()) is None
    stray = stray_dir(state)
    stray_files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in stray.iterdir() if p.is_file()}
    t0 = time.time()
    run = af.trigger(REPAIR, FAST)
    request = af.wait_for_approval(REPAIR, run, "approve")
    pdir = plan_dir(fleet["data"], request)
    plan = json.loads((pdir / "plan.json").read_text())
    assert [b["broker_id"] for b in plan["brokers"] if b["restart"]] == [VICTIM, STRAY_NODE]  # the one down first
    by_node = {b["broker_id"]: b["actions"] for b in plan["brokers"]}
    (moved,) = [a for a in by_node[STRAY_NODE] if a["rule"] == "stray-dir"]
    assert (moved["action"], moved["path"]) == ("quarantine", str(stray))
    leftover_dir = Path(state.broker(STRAY_NODE).log_dirs[0]) / "{}-{}".format(*LEFTOVER_PARTITION)
    leftovers = sorted(a["path"] for a in by_node[STRAY_NODE] if a["rule"] == "segment-leftover")
    assert leftovers == sorted(str(p) for p in leftover_dir.glob("*.deleted")) and len(leftovers) >= 2, leftovers
    assert all(a["action"] == "quarantine" for a in by_node[STRAY_NODE]) and len(by_node[STRAY_NODE]) == 1 + len(
        leftovers
    )
    assert f"its topic ID {STRAY_TOPIC_ID} is not in the metadata image" in moved["reason"]
    actions = by_node[VICTIM]
    assert actions and all(a["action"] == "quarantine" and a["rule"] == "index-untrimmed" for a in actions), actions
    assert plan["zookeeper"] == []  # no ZooKeeper write is ever planned on KRaft
    assert str(stray) in request["body"]  # the approver reads what moves where
    quarantined = [a["path"] for a in actions]
    original = digests(quarantined)
    leftover_digests = digests(leftovers)

    af.approve(REPAIR, run, "approve")
    assert af.wait_run(REPAIR, run) == "success", af.task_states(REPAIR, run)
    adir = attempt_of(fleet["data"], request, run)
    result = json.loads((adir / "result.json").read_text())
    assert result["status"] == "done" and result["done"] == [VICTIM, STRAY_NODE] and result["reverified_with"], result
    assert result["lock"] == state.cluster_id and result["lock_released"] is True, result
    journal = json.loads((adir / "journal.json").read_text())
    steps = {s["state"]: s["detail"] for s in journal["brokers"][str(VICTIM)]["history"]}
    assert "the quorum keeps a caught-up majority without this voter" in steps["prechecked"], steps
    assert "unfenced registration in the metadata removed" in steps["stopped"], steps
    assert "post-verify" in steps["verified"], steps  # a fresh probe and detection against the KRaft metadata
    # the lock lived in the repairs dir, keyed by the cluster.id; it is free again and the fleet page says so
    locks = _settings(fleet).lock_dir
    assert (locks / f"{state.cluster_id}.token").is_file() and not (locks / f"{state.cluster_id}.json").exists()
    mirror = lock_state.read(_settings(fleet).store)
    assert mirror is not None and not mirror.held and mirror.seen_by == "repair"

    # quarantined, never deleted; the node started, rebuilt its indexes, and is unfenced and in every ISR again
    for path, digest in original.items():
        pdir_, name = path.rsplit("/", 1)
        copies = [hashlib.sha256(k.read_bytes()).hexdigest() for k in Path(pdir_).glob(f"*/*/{name}*")]
        assert digest in copies, path
        assert Path(path).exists(), path  # rebuilt at the start (an active segment's, preallocated again: running)
    lab.wait_healthy(state, timeout=60)
    starts = {b: [e["ts"] for e in es if e["event"] == "running" and e["ts"] > t0] for b, es in events(state).items()}
    assert len(starts[VICTIM]) == 1 and len(starts[STRAY_NODE]) == 1 and starts[1] == []  # only the planned nodes
    assert starts[VICTIM] < starts[STRAY_NODE]
    # the stray replica: out of the log dir, whole, beside it on its filesystem; the node's start did not bring it back
    (kept,) = (stray.parent.parent / "fleet-doctor-stray-quarantine" / stray.parent.name).glob(f"*/{stray.name}")
    assert not stray.exists() and kept.is_dir()
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in kept.iterdir() if p.is_file()} == stray_files
    # the leftovers: in their partition dir's quarantine, byte for byte, never in a backup tarball; not back in place
    kept_leftovers = [leftover_dir / "fleet-doctor-quarantine" / pdir.name[:16] / Path(p).name for p in leftovers]
    assert digests([str(k) for k in kept_leftovers]) == {
        str(k): leftover_digests[p] for k, p in zip(kept_leftovers, leftovers, strict=True)
    }
    assert not any(Path(p).exists() for p in leftovers)
    for tarball in adir.glob("broker-*/backup-*.tar.gz"):
        assert not any(name.endswith(".deleted") for name in tarfile.open(tarball).getnames()), tarball

    # the quarantine deleted: a plan of its own, approved, naming what is freed and how old it is
    quarantine = [Path(p).parent / "fleet-doctor-quarantine" / pdir.name[:16] / Path(p).name for p in quarantined]
    quarantine += kept_leftovers
    freed = sum(q.stat().st_size for q in quarantine) + sum(p.stat().st_size for p in kept.rglob("*") if p.is_file())
    purge_run = af.trigger(PURGE, {"plan": pdir.name[:16], "older_than_days": 0})
    asked = af.wait_for_approval(PURGE, purge_run, "approve")
    assert f"delete {len(quarantine) + 1} quarantined entr(ies)" in asked["subject"], asked["subject"]
    assert f"({freed} bytes)" in asked["body"] and "Undo: none" in asked["body"] and str(kept) in asked["body"]
    af.approve(PURGE, purge_run, "approve")
    assert af.wait_run(PURGE, purge_run) == "success", af.task_states(PURGE, purge_run)
    assert not kept.exists() and not any(q.exists() for q in quarantine)
    assert all(Path(p).exists() for p in quarantined)  # the rebuilt indexes, Kafka's own: untouched
    (result_file,) = (pdir / "purges").glob("*/result-*.json")
    purged = json.loads(result_file.read_text())
    assert purged["freed_bytes"] == freed and purged["lock_released"] is True, purged


def _settings(fleet: dict[str, Any]) -> Any:
    """The settings the live Airflow's tasks of the lab cluster have (its data root, no FLEET_DOCTOR_REPAIR_DIR)."""
    from fleet_doctor.settings import Settings

    state: lab.LabState = fleet["state"]
    return Settings(inventory=state.inventory_path, data_root=fleet["data"], cluster=state.cluster)
