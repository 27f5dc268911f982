"""The fault matrix (issue 15): faults injected during a seed-004 repair of one broker on a live lab (real sshd per
broker, ZooKeeper 3.8, lab brokers, Spark post-verify), each followed by the invariants:

- **data lost: 0**: every planned file is either unchanged on disk or held, byte for byte, by a backup of the attempt
  whose tarball matches its recorded checksum;
- **no broker left stopped unless the journal says why** (a step the attempt journaled, or its ``after_failure``);
- **the journal is truthful**: before the change step began, no planned file differs; a broker the journal has not
  stopped is running;
- **the lock is held exactly when it should be**: after a crash (persistent znode, by this attempt) and after a halt
  once a file changed; free after a halt before any change and after the end;
- **a rerun of the same attempt resumes to the planned end state**: every replica's partition.metadata holds
  ZooKeeper's topic ID, the broker back in ISR, the lock free.

Each row records the outcome, whether the fault left the lock held and the broker down and why (the journal's
``after_failure``), and the data lost (always 0), in ``fault-matrix.json`` beside the module's files and printed at
the end. Issue 28's rows: an ``AirflowTaskTimeout`` during the stop and during the backup, the repairs volume full
right after the stop, a ZooKeeper session expiry inside the ISR wait, a controlled shutdown slower than the stop gate,
a symlink planted between plan and change, and a repair and a restore run by a non-root SSH user (on a lab of its own
whose brokers run as ``kafka``).

Between cases the restore DAG's code puts the attempt's backups back (the broker drifted again), so each case starts
from the same seed-004 state, and the restore is exercised after each case. The worker SIGKILLs are one attempt whose
worker dies at each step boundary in turn (each rerun resuming from what the last death left), the last rerun resuming
to done.

The Airflow faults (an approve task marked success by hand, a disallowed user answering, self-approval) are in
``tests/test_approval_live.py``; the rows below name them too. ``docs/repair.md`` holds the matrix as measured.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowTaskTimeout

from fleet_doctor import inventory
from fleet_doctor.audit import steps
from fleet_doctor.layout import RepairsDir
from fleet_doctor.repair import restore_tasks, tasks
from fleet_doctor.repair.broker import BrokerHost, ssh_hosts
from fleet_doctor.repair.errors import RepairError
from fleet_doctor.repair.executor import Executor
from fleet_doctor.repair.gates import Gates
from fleet_doctor.repair.journal import ORDER, State
from fleet_doctor.repair.plan import BrokerPlan
from fleet_doctor.repair.session import LockedCluster, holding
from fleet_doctor.settings import Settings
from fleet_doctor.zookeeper import cluster_session
from fleet_doctor.zookeeper.cluster import Cluster
from fleet_doctor.zookeeper.lock import lock_holder
from fleet_lab import fleet
from fleet_lab.broker import BrokerConfig
from fleet_lab.fleet import kill_sshd, run_service, start_sshd
from fleet_lab.incidents import run_scenario
from harness import zk_session
from harness.backups import lost_files
from harness.detect_service import bare_env
from harness.fault_worker import GATES, POINTS
from harness.repair_lab import plan_of
from harness.shared import AUDIT_RUN, audited
from harness.ssh import ssh_connect

pytestmark = pytest.mark.timeout(2400)
TOPIC = "seed-004"
ROOT = Path(__file__).resolve().parents[1]
RESULTS: list[dict[str, Any]] = []


@pytest.fixture(scope="module")
def lab(shared: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("fault-matrix")
    # the session's audited seed-004 lab; each case ends with the restore DAG's code putting the broker back as the
    # plan found it, so the next starts from the same state
    ctx = audited(shared, shared.snapshot("seed-004"), tmp)
    bid = plan_of(ctx).restart_order[0]
    plan = plan_of(ctx, brokers=[bid])
    tasks.save_plan(ctx["settings"], plan)
    ctx.update(bid=bid, plan=plan, originals={p: Path(p).read_bytes() for p in plan.brokers[0].backup_paths})
    with cluster_session(ctx["inv"], timeout=4, start_timeout=15) as zk:
        ctx["zk"] = zk
        ctx["zk_id"] = json.loads(zk.get(f"/brokers/topics/{TOPIC}")[0])["topic_id"]
        yield ctx
    (tmp / "fault-matrix.json").write_text(json.dumps(RESULTS, indent=2))
    print(
        "\nfault matrix:\n"
        + "\n".join(
            f"  {r['fault']}: {r['outcome']}; lock held: {r['lock_held']}, broker left down: {r['broker_left_down']}"
            + (f" ({r['why']})" if r["why"] else "")
            + f", data lost {r['data_lost']}"
            for r in RESULTS
        )
    )


def running(ctx: dict[str, Any]) -> bool:
    return fleet.running_pid(ctx["state"].broker(ctx["bid"]).config()) is not None


def journal_of(ctx: dict[str, Any], attempt: str) -> dict[str, Any]:
    return json.loads(
        (RepairsDir(ctx["settings"].repairs).attempt(ctx["plan"].hash, attempt) / "journal.json").read_text()
    )


def data_lost(ctx: dict[str, Any], attempt: str) -> list[str]:
    return lost_files(ctx["originals"], RepairsDir(ctx["settings"].repairs).attempt(ctx["plan"].hash, attempt))


def check_invariants(ctx: dict[str, Any], attempt: str, lock_expected: bool) -> dict[str, Any]:
    bid = ctx["bid"]
    j = journal_of(ctx, attempt)
    b = j["brokers"][str(bid)]
    state = State(b["state"])
    changing = bool(b.get("changing")) or ORDER.index(state) >= ORDER.index(State.CHANGED)
    lost = data_lost(ctx, attempt)
    assert lost == [], f"data lost: {lost}"
    if not changing:  # the journal says nothing changed yet: nothing did
        changed = [p for p, data in ctx["originals"].items() if not Path(p).exists() or Path(p).read_bytes() != data]
        assert changed == [], f"journal at {state} without a change, yet changed: {changed}"
    if not running(ctx):  # stopped: the journal says so (a step after the stop), or why it was left so
        stopped_by_attempt = ORDER.index(State.STOPPED) <= ORDER.index(state) < ORDER.index(State.STARTED)
        assert stopped_by_attempt or "stopped" in str(b.get("after_failure", "")), (state, b.get("after_failure"))
    if ORDER.index(state) <= ORDER.index(State.PRECHECKED) and not b.get("failed"):
        assert running(ctx), "the journal never stopped it, yet it is down"
    holder = lock_holder(ctx["zk"], ctx["state"].cluster_id)
    assert (holder is not None) == lock_expected, holder
    if holder is not None:
        assert holder["run_id"] == attempt and holder["plan_hash"] == ctx["plan"].hash
    return {
        "journal_state": str(state),
        "failed": b.get("failed"),
        "after_failure": b.get("after_failure"),
        "lock_held": holder is not None,
        "broker_left_down": not running(ctx),
    }


def resume(ctx: dict[str, Any], attempt: str) -> dict[str, Any]:
    """The task cleared and run again (same Airflow run: the same attempt), as tasks.execute does it."""
    owner = {"plan_hash": ctx["plan"].hash, "step": "brokers", "run_id": attempt}
    report: dict[str, Any] = {}
    # a dead worker's liveness node expires first
    with holding(ctx["zk"], ctx["inv"], owner, report, live_wait_s=30) as lock:
        ex = executor(ctx, attempt, lock)
        out = ex.run()
    assert out["status"] == "done" and report["lock_released"]
    fleet.wait_healthy(ctx["state"], timeout=60)
    ids = {k: v for k, v in fleet.partition_topic_ids(ctx["state"]).items() if k[0] == ctx["bid"] and k[1] == TOPIC}
    assert ids and set(ids.values()) == {ctx["zk_id"]}
    assert data_lost(ctx, attempt) == []
    return out


def reset(ctx: dict[str, Any], attempt: str) -> None:
    """The restore (its own plan, gated) puts the attempt's backups back: the broker holds the drifted files again."""
    s = ctx["settings"]
    controller = Cluster(ctx["zk"]).controller()
    planned = restore_tasks.make_restore_plan(s, {"plan": ctx["plan"].hash, "attempt": attempt}, controller)
    params = {"healthy_polls": 2, "poll_interval_s": 0.5, "isr_timeout_s": 60, "timeout_s": 60}
    report = restore_tasks.restore_backup(s, planned, params, f"reset-{attempt}", ssh_connect(ctx["inv"]))
    assert report["status"] == "done", report
    for path, data in ctx["originals"].items():
        if path.endswith("partition.metadata"):
            assert Path(path).read_bytes() == data, path  # drifted again, as the plan found it
    assert lock_holder(ctx["zk"], ctx["state"].cluster_id) is None


