"""Repair plan and executor on the fleet lab (real sshd, ZooKeeper, lab brokers, Spark detection), without Airflow.

seed-004 -> audit -> plan -> execute: every broker back in ISR, partition.metadata everywhere equal to ZooKeeper's
topic ID, the controller restarted last (from the lab's own events.jsonl), backups verified."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor.layout import RepairsDir
from fleet_doctor.probe import parse_partition_metadata
from fleet_doctor.repair import approval_text
from fleet_doctor.repair.broker import ssh_hosts
from fleet_doctor.repair.errors import RepairError
from fleet_doctor.repair.executor import Executor
from fleet_doctor.repair.planner import restart_preview
from fleet_doctor.zookeeper.cluster import Cluster
from fleet_doctor.zookeeper.lock import LockHeld, acquire_lock, release_lock
from fleet_lab import fleet
from harness.repair_lab import FAST, plan_of
from harness.shared import audited
from harness.ssh import ssh_connect

pytestmark = pytest.mark.timeout(900)


@pytest.fixture
def seed004(shared: Any, tmp_path: Path) -> dict[str, Any]:
    """The session's audited seed-004 lab, restored for each test: whatever another test did, each starts from it."""
    return audited(shared, shared.snapshot("seed-004"), tmp_path)


def _plan(ctx: dict[str, Any]) -> Any:
    return plan_of(ctx)


def test_partition_metadata_left_alone_without_approval(seed004: dict[str, Any]) -> None:
    """Building a plan changes nothing on the brokers (the files are only touched by an executor)."""
    state: fleet.LabState = seed004["state"]
    before = fleet.partition_topic_ids(state)
    plan = _plan(seed004)
    assert plan.counts()["files_removed"] > 0
    assert fleet.partition_topic_ids(state) == before
    for b in state.brokers:
        md = Path(b.log_dirs[0]) / "seed-004-0" / "partition.metadata"
        if md.exists():
            parse_partition_metadata(md.read_bytes(), str(md))


def test_precheck_refuses_to_drop_a_partition_below_min_isr(seed004: dict[str, Any]) -> None:
    state: fleet.LabState = seed004["state"]
    plan = _plan(seed004)
    zk = state.zk_client()
    try:
        # min.insync.replicas 3 on the topic: stopping any replica takes it below
        zk.set("/config/topics/seed-004", json.dumps({"version": 1, "config": {"min.insync.replicas": "3"}}).encode())
        repaired_first = plan.restart_order[0]
        workdir = seed004["tmp"] / "repairs-refused"
        ex = Executor(
            plan,
            RepairsDir(workdir).attempt(plan.hash, "manual"),
            seed004["inv"],
            ssh_hosts(seed004["inv"], ssh_connect(seed004["inv"])),
            Cluster(zk),
            FAST,
        )
        # broker 1 is out of ISR for 0-2 (stopping it removes no ISR member there), but it is in ISR of 3-5
        with pytest.raises(RepairError, match="min ISR"):
            ex.run()
        assert ex.journal.data["status"] == "halted"
        assert ex.journal.state(repaired_first).value == "failed"
        assert all(c["command"].endswith("status") or "stop" not in c["command"] for c in ex.journal.data["commands"])
        assert fleet.running_pid(state.broker(repaired_first).config()) is not None  # never stopped
    finally:
        zk.set("/config/topics/seed-004", json.dumps({"version": 1, "config": {}}).encode())
        zk.stop()


