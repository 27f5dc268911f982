"""Issue 15's checks at the moment of action, fresh backups, attempts per run, the lock after a halt, and the restore
(planned, gated, validated), on one seed-004 lab (real sshd, ZooKeeper 3.8, lab brokers, Spark detection), driving
the executor without Airflow. Faults are injected by overriding one step of the real executor (the rest runs as is).

Tests run in file order on the one lab:
1. someone restarts the broker between its backup and its change: the change refuses, nothing changed, the broker
   is left running, and the journal says why; Kafka then rewrote a planned file, so the resumed run backs it up again
   before removing it (a stale backup is never trusted);
2. a resume whose journal says "prechecked" runs the pre-check again before the stop (min ISR now broken: refused);
3. a failure after the stop, before any change: the broker is started again, and the lock is released;
4. a failure after the change (quarantine included, partition dirs owned by another user): the broker stays as it
   is and the lock stays held; the quarantine dirs are owned as the partition dir;
5. the restore: a hostile ``plan`` and a tampered backup are refused, start=false for two brokers is refused; the
   restore plan of attempt 4 puts every file back (equal to the manifest, owned as its partition dir), gated, the
   controller last, and marks the repair attempt's broker pending again.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor import layout, lock_state
from fleet_doctor.audit import steps
from fleet_doctor.layout import RepairsDir
from fleet_doctor.lock_state import LockState
from fleet_doctor.repair import approval_text, restore_tasks, tasks
from fleet_doctor.repair.broker import BrokerHost, ssh_hosts
from fleet_doctor.repair.errors import RepairError
from fleet_doctor.repair.executor import Executor
from fleet_doctor.repair.gates import approved_gates
from fleet_doctor.repair.journal import Journal, State
from fleet_doctor.repair.plan import BrokerPlan, FileAction, Plan, controller_last
from fleet_doctor.repair.session import ZooKeeperLock, holding
from fleet_doctor.zookeeper.cluster import Cluster
from fleet_doctor.zookeeper.lock import LockHeld, acquire_lock, lock_holder, release_active, release_lock
from fleet_lab import fleet
from fleet_lab.fleet import run_service
from harness.repair_lab import FAST, plan_of
from harness.shared import audited
from harness.ssh import ssh_connect

pytestmark = pytest.mark.timeout(1200)
TOPIC = "seed-004"
OTHER_UID = 65534  # the partition dirs' owner in test 4: not the SSH user (root here)


@pytest.fixture
def lab(shared: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The session's audited seed-004 lab, restored for each test, with a ZooKeeper session of its own."""
    ctx = audited(shared, shared.snapshot("seed-004"), tmp_path)
    ctx["zk"] = ctx["state"].zk_client()
    try:
        yield ctx
    finally:
        ctx["zk"].stop()