def record(fault: str, outcome: str, seen: dict[str, Any] | None = None, lost: int = 0) -> None:
    """A row of the matrix: the fault, the outcome, and, as the fault left things (``seen``, from
    ``check_invariants``, before the rerun): whether the lock was held, whether the broker was left down and why (the
    journal's ``after_failure``, or its state), and the data lost."""
    seen = seen or {}
    why = seen.get("after_failure") or (f"journal at {seen['journal_state']}" if seen else None)
    RESULTS.append(
        {
            "fault": fault,
            "outcome": outcome,
            "lock_held": seen.get("lock_held", False),
            "broker_left_down": seen.get("broker_left_down", False),
            "why": why if seen.get("broker_left_down") or seen.get("lock_held") else None,
            "data_lost": lost,
        }
    )


def test_worker_killed_at_every_step_boundary(lab: dict[str, Any], tmp_path: Path) -> None:
    """One attempt, its worker SIGKILLed at each step boundary in turn (``POINTS``): every rerun resumes from what the
    last death left (the journal) and dies at the next point; the invariants are checked after each death; the last
    rerun, nobody killing it, resumes to done."""
    attempt = "kill-every-boundary"
    env_path = f"{ROOT / 'plugins'}:{ROOT / 'lab'}:{ROOT / 'tests'}"
    seen_at = []
    for point in POINTS:
        cfg = tmp_path / f"worker-{point}.json"
        cfg.write_text(
            json.dumps(
                {
                    "inventory": str(lab["settings"].inventory),
                    "repairs": str(lab["settings"].repairs),
                    "plan_hash": lab["plan"].hash,
                    "attempt": attempt,
                    "point": point,
                    "session_timeout_s": 4,
                }
            )
        )
        proc = subprocess.run(
            [sys.executable, "-m", "harness.fault_worker", str(cfg)],
            env=bare_env(PATH="/usr/bin:/bin", PYTHONPATH=env_path, HOME=str(tmp_path)),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == -9, point + proc.stdout + proc.stderr[-3000:]  # SIGKILLed where it was told
        seen_at.append((point, check_invariants(lab, attempt, lock_expected=True)))  # a crash leaves the lock
    resume(lab, attempt)
    for i, (point, seen) in enumerate(seen_at):
        then = "the last rerun resumed to done" if i + 1 == len(seen_at) else f"the rerun died {seen_at[i + 1][0]}"
        record(f"worker SIGKILL {point}", f"journal at {seen['journal_state']}; {then}", seen)
    reset(lab, attempt)


def run_faulty(
    ctx: dict[str, Any],
    attempt: str,
    cls: type[Executor],
    expect: str,
    zk: Any = None,
    inv: Any = None,
    raises: type[BaseException] = RepairError,
    gates: Gates = GATES,
) -> dict[str, Any]:
    """The repair run by ``cls`` (the real executor with one fault injected), as ``tasks.execute`` runs it (lock,
    fence, finish), on ``zk`` (default: the module's session; the worker's own when the fault is its session's) and
    ``inv`` (default: the lab's inventory). It must halt with ``raises`` matching ``expect``; returns the report."""
    owner = {"plan_hash": ctx["plan"].hash, "step": "brokers", "run_id": attempt}
    zk, inv = zk or ctx["zk"], inv or ctx["inv"]
    report: dict[str, Any] = {}
    with pytest.raises(raises, match=expect), holding(zk, inv, owner, report) as lock:
        executor(ctx, attempt, lock, cls, inv, gates).run()
    return report


def executor(
    ctx: dict[str, Any],
    attempt: str,
    lock: LockedCluster,
    cls: type[Executor] = Executor,
    inv: Any = None,
    gates: Gates = GATES,
) -> Executor:
    """The attempt's executor as ``tasks.execute`` builds it, under ``lock`` (its fence, its health gates)."""
    inv = inv or ctx["inv"]
    where = RepairsDir(ctx["settings"].repairs).attempt(ctx["plan"].hash, attempt)
    ex = cls(ctx["plan"], where, inv, ssh_hosts(inv, ssh_connect(inv)), lock.cluster({}), gates, fence=lock.fence())
    lock.keep_when(ex.journal.keeps_lock)
    return ex


def after_backup(hook: Any) -> type[Executor]:
    """The executor with ``hook(executor, broker, host)`` run right after its backup step."""

    class Hooked(Executor):
        def backup(self, b: BrokerPlan, host: BrokerHost) -> str:
            out = super().backup(b, host)
            hook(self, b, host)
            return out

    return Hooked


def test_sshd_killed_mid_backup(lab: dict[str, Any]) -> None:
    state: fleet.LabState = lab["state"]

    class SshdDies(Executor):
        def backup(self, b: BrokerPlan, host: BrokerHost) -> str:
            fetch = host.remote.fetch

            def killed_then_fetch(*a: Any, **k: Any) -> None:
                kill_sshd(state, b.broker_id)  # the host is gone mid-backup: the tarball made, not fetched
                fetch(*a, **k)

            host.remote.fetch = killed_then_fetch  # type: ignore[method-assign]
            return super().backup(b, host)

    attempt = "sshd-killed"
    try:
        report = run_faulty(lab, attempt, SshdDies, "could not run")
        # nothing changed, but the broker it stopped may be down: the lock stays until a human (or the rerun) acts
        seen = check_invariants(lab, attempt, lock_expected=True)
        assert not running(lab) and "may be left stopped" in seen["after_failure"]  # it says why it is down
        assert "lock_kept" in report
    finally:
        start_sshd(state, lab["bid"])
    resume(lab, attempt)
    record(
        "broker sshd killed mid-backup",
        "halted at the backup, nothing changed, broker down with the reason journaled, the lock kept; rerun resumed "
        "to done",
        seen,
    )
    reset(lab, attempt)


def test_broker_restarted_by_someone_else_between_stop_and_change(lab: dict[str, Any]) -> None:
    def someone_starts_it(ex: Executor, b: BrokerPlan, host: BrokerHost) -> None:
        assert run_service(lab["state"].broker(b.broker_id), "start").returncode == 0

    attempt = "restarted"
    report = run_faulty(lab, attempt, after_backup(someone_starts_it), "started by someone else")
    assert report["lock_released"]
    seen = check_invariants(lab, attempt, lock_expected=False)
    assert running(lab) and seen["after_failure"].startswith("running")
    resume(lab, attempt)
    record(
        "broker restarted by someone else between stop and change",
        "change refused, nothing changed, broker left running; rerun resumed to done",
        seen,
    )
    reset(lab, attempt)


def test_zookeeper_session_expiry_mid_repair(lab: dict[str, Any]) -> None:
    def expire(ex: Executor, b: BrokerPlan, host: BrokerHost) -> None:
        zk_session.expire(lab["inv"].zookeeper, ex.cluster.zk)

    attempt = "zk-expired"
    with cluster_session(lab["inv"], timeout=4, start_timeout=15) as worker_zk:  # the worker's own session
        report = run_faulty(lab, attempt, after_backup(expire), r"session|no longer holds", worker_zk)
    # the worker stops at once and writes nothing more: the lock and the journal may be another worker's by now
    assert not report["lock_released"] and "lost its ZooKeeper session" in report["lock_kept"]
    seen = check_invariants(lab, attempt, lock_expected=True)
    assert not running(lab) and seen["journal_state"] == "backed_up"  # stopped, as the journal says
    resume(lab, attempt)
    record(
        "ZooKeeper session expiry mid-repair",
        "the fence stops the worker before the change (the lock's liveness node went with the session): nothing "
        "more written or started, the lock kept; rerun resumed to done",
        seen,
    )
    reset(lab, attempt)


def test_broker_started_by_someone_else_during_the_change(lab: dict[str, Any]) -> None:
    """After the checks that it is down, before the first file changes: the change runs under the log dirs' .lock,
    so it refuses (exit 75) instead of changing files under a running broker."""

    class StartedDuringTheChange(Executor):
        def unchanged_since_backup(self, b: BrokerPlan, host: BrokerHost) -> None:
            super().unchanged_since_backup(b, host)
            assert run_service(lab["state"].broker(b.broker_id), "start").returncode == 0

    attempt = "started-mid-change"
    run_faulty(lab, attempt, StartedDuringTheChange, r"holds its log dir's \.lock")
    seen = check_invariants(lab, attempt, lock_expected=False)
    assert running(lab) and seen["after_failure"].startswith("running")
    resume(lab, attempt)
    record(
        "broker started by someone else during the change",
        "the change, run under the log dirs' .lock, refuses before the first file; nothing changed, broker left "
        "running; rerun resumed to done",
        seen,
    )
    reset(lab, attempt)


def test_broker_tmp_full(lab: dict[str, Any], tmp_path: Path) -> None:
    tiny = tmp_path / "tiny-tmp"
    tiny.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k,mode=1777", "tmpfs", str(tiny)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr!r}")
    try:
        inv = lab["inv"]
        full = dataclasses.replace(
            inv, brokers=[dataclasses.replace(b, tmp_dir=str(tiny)) if b.id == lab["bid"] else b for b in inv.brokers]
        )
        subprocess.run(["dd", "if=/dev/zero", f"of={tiny}/filler", "bs=4k", "count=64"], capture_output=True)
        attempt = "tmp-full"
        run_faulty(lab, attempt, Executor, r"No space left|exited", inv=full)
        seen = check_invariants(lab, attempt, lock_expected=False)
        assert running(lab) and seen["after_failure"].startswith("started again")
        assert list(tiny.iterdir()) == [tiny / "filler"]  # the half-written backup dir cleaned up
    finally:
        subprocess.run(["umount", str(tiny)], capture_output=True)
    resume(lab, attempt)
    record(
        "broker /tmp full",
        "backup failed (No space left on device), nothing changed, broker started again; rerun resumed to done",
        seen,
    )
    reset(lab, attempt)