def test_a_dropped_ssh_session_halts_the_chain_and_is_journaled(seed004: dict[str, Any]) -> None:
    """paramiko's errors are not OSErrors (a closed client even raises AttributeError): a session that is gone when
    the stop runs must still mark the broker failed, halt the chain, log the command with exit status -1, leave the
    broker running, and keep the lock (the stop may have reached it)."""
    state: fleet.LabState = seed004["state"]
    plan = _plan(seed004)
    zk = state.zk_client()
    connect = ssh_connect(seed004["inv"])

    dropped_once: set[int] = set()

    def dropped(broker_id: int) -> Any:
        client = connect(broker_id)
        if broker_id not in dropped_once:  # the first session drops after the pre-check; later ones work
            dropped_once.add(broker_id)
            real = client.exec_command
            calls = {"n": 0}

            def exec_command(command: str, *a: Any, **k: Any) -> Any:
                calls["n"] += 1
                if "stop" in command.split()[-1:]:
                    client.close()  # the session is gone when the stop runs
                return real(command, *a, **k)

            client.exec_command = exec_command
        return client

    try:
        ex = Executor(
            plan,
            RepairsDir(seed004["tmp"] / "repairs-dropped").attempt(plan.hash, "manual"),
            seed004["inv"],
            ssh_hosts(seed004["inv"], dropped),
            Cluster(zk),
            FAST,
        )
        with pytest.raises(RepairError, match="could not run"):
            ex.run()
        first = plan.restart_order[0]
        assert ex.journal.data["status"] == "halted" and "could not run" in ex.journal.data["error"]
        assert ex.journal.state(first).value == "failed" and ex.journal.completed(first).value == "prechecked"
        (logged,) = [c for c in ex.journal.data["commands"] if c["exit_status"] == -1]
        assert logged["broker_id"] == first and logged["command"].endswith("stop")
        # a new session finds it running and registered; whether the stop reached it the executor cannot tell (a
        # session that breaks mid-command looks the same): not counted as up, not started, the lock kept for a human
        assert ex.journal.data["brokers"][str(first)]["after_failure"].startswith("may be left stopping")
        assert "its stop command failed" in ex.journal.data["brokers"][str(first)]["after_failure"]
        assert ex.journal.keeps_lock()
        assert logged["stderr"].split(":")[0].endswith(("Error", "Exception"))  # what paramiko raised, named
        assert fleet.running_pid(state.broker(first).config()) is not None  # never stopped
    finally:
        zk.stop()


def test_seed_004_repair_end_to_end(seed004: dict[str, Any]) -> None:
    state: fleet.LabState = seed004["state"]
    plan = _plan(seed004)
    zk = state.zk_client()
    try:
        controller = json.loads(zk.get("/controller")[0])["brokerid"]
        zk_id = json.loads(zk.get("/brokers/topics/seed-004")[0])["topic_id"]
        assert plan.restart_order[-1] == controller and sorted(plan.restart_order) == [1, 2, 3]
        assert plan.restart_order[0] == 1  # the broker already out of ISR goes first
        md = approval_text.repair_markdown(plan)
        assert plan.hash[:12] in md and "partition.metadata" in md and "est. recovery" in md
        again = _plan(seed004)
        assert again.hash == plan.hash  # content-addressed: same inputs, same hash
        removed = [a.path for b in plan.brokers for a in b.actions if a.action == "remove"]
        assert removed and all("seed-004-" in p for p in removed)
        assert not any("__consumer_offsets" in p for p in removed)  # internal topics excluded
        ex = Executor(
            plan,
            RepairsDir(seed004["tmp"] / "repairs").attempt(plan.hash, "manual"),
            seed004["inv"],
            ssh_hosts(seed004["inv"], ssh_connect(seed004["inv"])),
            Cluster(zk),
            FAST,
        )
        result = ex.run()
        assert result["status"] == "done"
        assert all(b["state"] == "done" for b in result["brokers"].values())
        status_cmds = {seed004["inv"].broker(b).service_command("status") for b in (1, 2, 3)}
        assert all(c["exit_status"] == 0 for c in result["commands"] if c["command"] not in status_cmds)
        assert {c["broker_id"] for c in result["commands"]} == {1, 2, 3}  # every command logged per broker
        fleet.wait_healthy(state, timeout=30)
        # partition.metadata everywhere equal to ZooKeeper's topic ID
        for (bid, topic, _p), tid in fleet.partition_topic_ids(state).items():
            if topic == "seed-004":
                assert tid == zk_id, (bid, topic, _p, tid)
        # the controller restarted last, per the lab's own record
        starts = {}
        for b in state.brokers:
            events = [json.loads(x) for x in (Path(b.run_dir) / "events.jsonl").read_text().splitlines()]
            starts[b.id] = max(e["ts"] for e in events if e["event"] == "running")
        assert max(starts, key=starts.get) == controller
        # backups present and verified: the tarball holds exactly the planned files, sha256 as recorded
        for b in plan.brokers:
            d = RepairsDir(seed004["tmp"] / "repairs").attempt(plan.hash, "manual") / f"broker-{b.broker_id}"
            with tarfile.open(d / "backup-1.tar.gz") as tar:
                names = sorted("/" + n.lstrip("/") for n in tar.getnames())
            assert names == sorted(b.backup_paths)
            manifest = (d / "manifest-1.sha256").read_text().splitlines()
            assert len(manifest) == len(b.backup_paths)
    finally:
        zk.stop()