def sha(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def running(state: fleet.LabState, bid: int) -> bool:
    return fleet.running_pid(state.broker(bid).config()) is not None


def one_broker(ctx: dict[str, Any], bid: int) -> Plan:
    """The plan restricted to one broker (its own restart only)."""
    p = plan_of(ctx, brokers=[bid])
    assert p.restart_order == [bid] and p.brokers[0].actions
    return p


def executor(ctx: dict[str, Any], plan: Plan, attempt: str, cls: type[Executor] = Executor) -> Executor:
    s, inv = ctx["settings"], ctx["inv"]
    tasks.save_plan(s, plan)
    where = RepairsDir(s.repairs).attempt(plan.hash, attempt)
    return cls(plan, where, inv, ssh_hosts(inv, ssh_connect(inv)), Cluster(ctx["zk"]), FAST)


def test_a_broker_restarted_before_the_change_is_left_alone_and_a_stale_backup_is_taken_again(
    lab: dict[str, Any],
) -> None:
    state: fleet.LabState = lab["state"]
    first = plan_of(lab).restart_order[0]
    plan = one_broker(lab, first)
    paths = plan.brokers[0].backup_paths
    before = {p: sha(p) for p in paths}

    class RestartedBySomeoneElse(Executor):
        def backup(self, b: BrokerPlan, host: BrokerHost) -> str:
            out = super().backup(b, host)
            assert run_service(state.broker(b.broker_id), "start").returncode == 0  # a supervisor, say
            return out

    ex = executor(lab, plan, "restarted", RestartedBySomeoneElse)
    with pytest.raises(RepairError, match="started by someone else"):
        ex.run()
    j = ex.journal
    assert j.completed(first) == State.BACKED_UP and "started by someone else" in j.broker(first)["failed"]
    assert not j.changing(first) and j.broker(first)["after_failure"].startswith("running")
    assert {p: sha(p) for p in paths} == before and running(state, first)
    assert not j.changed_any()

    # while it ran, Kafka rewrote a planned file: the backup taken before no longer holds it as it is
    epoch = next(p for p in paths if p.endswith("leader-epoch-checkpoint"))
    Path(epoch).write_bytes(b"0\n1\n0 0\n" if Path(epoch).read_bytes() != b"0\n1\n0 0\n" else b"0\n0\n")
    rewritten = Path(epoch).read_bytes()
    done = executor(lab, plan, "restarted").run()  # the same run again: resumes its attempt
    assert done["status"] == "done"
    backups = done["brokers"][str(first)]["backups"]
    assert [b["n"] for b in backups] == [1, 2]
    tmp_dir = lab["inv"].broker(first).tmp_dir
    for bk in backups:  # made in a private dir with an unpredictable name (mktemp -d: 0700), never a fixed tmp name
        assert re.fullmatch(rf"{re.escape(tmp_dir)}/fleet-doctor\.[A-Za-z0-9]{{10}}", bk["remote_dir"]), bk[
            "remote_dir"
        ]
        assert os.stat(bk["remote_dir"]).st_mode & 0o777 == 0o700
    assert backups[1]["files"][epoch] != backups[0]["files"][epoch]  # backed up again as it was when removed
    d = RepairsDir(lab["settings"].repairs).attempt(plan.hash, "restarted")
    with tarfile.open(d / backups[1]["tarball"]) as tar:
        member = tar.extractfile(epoch.lstrip("/"))
        assert member is not None and hashlib.sha256(member.read()).hexdigest() == backups[1]["files"][epoch]
    assert rewritten != b""
    zk_id = json.loads(lab["zk"].get(f"/brokers/topics/{TOPIC}")[0])["topic_id"]
    ids = {k: v for k, v in fleet.partition_topic_ids(state).items() if k[0] == first and k[1] == TOPIC}
    assert ids and set(ids.values()) == {zk_id}  # repaired: the broker wrote ZooKeeper's topic ID again


def test_a_partition_dir_swapped_for_a_symlink_between_plan_and_change_is_refused(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    """Issue 28 item 1, with the real executor over SSH as root: after the backup, the Kafka user swaps a planned
    partition dir for a link to a dir outside the log dir holding the same files (so every checksum still matches).
    The change is refused naming the path, and nothing outside the log dir changes (owner, mode, mtime, content)."""
    state: fleet.LabState = lab["state"]
    first = plan_of(lab).restart_order[0]
    plan = one_broker(lab, first)
    pdir = Path(plan.brokers[0].actions[0].path).parent
    outside = tmp_path / "outside"

    def fingerprint() -> dict[str, tuple[int, int, int, int, bytes]]:
        return {
            p.name: (p.lstat().st_uid, p.lstat().st_gid, p.lstat().st_mode, p.lstat().st_mtime_ns, p.read_bytes())
            for p in sorted(outside.iterdir())
        }

    seen: dict[str, Any] = {}

    class Swapped(Executor):
        def backup(self, b: BrokerPlan, host: BrokerHost) -> str:
            out = super().backup(b, host)
            outside.mkdir()
            for f in pdir.iterdir():
                if f.is_file():
                    (outside / f.name).write_bytes(f.read_bytes())
            os.utime(outside, (1_000_000_000, 1_000_000_000))
            seen["before"] = fingerprint()
            seen["dir"] = outside.lstat()
            pdir.rename(real)
            pdir.symlink_to(outside)
            return out

    real = pdir.with_name(pdir.name + ".real")
    ex = executor(lab, plan, "swapped", Swapped)
    try:
        with pytest.raises(RepairError, match=rf"refused: {re.escape(str(pdir))} is a symlink or not a directory"):
            ex.run()
        assert fingerprint() == seen["before"]  # every file outside as it was: none removed, none re-owned
        after = outside.lstat()
        assert (after.st_uid, after.st_mode, after.st_mtime_ns) == (
            seen["dir"].st_uid,
            seen["dir"].st_mode,
            seen["dir"].st_mtime_ns,
        )
        assert {p.name for p in real.iterdir()} >= {
            Path(a.path).name for a in plan.brokers[0].actions if Path(a.path).parent == pdir
        }
        assert ex.journal.broker(first)["failed"] and ex.journal.keeps_lock()  # a human looks: the lock stays
    finally:
        if pdir.is_symlink():
            pdir.unlink()
            real.rename(pdir)
        run_service(state.broker(first), "start")


def test_a_resume_runs_the_precheck_again_before_the_stop(lab: dict[str, Any]) -> None:
    state: fleet.LabState = lab["state"]
    order = plan_of(lab).restart_order
    second = order[0]
    plan = one_broker(lab, second)
    zk = lab["zk"]
    ex = executor(lab, plan, "precheck-resume")
    ex.journal.advance(second, State.PRECHECKED, "hours ago")  # a worker died right after its pre-check
    zk.set(f"/config/topics/{TOPIC}", json.dumps({"version": 1, "config": {"min.insync.replicas": "3"}}).encode())
    try:
        with pytest.raises(RepairError, match="min ISR"):
            executor(lab, plan, "precheck-resume").run()
        assert running(state, second)  # never stopped
    finally:
        zk.set(f"/config/topics/{TOPIC}", json.dumps({"version": 1, "config": {}}).encode())


def test_a_failure_after_the_stop_before_any_change_starts_the_broker_again(lab: dict[str, Any]) -> None:
    state: fleet.LabState = lab["state"]
    bid = plan_of(lab).restart_order[0]
    plan = one_broker(lab, bid)
    before = {p: sha(p) for p in plan.brokers[0].backup_paths}

    class DiskFull(Executor):
        def backup(self, b: BrokerPlan, host: BrokerHost) -> str:
            raise OSError(28, "No space left on device")

    ex = executor(lab, plan, "disk-full", DiskFull)
    owner = {"plan_hash": plan.hash, "step": "brokers", "run_id": "disk-full"}
    report: dict[str, Any] = {}
    with pytest.raises(RepairError, match="No space left"), holding(lab["zk"], lab["inv"], owner, report) as lock:
        lock.keep_when(ex.journal.keeps_lock)
        ex.run()
    b = ex.journal.broker(bid)
    assert ex.journal.completed(bid) == State.STOPPED and "OSError" in b["failed"]
    assert b["after_failure"].startswith("started again") and running(state, bid)
    assert bid in Cluster(lab["zk"]).registered()
    assert {p: sha(p) for p in plan.brokers[0].backup_paths} == before
    assert report["lock_released"] and lock_holder(lab["zk"], lab["state"].cluster_id) is None


@pytest.fixture
def halted(lab: dict[str, Any]) -> dict[str, Any]:
    """Attempt "halted": broker `bid` (partition dirs owned by another user) gets its seed-004 files removed and an
    index quarantined, then its start fails: it is left stopped and changed, the lock held."""
    bid = plan_of(lab).restart_order[0]
    base = one_broker(lab, bid).brokers[0]
    pdir = Path(base.actions[0].path).parent
    index = sorted(pdir.glob("*.index"))[0]
    quarantine = FileAction("quarantine", str(index), "index-untrimmed", TOPIC, base.actions[0].partition, "test")
    plan = Plan(
        lab["inv"].cluster,
        "run1",
        {"test": "halted"},
        [BrokerPlan(bid, False, True, [*base.actions, quarantine])],
        [],
        [],
    )
    for d in {Path(a.path).parent for a in plan.brokers[0].actions}:
        os.chown(d, OTHER_UID, OTHER_UID)
    originals = {a.path: Path(a.path).read_bytes() for a in plan.brokers[0].actions}

    class StartFails(Executor):
        def start(self, b: BrokerPlan, host: BrokerHost) -> str:
            raise RuntimeError("the broker did not come back")

    ex = executor(lab, plan, "halted", StartFails)
    owner = {"plan_hash": plan.hash, "step": "brokers", "run_id": "halted"}
    report: dict[str, Any] = {}
    mirror = lab["settings"].store  # the fleet page's view of the lock
    with (
        pytest.raises(RepairError, match="did not come back"),
        holding(lab["zk"], lab["inv"], owner, report, mirror=mirror) as lock,
    ):
        lock.keep_when(ex.journal.keeps_lock)
        ex.run()
    return {"plan": plan, "bid": bid, "ex": ex, "report": report, "originals": originals, "index": index}


def test_a_halt_after_a_change_keeps_the_lock_and_the_broker_as_it_is(
    lab: dict[str, Any], halted: dict[str, Any]
) -> None:
    state: fleet.LabState = lab["state"]
    bid, ex, report = halted["bid"], halted["ex"], halted["report"]
    assert ex.journal.completed(bid) == State.CHANGED and ex.journal.changed_any()
    assert "after_failure" not in ex.journal.broker(bid) and not running(state, bid)
    assert not report["lock_released"] and "lock_kept" in report
    holder = lock_holder(lab["zk"], lab["state"].cluster_id)
    assert holder is not None and holder["run_id"] == "halted"
    # the fleet page and the metrics show it: held, no worker executing it, and why it was kept
    shown = lock_state.read(lab["settings"].store)
    assert shown is not None and shown.seen_by == "repair" and shown.holder == holder
    assert shown.needs_human and shown.kept == report["lock_kept"]
    # another plan cannot start; another run of this very plan neither (it would start a new attempt)
    with pytest.raises(LockHeld), lab["state"].zk_session() as other:
        acquire_lock(other, lab["state"].cluster_id, {"plan_hash": "f" * 64, "step": "brokers"})
    # the quarantine dirs are owned as the partition dir (the SSH user, root, is not its owner)
    qroot = halted["index"].parent / "fleet-doctor-quarantine"
    assert qroot.stat().st_uid == OTHER_UID and (qroot / halted["plan"].hash[:16]).stat().st_uid == OTHER_UID
    assert not halted["index"].exists()


def test_the_restore_refuses_a_hostile_plan_a_tampered_backup_and_two_stopped_brokers(
    lab: dict[str, Any], halted: dict[str, Any]
) -> None:
    s = lab["settings"]
    for hostile in ("../x", "../../etc", halted["plan"].hash[:11], "A" * 12, halted["plan"].hash[:12] + "/../.."):
        with pytest.raises(RepairError, match="not a plan hash"):
            restore_tasks.make_restore_plan(s, {"plan": hostile}, None)
    with pytest.raises(RepairError, match="0 repair plans match"):
        restore_tasks.make_restore_plan(s, {"plan": "0" * 12}, None)
    # a backup with one member more than its manifest (an absolute path outside the log dirs)
    d = RepairsDir(s.repairs).attempt(halted["plan"].hash, "halted")
    bk = halted["ex"].journal.backups(halted["bid"])[0]
    tarball = d / bk["tarball"]
    good = tarball.read_bytes()
    try:
        evil = tarball.with_name("evil.txt")
        evil.write_text("x")
        with tarfile.open(tarball, "w:gz") as tar:
            with tarfile.open(fileobj=io.BytesIO(good), mode="r:gz") as src:
                for m in src:
                    tar.addfile(m, src.extractfile(m))
            tar.add(evil, arcname="etc/cron.d/evil")
        with pytest.raises(RepairError, match="does not match its checksum"):
            restore_tasks.make_restore_plan(s, {"plan": halted["plan"].hash}, None)
        j = json.loads((d / "journal.json").read_text())
        j["brokers"][str(halted["bid"])]["backups"][0]["sha256"] = sha(tarball)  # the journal tampered with too
        (d / "journal.json").write_text(json.dumps(j))
        with pytest.raises(RepairError, match="exactly its manifest"):
            restore_tasks.make_restore_plan(s, {"plan": halted["plan"].hash}, None)
    finally:
        tarball.write_bytes(good)
        halted["ex"].journal.save()  # the journal as the executor wrote it
    with pytest.raises(RepairError, match="start=false"):
        restore_tasks.make_restore_plan(s, {"plan": halted["plan"].hash[:12], "brokers": [1, 2], "start": False}, None)


def test_a_restore_that_fails_hands_the_lock_back_to_the_halted_repair(
    lab: dict[str, Any], halted: dict[str, Any]
) -> None:
    """The restore takes the lock over from the halted attempt it puts back; when it cannot finish, the halted
    repair still needs a human: the lock goes back to it, not free."""
    s = lab["settings"]
    planned = restore_tasks.make_restore_plan(s, {"plan": halted["plan"].hash}, None)

    def unreachable(broker_id: int) -> Any:
        raise OSError(113, "No route to host")

    with pytest.raises(RepairError, match="No route to host"):
        restore_tasks.restore_backup(s, planned, {"timeout_s": 60}, "restore-0", unreachable)
    holder = lock_holder(lab["zk"], lab["state"].cluster_id)
    assert holder is not None and holder["run_id"] == "halted" and holder["step"] == "brokers"
    shown = lock_state.read(s.store)
    assert shown is not None and shown.seen_by == "restore" and shown.needs_human and shown.holder == holder
    assert shown.kept is not None and "still need a human" in shown.kept


def test_the_restore_puts_the_backup_back_gated_and_owned_as_the_partition_dir(
    lab: dict[str, Any], halted: dict[str, Any]
) -> None:
    state: fleet.LabState = lab["state"]
    s, bid = lab["settings"], halted["bid"]
    controller = Cluster(lab["zk"]).controller()
    gates = {"healthy_polls": 2, "poll_interval_s": 1, "isr_timeout_s": 60, "timeout_s": 60}
    planned = restore_tasks.make_restore_plan(s, {"plan": halted["plan"].hash[:16], **gates}, controller)
    rplan = Plan.from_json((s.repairs / halted["plan"].hash / "restores" / planned["hash"] / "plan.json").read_text())
    assert rplan.restart_order == [bid] and planned["restore_of"] == halted["plan"].hash
    assert planned["markdown"].rstrip().endswith(f"Plan hash: `{planned['hash']}`")
    assert rplan.gates == gates and "- **Gates:** `healthy_polls` `2`" in planned["markdown"]  # issue 28 item 6
    files = {a.path for a in rplan.brokers[0].actions}
    assert files == set(halted["originals"])
    params = {"healthy_polls": 1, "poll_interval_s": 1, "isr_timeout_s": 60, "timeout_s": 60}  # weakened since
    report = restore_tasks.restore_backup(s, planned, params, "restore-1", ssh_connect(lab["inv"]), {"by": {"id": "t"}})
    assert report["status"] == "done" and report["done"] == [bid] and report["lock_released"], report
    for path, data in halted["originals"].items():
        p = Path(path)
        if p.name.endswith(".index"):
            continue  # the broker trims / rebuilds its index at start; the restored bytes were checked before it
        assert p.read_bytes() == data or p.name == "leader-epoch-checkpoint", path
        assert p.stat().st_uid == OTHER_UID, path
    rj = json.loads(
        (
            s.repairs / halted["plan"].hash / "restores" / planned["hash"] / "runs" / "restore-1" / "journal.json"
        ).read_text()
    )
    assert rj["approvals"][0]["by"] == {"id": "t"} and rj["brokers"][str(bid)]["backups"] == []  # nothing to back up
    healthy = [h["detail"] for h in rj["brokers"][str(bid)]["history"] if h["state"] == "healthy"]
    assert healthy == ["2 consecutive healthy polls"]  # the approved gate, not the form's weaker one
    assert running(state, bid) and lock_holder(lab["zk"], lab["state"].cluster_id) is None
    shown = lock_state.read(s.store)
    assert shown is not None and not shown.held and shown.seen_by == "restore" and shown.describe() == "free"
    repair = json.loads((RepairsDir(s.repairs).attempt(halted["plan"].hash, "halted") / "journal.json").read_text())
    assert repair["status"] == "restored" and repair["brokers"][str(bid)]["state"] == "pending"


def test_attempts_are_per_run(tmp_path: Path) -> None:
    """A new run of a plan is a new attempt (its own journal: a done attempt is no silent no-op for it); a rerun of
    the same run reads its own journal and resumes."""
    action = FileAction("remove", "/d/t-0/partition.metadata", "topic-id-mismatch", "t", 0, "why")
    plan = Plan("c1", "run1", {}, [BrokerPlan(1, False, True, [action])], [], [])
    done = Journal(RepairsDir(tmp_path).attempt(plan.hash, "manual__2026-01-01T00:00:00+00:00") / "journal.json", plan)
    for st in (State.PRECHECKED, State.STOPPED, State.BACKED_UP, State.CHANGED, State.DONE):
        done.advance(1, st)
    again = Journal(RepairsDir(tmp_path).attempt(plan.hash, "manual__2026-01-01T00:00:00+00:00") / "journal.json", plan)
    assert again.completed(1) == State.DONE
    new = Journal(RepairsDir(tmp_path).attempt(plan.hash, "manual__2026-02-01T00:00:00+00:00") / "journal.json", plan)
    assert new.completed(1) == State.PENDING and not new.touched()
    assert RepairsDir(tmp_path).attempt(plan.hash, "a/../b").parent == tmp_path / plan.hash / "attempts"
    assert controller_last(plan.brokers, 1)[0].broker_id == 1


def test_a_resume_without_its_journal_keeps_the_lock(lab: dict[str, Any]) -> None:
    """A rerun of a run that holds the lock, on a worker whose repairs dir does not have that run's journal (a
    worker-local dir), must not start over as if nothing had happened: refused, the lock kept."""
    plan = one_broker(lab, plan_of(lab).restart_order[-1])
    tasks.save_plan(lab["settings"], plan)
    owner = {"plan_hash": plan.hash, "step": "brokers", "run_id": "elsewhere"}
    acquire_lock(lab["zk"], lab["state"].cluster_id, owner)
    try:
        with pytest.raises(RepairError, match=r"journal .* is not here"):
            tasks.execute(lab["settings"], {"hash": plan.hash}, {}, "elsewhere", ssh_connect(lab["inv"]))
        assert lock_holder(lab["zk"], lab["state"].cluster_id)["run_id"] == "elsewhere"
        # and another run of the same plan is refused while this one holds it
        with pytest.raises(LockHeld), lab["state"].zk_session() as other:
            acquire_lock(other, lab["state"].cluster_id, {**owner, "run_id": "another"})
    finally:
        release_lock(lab["zk"], lab["state"].cluster_id, owner)


def test_an_audit_shows_the_repair_lock_as_zookeeper_holds_it(lab: dict[str, Any]) -> None:
    """What the fleet page shows of the lock: each audit's discover reads it (a lock taken, left by a worker that
    is gone, released by hand), and a newer observation replaces the mirror, never an older one."""
    store, key = lab["settings"].store, lab["state"].cluster_id
    owner = {"plan_hash": "a" * 64, "step": "brokers", "run_id": "by-hand", "since": 1_790_000_000}
    acquire_lock(lab["zk"], key, owner)
    try:
        executing = LockState.from_json(steps.discover(lab["inv"])["repair_lock"])
        assert executing is not None and executing.seen_by == "audit"
        assert executing.held and executing.worker_alive and executing.holder == owner and not executing.needs_human
        assert executing.describe().startswith("held by run by-hand (plan aaaaaaaaaaaa, step brokers, since 2026-")
        release_active(lab["zk"], key)  # the worker is gone, its lock stays
        left = LockState.from_json(steps.discover(lab["inv"])["repair_lock"])
        assert left is not None and left.needs_human and "a person must" in left.describe()
        lock_state.record(store, left)
    finally:
        release_lock(lab["zk"], key, owner)  # by hand
    free = LockState.from_json(steps.discover(lab["inv"])["repair_lock"])
    assert free is not None and not free.held and free.worker_alive is None
    lock_state.record(store, free)
    assert lock_state.read(store) == free
    lock_state.record(store, executing)  # seen before: never replaces a newer state
    assert lock_state.read(store) == free


def test_the_gates_are_part_of_the_plan(lab: dict[str, Any]) -> None:
    """The form's gates (min ISR, healthy polls, dry run...) are in the plan's hash and its approval text, and the
    run takes them from the approved plan, not from the form as it is when execute runs."""
    s = lab["settings"]
    findings = s.store.read_jsonl(layout.history_findings("run1"))
    area = layout.staging("run1")
    careful = tasks.plan_from(s, "run1", findings, area, {"healthy_polls": 5, "min_insync_replicas": 2})
    lax = tasks.plan_from(s, "run1", findings, area, {"healthy_polls": 1})
    assert careful.hash != lax.hash
    text = approval_text.repair_markdown(careful)
    assert "`healthy_polls` `5`" in text and "`min_insync_replicas` `2`" in text
    gated = approved_gates(careful.gates, {"healthy_polls": 1, "min_insync_replicas": 1})
    assert gated["healthy_polls"] == 5 and gated["min_insync_replicas"] == 2
    gates = ZooKeeperLock(lab["zk"], "k").gates(lab["inv"], {"min_insync_replicas": 1})
    assert gates.default_min_isr in (None, 1)


def test_attempt_names_are_one_to_one_with_run_ids() -> None:
    """safe_run_id alone maps ``a:b`` and ``a_b`` to one name: two runs would share an attempt (a done one a no-op)."""
    from fleet_doctor.layout import attempt_name

    assert attempt_name("a:b") != attempt_name("a_b") and attempt_name("a_b") == "a_b"
    assert "/" not in attempt_name("x/../y") and attempt_name("manual__2026-01-01T00:00:00+00:00").startswith(
        "manual__"
    )


def test_planned_paths_must_be_repairable_files_of_the_brokers_log_dirs() -> None:
    from fleet_doctor.repair.plan import planned_path_ok

    dirs = ["/var/lib/kafka/data"]
    assert planned_path_ok("remove", "/var/lib/kafka/data/t-0/partition.metadata", dirs)
    assert planned_path_ok("quarantine", "/var/lib/kafka/data/t-0/00000000000000000000.index", dirs)
    for action, path in [
        ("remove", "/etc/passwd"),
        ("remove", "/var/lib/kafka/data/t-0/00000000000000000000.log"),  # never a log segment
        ("quarantine", "/var/lib/kafka/data/t-0/partition.metadata"),
        ("remove", "/var/lib/kafka/data/../x/partition.metadata"),
        ("remove", "/var/lib/kafka/data/t-0/sub/partition.metadata"),
        ("remove", "/var/lib/kafka/other/t-0/partition.metadata"),
        ("remove", "/var/lib/kafka/data/t-0\n/partition.metadata"),
    ]:
        assert not planned_path_ok(action, path, dirs), (action, path)


def test_an_inventory_cluster_id_must_be_a_kafka_uuid() -> None:
    """Issue 28 item 7: the inventory's optional ``cluster_id`` is validated when it is read."""
    from fleet_doctor import inventory

    base = {"inventory_version": 1, "cluster": "c", "zookeeper": "h:2181", "brokers": []}
    assert inventory.parse(base).cluster_id is None
    assert inventory.parse({**base, "cluster_id": "MkU3OEVBNTcwNTJENDM2Qg"}).cluster_id == "MkU3OEVBNTcwNTJENDM2Qg"
    for bad in ("short", 42, "MkU3OEVBNTcwNTJENDM2Q!"):
        with pytest.raises(inventory.InventoryError, match="cluster_id"):
            inventory.parse({**base, "cluster_id": bad})