def test_restore_with_a_hostile_plan(lab: dict[str, Any]) -> None:
    before = {p: Path(p).read_bytes() if Path(p).exists() else None for p in lab["originals"]}
    for hostile in ("../x", "../../etc/passwd", "0123456789ab/../..", "-rf", lab["plan"].hash[:8]):
        with pytest.raises(RepairError, match="not a plan hash"):
            restore_tasks.make_restore_plan(lab["settings"], {"plan": hostile}, None)
    assert {p: Path(p).read_bytes() if Path(p).exists() else None for p in lab["originals"]} == before
    assert lock_holder(lab["zk"], lab["state"].cluster_id) is None
    record("restore with a hostile plan", "refused before any read outside the repairs dir; nothing changed")


# ---- issue 28: a timeout inside a step, a session lost inside a wait, a symlink planted before the change
def test_airflow_task_timeout_during_the_stop(lab: dict[str, Any]) -> None:
    """An ``execution_timeout`` (Airflow raises ``AirflowTaskTimeout``, a BaseException) while the executor waits for
    the stopped broker to go: the stop was journaled as issued before it was sent, so the failure path knows the
    broker is down and starts it again; nothing changed, the lock is released, the timeout goes on up to Airflow."""

    class TimesOut(Executor):
        timed_out = False

        def _wait_stopped(self, b: BrokerPlan, host: BrokerHost) -> None:
            if not self.timed_out:
                self.timed_out = True
                raise AirflowTaskTimeout("Timeout, PID: 4242")
            super()._wait_stopped(b, host)

    attempt = "timeout-in-stop"
    report = run_faulty(lab, attempt, TimesOut, "Timeout", raises=AirflowTaskTimeout)
    seen = check_invariants(lab, attempt, lock_expected=False)
    assert report["lock_released"] and running(lab) and seen["after_failure"].startswith("started again")
    resume(lab, attempt)
    record(
        "AirflowTaskTimeout during the stop",
        "the stop journaled as issued before it was sent: broker started again, nothing changed, lock released, "
        "the timeout raised on to Airflow; rerun resumed to done",
        seen,
    )
    reset(lab, attempt)