def test_journal_keeps_the_last_completed_step_through_a_failure(tmp_path: Path) -> None:
    """A failed step is reported, but a rerun resumes after the last step that did finish (no step repeated,
    none skipped)."""
    from fleet_doctor.repair.journal import Journal, State
    from fleet_doctor.repair.plan import BrokerPlan, FileAction, Plan

    action = FileAction("remove", "/d/t-0/partition.metadata", "topic-id-mismatch", "t", 0, "why")
    plan = Plan("c1", "run1", {}, [BrokerPlan(1, False, True, [action])], [], [])
    j = Journal(tmp_path / "journal.json", plan)
    j.advance(1, State.PRECHECKED)
    j.advance(1, State.STOPPED)
    j.advance(1, State.FAILED, "backup: sha256sum exited 1")
    assert j.state(1) == State.FAILED and j.completed(1) == State.STOPPED
    again = Journal(tmp_path / "journal.json", plan)  # a rerun reads the same journal
    assert again.state(1) == State.FAILED and again.completed(1) == State.STOPPED
    again.advance(1, State.BACKED_UP)
    assert again.state(1) == State.BACKED_UP
    other = Plan("c1", "run1", {}, [BrokerPlan(2, False, True, [action])], [], [])
    with pytest.raises(RepairError, match="belongs to plan"):
        Journal(tmp_path / "journal.json", other)


def test_lock_blocks_other_plans_and_a_live_second_worker_but_not_a_resume(seed004: dict[str, Any]) -> None:
    """The persistent lock keeps other plans out until released; the same plan may resume only once the
    previous worker's ZooKeeper session is gone (its ephemeral liveness node with it)."""
    state: fleet.LabState = seed004["state"]
    first, second = state.zk_client(), state.zk_client()
    owner = {"plan_hash": "a" * 64, "step": "brokers"}
    try:
        acquire_lock(first, "locktest", owner)
        with pytest.raises(LockHeld, match="locked by another repair"):
            acquire_lock(second, "locktest", {"plan_hash": "b" * 64, "step": "brokers"})
        with pytest.raises(LockHeld, match="another worker is executing"):
            acquire_lock(second, "locktest", owner, live_wait_s=1)  # the first worker is alive
        first.stop()  # the first worker dies: its session, and the liveness node, go
        first.close()
        acquire_lock(second, "locktest", owner, live_wait_s=30)  # a resume
        release_lock(second, "locktest", owner)
        assert second.exists("/fleet-doctor/repair-lock/locktest") is None
        assert second.exists("/fleet-doctor/repair-active/locktest") is None
    finally:
        second.stop()
        second.close()


def test_restart_preview_distrusts_a_marker_next_to_untrimmed_indexes() -> None:
    """seed-000: a clean stop trims every index, so a stopped broker with the marker and a preallocated index was
    killed while loading; its preview says so. A running broker's preallocated active indexes are normal."""
    seg = {
        "kind": "segment",
        "path": "/d/t-0",
        "base_offset": 0,
        "log_bytes": 100,
        "has_log": True,
        "has_index": True,
        "index_zero_tail_entries": 1310000,
    }
    part = {"kind": "partition", "path": "/d/t-0", "recovery_point": 0}
    stopped = [{"kind": "logdir", "clean_shutdown": True, "lock_held_by_pid": None}, part, seg]
    running = [{"kind": "logdir", "clean_shutdown": False, "lock_held_by_pid": 42}, part, seg]
    trimmed = [stopped[0], part, {**seg, "index_zero_tail_entries": 0}]
    assert restart_preview(stopped, set()).untrimmed_indexes_with_marker == 1
    assert restart_preview(running, set()).untrimmed_indexes_with_marker == 0
    assert restart_preview(trimmed, set()).untrimmed_indexes_with_marker == 0
    assert restart_preview(trimmed, set()).last_stop_clean is True