def test_airflow_task_timeout_during_the_backup(lab: dict[str, Any]) -> None:
    """The timeout while the backup's tarball is being made on the broker: nothing changed, the broker (stopped by
    this attempt) started again, the lock released, and the rerun takes the backup again."""

    class TimesOut(Executor):
        def _take_backup(self, b: BrokerPlan, host: BrokerHost, present: dict[str, str], n: int) -> dict[str, Any]:
            if self.journal.broker(b.broker_id).get("failed") is None:
                raise AirflowTaskTimeout("Timeout, PID: 4243")
            return super()._take_backup(b, host, present, n)

    attempt = "timeout-in-backup"
    report = run_faulty(lab, attempt, TimesOut, "Timeout", raises=AirflowTaskTimeout)
    seen = check_invariants(lab, attempt, lock_expected=False)
    assert report["lock_released"] and running(lab) and seen["after_failure"].startswith("started again")
    assert seen["journal_state"] == "stopped"
    resume(lab, attempt)
    record(
        "AirflowTaskTimeout during the backup",
        "halted in the backup, nothing changed, broker started again, lock released, the timeout raised on to "
        "Airflow; rerun resumed to done",
        seen,
    )
    reset(lab, attempt)


def test_zookeeper_session_expiry_inside_the_isr_wait(lab: dict[str, Any]) -> None:
    """The lock's session expires while the executor polls for the started broker to be back in ISR (the files
    are changed, the broker is up): the next fence stops the worker, which writes nothing more and leaves the lock
    and the broker as they are; the rerun (its own session) finishes the wait and the post-verify."""

    class Expires(Executor):
        expired = False

        def healthy(self, b: BrokerPlan, host: BrokerHost) -> str:
            if not self.expired:
                self.expired = True
                zk_session.expire(lab["inv"].zookeeper, self.cluster.zk)
            return super().healthy(b, host)

    attempt = "zk-expired-in-isr-wait"
    with cluster_session(lab["inv"], timeout=4, start_timeout=15) as worker_zk:
        report = run_faulty(lab, attempt, Expires, r"session|no longer holds", worker_zk)
    assert not report["lock_released"] and "lost its ZooKeeper session" in report["lock_kept"]
    seen = check_invariants(lab, attempt, lock_expected=True)
    assert running(lab) and seen["journal_state"] in ("started", "healthy") and not seen["failed"]
    resume(lab, attempt)
    record(
        "ZooKeeper session expiry inside the ISR wait",
        "the fence stops the worker after the wait: files changed and broker up as journaled, nothing more "
        "written, the lock kept; rerun resumed to done",
        seen,
    )
    reset(lab, attempt)


def test_a_symlink_planted_between_plan_and_change(lab: dict[str, Any], tmp_path: Path) -> None:
    """After the backup the Kafka user swaps the planned partition dir for a link to a copy outside the log dir
    (every checksum still matches): the change refuses naming the path, nothing outside the log dir changes, and,
    the change having begun, the broker stays down and the lock stays for a human (journaled why)."""
    pdir = Path(lab["plan"].brokers[0].actions[0].path).parent
    real, outside = pdir.with_name(pdir.name + ".real"), tmp_path / "outside"

    def swap(ex: Executor, b: BrokerPlan, host: BrokerHost) -> None:
        shutil.copytree(pdir, outside)
        pdir.rename(real)
        try:
            pdir.symlink_to(outside)
        except OSError:
            real.rename(pdir)
            raise

    attempt = "symlink-planted"
    try:
        report = run_faulty(lab, attempt, after_backup(swap), rf"refused: {re.escape(str(pdir))} is a symlink")
        outside_after = {p.name: p.read_bytes() for p in outside.iterdir()}
        assert outside_after == {p.name: p.read_bytes() for p in real.iterdir()}  # nothing outside changed
    finally:
        if pdir.is_symlink():
            pdir.unlink()
            real.rename(pdir)  # a human puts the dir back
    seen = check_invariants(lab, attempt, lock_expected=True)
    assert "lock_kept" in report and not running(lab) and seen["failed"]
    resume(lab, attempt)
    record(
        "symlink planted between plan and change",
        "the change refused naming the path, nothing outside the log dir changed; the broker left down and the "
        "lock kept, as journaled; rerun (the dir put back) resumed to done",
        seen,
    )
    reset(lab, attempt)


def test_a_controlled_shutdown_slower_than_the_stop_gate(lab: dict[str, Any]) -> None:
    """The broker's controlled shutdown takes 8 s (its leaders moving away, still registered), the plan's
    ``stop_timeout_s`` is 2 s, and the service's stop command blocks until the process is gone (as ``systemctl stop``
    does): the command does not return in time. The executor neither counts the broker as running ("its stop never
    took", the lock released: it would go down under a released lock) nor starts it: it journals that it may be left
    stopping and keeps the lock (a human, or the rerun, looks once it has stopped). Nothing changed."""
    b = lab["state"].broker(lab["bid"])
    cfg = BrokerConfig.load(b.config_path)

    def restart_with(c: BrokerConfig) -> None:
        assert run_service(b, "stop").returncode == 0
        c.save(b.config_path)
        assert run_service(b, "start").returncode == 0
        deadline = time.monotonic() + 60  # registered again (seed-004's broker stays out of ISR: not "healthy")
        while not lab["zk"].exists(f"/brokers/ids/{lab['bid']}"):
            assert time.monotonic() < deadline, f"broker {lab['bid']} did not register"
            time.sleep(0.1)

    attempt = "slow-shutdown"
    try:
        restart_with(dataclasses.replace(cfg, controlled_shutdown_ms=8000))
        report = run_faulty(
            lab, attempt, Executor, "did not return within", gates=dataclasses.replace(GATES, stop_timeout_s=2)
        )
        seen = check_invariants(lab, attempt, lock_expected=True)  # still shutting down, the lock kept
        assert "lock_kept" in report and seen["after_failure"].startswith("may be left stopping")
        deadline = time.monotonic() + 30
        while running(lab) and time.monotonic() < deadline:  # the controlled shutdown ends
            time.sleep(0.2)
        assert not running(lab)
    finally:
        if BrokerConfig.load(b.config_path) != cfg:
            if running(lab):  # a failure above: no later case may meet the slow shutdown
                restart_with(cfg)
            cfg.save(b.config_path)  # its next start without the slow shutdown
    resume(lab, attempt)
    record(
        "controlled shutdown slower than the stop gate",
        "the stop gate expired with the broker still registered and running: neither counted as down nor "
        "started, journaled as may be left stopping, the lock kept; once stopped, rerun resumed to done",
        {**seen, "broker_left_down": True},
    )
    reset(lab, attempt)


def test_the_repairs_volume_full_right_after_the_stop(lab: dict[str, Any], tmp_path: Path) -> None:
    """The attempt's dir (journal, backups) on a 1 MiB tmpfs that fills up right after the broker stopped: the
    journal cannot say "stopped". The stop was journaled as issued before it was sent, so the failure path starts
    the broker again; the journal on disk is behind what happened, so the lock stays for a human. With room again
    the rerun is done."""
    where = RepairsDir(lab["settings"].repairs).attempt(lab["plan"].hash, "volume-full")
    where.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(where)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr!r}")
    filler = where / "filler"

    class FillsUp(Executor):
        def stop(self, b: BrokerPlan, host: BrokerHost) -> str:
            out = super().stop(b, host)
            subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)  # until ENOSPC
            return out

    attempt = "volume-full"
    try:
        report = run_faulty(lab, attempt, FillsUp, "No space left on device")
        filler.unlink()
        seen = check_invariants(lab, attempt, lock_expected=True)
        assert "journal is behind" in report["lock_kept"] and running(lab)
        assert seen["journal_state"] == "prechecked"  # what the disk says: its last write before the volume filled
        resume(lab, attempt)
        record(
            "repairs volume full right after the stop",
            "the journal could not say stopped: the broker started again (the stop was journaled as issued), "
            "nothing changed, the lock kept (the journal is behind what happened); with room, rerun resumed to done",
            seen,
        )
        reset(lab, attempt)
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            lazy = subprocess.run(["umount", "-l", str(where)], capture_output=True)
            assert lazy.returncode == 0, f"{where} is still mounted: {lazy.stderr!r}"


# ---- issue 28 item 2: a least-privilege SSH user
SSH_USER, KAFKA_USER = "kafka-doctor", "kafka"


@pytest.fixture
def least_privilege() -> Iterator[dict[str, Any]]:
    """seed-004 on a lab of its own whose brokers run as ``kafka`` and own their files, reached as ``kafka-doctor``
    (neither root nor Kafka's; sudo lets it act as ``kafka`` only), audited, the plan for its first broker saved."""
    if os.geteuid() != 0:
        pytest.skip("the least-privilege lab makes its users and their sudoers rule: root only")
    base = Path(tempfile.mkdtemp(prefix="fleet-doctor-least-privilege-"))  # in /tmp: the lab's users reach it
    base.chmod(0o755)
    try:
        state = fleet.up(base / "lab", brokers=3, kafka_version="2.8.2", ssh_user=SSH_USER, kafka_user=KAFKA_USER)
        assert all(s.ok for s in run_scenario(state, TOPIC))
        settings = Settings(inventory=state.inventory_path, data_root=base / "data")
        inv = inventory.load(state.inventory_path)
        steps.run_local(settings, AUDIT_RUN, ssh_connect(inv))
        ctx: dict[str, Any] = {"state": state, "settings": settings, "inv": inv}
        bid = plan_of(ctx).restart_order[0]
        plan = plan_of(ctx, brokers=[bid])
        tasks.save_plan(settings, plan)
        ctx.update(bid=bid, plan=plan, originals={p: Path(p).read_bytes() for p in plan.brokers[0].backup_paths})
        with cluster_session(inv, timeout=4, start_timeout=15) as zk:
            ctx["zk"] = zk
            ctx["zk_id"] = json.loads(zk.get(f"/brokers/topics/{TOPIC}")[0])["topic_id"]
            yield ctx
    finally:
        if (base / "lab" / "lab.json").is_file():
            fleet.down(base / "lab")
        shutil.rmtree(base)


def test_a_repair_and_a_restore_by_a_non_root_ssh_user(least_privilege: dict[str, Any]) -> None:
    """The seed-004 repair of one broker and then its restore, run by the real executor over the lab's sshd as
    ``kafka-doctor``: every read and change of Kafka's files went through ``sudo -n -u kafka`` (the journal's
    command log), each file the repair and the restore left is Kafka's own, nothing is root's, nothing lost."""
    ctx = least_privilege
    kafka = pwd.getpwnam(KAFKA_USER)
    attempt = "least-privilege"
    resume(ctx, attempt)  # the whole repair, under the lock, as tasks.execute runs it
    commands = [c["command"] for c in journal_of(ctx, attempt)["commands"]]
    as_kafka = [c for c in commands if f"sudo -n -u {KAFKA_USER} -- " in c]
    assert any("on_broker.py" in c for c in as_kafka) and any("tar -czf" in c for c in as_kafka), commands
    # every command on the broker's files, but the identity check's read of meta.properties, went through sudo
    log_dir = ctx["state"].broker(ctx["bid"]).log_dirs[0]
    on_files = [c for c in commands if log_dir in c and "meta.properties" not in c and "kafka-service" not in c]
    assert on_files and all(f"sudo -n -u {KAFKA_USER} -- " in c for c in on_files), on_files

    def owners() -> set[tuple[int, int]]:
        b = ctx["state"].broker(ctx["bid"])
        return {(p.lstat().st_uid, p.lstat().st_gid) for d in b.log_dirs for p in [Path(d), *Path(d).rglob("*")]}

    assert owners() == {(kafka.pw_uid, kafka.pw_gid)}
    reset(ctx, attempt)  # the restore puts the drifted files back, as kafka
    assert owners() == {(kafka.pw_uid, kafka.pw_gid)}
    assert data_lost(ctx, attempt) == []
    record(
        "repair and restore by a non-root SSH user",
        f"{SSH_USER} (sudo to {KAFKA_USER} only): repair done, restore done, every file {KAFKA_USER}'s own",
    )
