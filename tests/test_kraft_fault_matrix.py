"""The KRaft fault matrix (issue 30): faults during a KRaft repair on the live KRaft lab (3 combined nodes, real sshd
per node, the lab's quorum, Spark post-verify), from the session's audited KRaft snapshot (harness.kraft_repair:
seed-000's kill -9 of node 3, a proven stray replica and leftover *.deleted files on node 2), each case on a fresh
restore of it:

1. **the worker SIGKILLed at every step boundary** of one attempt of the whole plan, each rerun resuming from what
   the last death left and dying at the next point: node 3 after its pre-check, mid-backup (the tarball made on the
   node, not fetched), mid-change (one index quarantined, the others not), after its start; node 2 (a running
   voter: a real stop) after its stop, after its backup, mid-change (its stray replica moved, its leftovers not).
   After each death: the lock held by the attempt in the repairs dir, with a higher fencing token at each take; a
   node down only where the journal says it was stopped (node 3 also before its start: killed before the plan);
   nothing of a node changed before its change step; no byte lost (every backed-up file on disk as the plan found
   it, in a verified backup, or quarantined byte for byte; the stray replica and the leftovers, never copied, where
   they were or in the quarantine byte for byte). The last rerun waits out the dead worker's lease and resumes to
   done, the lock free;
2. **a controller failover mid-repair**, in that last rerun (the active controller restarted right after node 2's
   start): the gates follow the new leader; the repair ends done; then **the restore** of that attempt (the KRaft
   lock, gates and order) puts node 3's backups back;
3. **a voter lost mid-repair** (node 1's host unreachable once node 3 is done): the quorum gate holds node 2 (the
   other voters are not a caught-up majority without it), the run halts before node 2's stop, node 2 is never
   stopped, the lock stays (node 3's files changed) for a human or the rerun (row 1 shows a rerun resuming).

Each row is printed at the end, as the ZooKeeper matrix's (tests/test_fault_matrix.py) are.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor import layout
from fleet_doctor.layout import RepairsDir
from fleet_doctor.repair import restore_tasks, tasks
from fleet_doctor.repair.broker import BrokerHost
from fleet_doctor.repair.errors import RepairError
from fleet_doctor.repair.executor import Executor
from fleet_doctor.repair.gates import Gates
from fleet_doctor.repair.kraft_cluster import KraftCluster
from fleet_doctor.repair.plan import BrokerPlan, Plan
from fleet_lab import fleet
from fleet_lab.incidents import kraft_controller_failover
from harness.backups import lost_files, sha
from harness.detect_service import bare_env
from harness.fault_worker import GATES, run_attempt
from harness.kraft_repair import STRAY_NODE, VICTIM, snapshot
from harness.shared import AUDIT_RUN, audited
from harness.ssh import controller_connect, ssh_connect

pytestmark = pytest.mark.timeout(1800)
ROOT = Path(__file__).resolve().parents[1]
LEASE_S = 3.0  # the repair lock's liveness lease, short: a resume waits one out after a SIGKILLed worker
ROWS: list[str] = []


@pytest.fixture
def ctx(shared: Any, tmp_path: Path) -> dict[str, Any]:
    return audited(shared, snapshot(shared), tmp_path)


@pytest.fixture(scope="module", autouse=True)
def matrix() -> Any:
    yield
    print("\nKRaft fault matrix:\n" + "\n".join(f"  {r}" for r in ROWS))


def planned(ctx: dict[str, Any], **scope: Any) -> Plan:
    """The repair plan of the snapshot's audit, as the plan task makes it (the KRaft refusals applied), saved."""
    s = ctx["settings"]
    findings = s.store.read_jsonl(layout.history_findings(AUDIT_RUN))
    plan = tasks.plan_from(s, AUDIT_RUN, findings, layout.staging(AUDIT_RUN), scope)
    tasks.save_plan(s, plan)
    ctx["originals"] = {p: Path(p).read_bytes() for b in plan.brokers for p in b.backup_paths}
    return plan


def attempt_dir(ctx: dict[str, Any], plan: Plan, attempt: str) -> Path:
    return RepairsDir(ctx["settings"].repairs).attempt(plan.hash, attempt)


def lock_record(ctx: dict[str, Any]) -> dict[str, Any] | None:
    path = ctx["settings"].lock_dir / f"{ctx['state'].cluster_id}.json"
    return json.loads(path.read_text()) if path.exists() else None


def quarantined(ctx: dict[str, Any]) -> dict[str, set[str]]:
    """path -> sha256 of its quarantined copies (``<partition dir>/fleet-doctor-quarantine/<plan>/<name>[.n]``)."""
    out: dict[str, set[str]] = {}
    for path in ctx["originals"]:
        pdir, name = path.rsplit("/", 1)
        for copy in Path(pdir).glob(f"fleet-doctor-quarantine/*/{name}*"):
            out.setdefault(path, set()).add(sha(copy.read_bytes()))
    return out


def run(ctx: dict[str, Any], plan: Plan, attempt: str, cls: type[Executor] = Executor, gates: Gates = GATES) -> Any:
    """The attempt run as ``tasks.execute`` runs it: the lock in the repairs dir, the KRaft gates, the executor."""
    where = attempt_dir(ctx, plan, attempt)
    lock = {"lock_dir": ctx["settings"].lock_dir, "connect": controller_connect, "lease_s": LEASE_S, "live_wait_s": 30}
    return run_attempt(ctx["inv"], plan, attempt, where, cls, gates, **lock)


def done(ctx: dict[str, Any], plan: Plan, attempt: str, report: dict[str, Any]) -> None:
    """The planned end state: every node of the plan done, the lock free, the lab healthy, no byte lost."""
    journal = json.loads((attempt_dir(ctx, plan, attempt) / layout.JOURNAL).read_text())
    assert journal["status"] == "done", journal.get("error")
    assert report["lock_released"] is True and lock_record(ctx) is None, report
    fleet.wait_healthy(ctx["state"], timeout=60)
    assert lost_files(ctx["originals"], attempt_dir(ctx, plan, attempt), quarantined(ctx)) == []


def kill_worker_at(ctx: dict[str, Any], plan: Plan, attempt: str, point: str, tmp_path: Path) -> None:
    """The attempt run by a worker process (``harness.fault_worker``) that SIGKILLs itself at ``point``."""
    cfg = tmp_path / f"worker-{point}.json"
    cfg.write_text(
        json.dumps(
            {
                "inventory": str(ctx["settings"].inventory),
                "repairs": str(ctx["settings"].repairs),
                "plan_hash": plan.hash,
                "attempt": attempt,
                "point": point,
                "lock_dir": str(ctx["settings"].lock_dir),
                "lease_s": LEASE_S,
            }
        )
    )
    env = bare_env(
        PATH="/usr/bin:/bin", HOME=str(tmp_path), PYTHONPATH=f"{ROOT / 'plugins'}:{ROOT / 'lab'}:{ROOT / 'tests'}"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "harness.fault_worker", str(cfg)], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == -9, f"{point}: " + proc.stdout + proc.stderr[-3000:]  # SIGKILLed where it was told


# one attempt of the whole plan (node 3, then node 2), its worker killed at each step boundary in turn: every rerun
# resumes from what the last death left and dies at the next point; the points fall on node 3 until it is done, then
# on node 2 (a running voter: a real stop). The last rerun, with a controller failover in it, ends done.
CHAIN = (
    ("after-precheck", VICTIM),
    ("mid-backup", VICTIM),
    ("mid-change", VICTIM),
    ("after-start", VICTIM),
    ("after-stop", STRAY_NODE),
    ("after-backup", STRAY_NODE),
    ("mid-change", STRAY_NODE),
)


def moved_whole(ctx: dict[str, Any], plan: Plan, before: dict[str, dict[str, str]]) -> list[str]:
    """The planned paths no backup holds (a -stray replica dir, the leftovers) whose bytes are neither where the plan
    found them nor in the plan's quarantine (``<partition dir>/fleet-doctor-quarantine/<plan>/``, or beside the log
    dir for a replica dir). ``before``: path -> {file name: sha256} as the plan found them."""
    lost = []
    h = plan.hash[:16]
    for path, files in before.items():
        p = Path(path)
        if files.keys() == {""}:  # a file
            places = [p, *p.parent.glob(f"fleet-doctor-quarantine/{h}/{p.name}*")]
            found = [{"": sha(q.read_bytes())} for q in places if q.is_file()]
        else:  # a replica dir, moved whole
            quarantine = p.parent.parent / "fleet-doctor-stray-quarantine" / p.parent.name / h / p.name
            found = [{f.name: sha(f.read_bytes()) for f in q.iterdir()} for q in (p, quarantine) if q.is_dir()]
        if files not in found:
            lost.append(path)
    return lost


def in_place(path: str) -> dict[str, str] | None:
    """{file name: sha256} of a planned replica dir, {"": sha256} of a planned file, where the plan found it (None:
    not there)."""
    p = Path(path)
    if p.is_dir():
        return {f.name: sha(f.read_bytes()) for f in p.iterdir()}
    return {"": sha(p.read_bytes())} if p.is_file() else None


# the journal of the node a worker died on, by the point it died at: (state, changing)
DIED_AT = {
    "after-precheck": ("prechecked", False),
    "mid-backup": ("stopped", False),
    "after-backup": ("backed_up", False),
    "mid-change": ("backed_up", True),
    "after-start": ("started", True),
    "after-stop": ("stopped", False),
}


def after_death(ctx: dict[str, Any], plan: Plan, attempt: str, before: dict[str, dict[str, str]]) -> str:
    """The invariants after a SIGKILLed worker: the lock held by the attempt, no byte lost, a node down only where the
    journal says it was stopped (node 3: also before its start, as the plan found it), nothing of a node changed
    before the journal's change step. Returns the journal's states."""
    from fleet_doctor.repair.journal import ORDER, State

    held = lock_record(ctx)
    assert held is not None and held["holder"]["run_id"] == attempt, held
    assert lost_files(ctx["originals"], attempt_dir(ctx, plan, attempt), quarantined(ctx)) == []
    assert moved_whole(ctx, plan, before) == []
    journal = json.loads((attempt_dir(ctx, plan, attempt) / layout.JOURNAL).read_text())
    states = []
    for b in plan.brokers:
        if not b.restart:
            continue
        node = journal["brokers"][str(b.broker_id)]
        at = ORDER.index(State(node["state"]))
        up = fleet.running_pid(ctx["state"].broker(b.broker_id).config()) is not None
        stopped = ORDER.index(State.STOPPED) <= at < ORDER.index(State.STARTED)
        if b.broker_id == VICTIM and at < ORDER.index(State.STARTED):
            stopped = True  # killed before the plan was made: down until the repair starts it
        assert up != stopped, (b.broker_id, node["state"], up)
        if not node.get("changing") and at < ORDER.index(State.CHANGED):  # every planned path in place, as found
            changed = [a.path for a in b.actions if in_place(a.path) != before[a.path]]
            assert changed == [], (b.broker_id, node["state"], changed)
        states.append(f"node {b.broker_id} {node['state']}{' (changing)' if node.get('changing') else ''}")
    return ", ".join(states)


def test_the_worker_sigkilled_at_every_step_boundary_a_failover_and_the_restore(
    ctx: dict[str, Any], tmp_path: Path
) -> None:
    plan = planned(ctx)
    assert plan.restart_order == [VICTIM, STRAY_NODE]
    found = {a.path: in_place(a.path) for b in plan.brokers for a in b.actions}
    before = {path: kept for path, kept in found.items() if kept is not None}
    assert len(before) == len(found), found
    stray = next(a.path for b in plan.brokers for a in b.actions if a.rule == "stray-dir")
    attempt, seen, tokens = "kraft-kill-every-boundary", [], []
    for point, node in CHAIN:
        kill_worker_at(ctx, plan, attempt, point, tmp_path)
        states = after_death(ctx, plan, attempt, before)
        journal = json.loads((attempt_dir(ctx, plan, attempt) / layout.JOURNAL).read_text())["brokers"][str(node)]
        assert (journal["state"], bool(journal.get("changing"))) == DIED_AT[point], (point, node, journal)
        held = lock_record(ctx)
        assert held is not None and held["holder"]["plan_hash"] == plan.hash
        tokens.append(held["token"])
        if point == "mid-change":  # the first planned path moved, the others not: the worker died between them
            mine = sorted(a.path for b in plan.brokers if b.broker_id == node for a in b.actions)
            assert [p for p in mine if in_place(p) is None] == mine[:1], (node, mine)
            assert node == VICTIM or mine[0] == stray  # node 2: its stray replica first, its leftovers not yet
        seen.append(f"{point} of node {node} ({states})")
    assert tokens == sorted(set(tokens)), tokens  # every take after a dead worker's lease a higher fencing token
    state, failed_over = ctx["state"], {}

    class FailoverAfterStart(Executor):
        def start(self, b: BrokerPlan, host: BrokerHost) -> str:
            out = super().start(b, host)
            failed_over.update(kraft_controller_failover(state).details)
            return out

    report = run(ctx, plan, attempt, FailoverAfterStart)  # the last rerun: nobody kills it
    done(ctx, plan, attempt, report)
    assert moved_whole(ctx, plan, before) == []
    counter = ctx["settings"].lock_dir / f"{ctx['state'].cluster_id}.token"
    assert json.loads(counter.read_text())["token"] > tokens[-1]
    assert failed_over["epoch_after"] > failed_over["epoch_before"]  # a new election (its winner may be the same node)
    ROWS.append(
        "worker SIGKILL at every step boundary, one attempt, each rerun dying at the next: "
        + "; ".join(seen)
        + ": each time the lock held by the attempt (a higher fencing token each take), no node down but where the "
        "journal says, 0 bytes lost; the last rerun waited out the lease and resumed to done, the lock free"
    )
    ROWS.append(
        f"controller failover mid-repair (node {failed_over['controller_before']} restarted right after node "
        f"{STRAY_NODE}'s start, in the last rerun; epoch {failed_over['epoch_before']} -> "
        f"{failed_over['epoch_after']}, leader {failed_over['controller_after']}): the gates followed it, done"
    )
    # and the restore on KRaft: the same lock, gates and order; the repair's backups put back on node 3
    s, inv = ctx["settings"], ctx["inv"]
    controller = KraftCluster(inv, controller_connect).controller()
    restore_plan = restore_tasks.make_restore_plan(s, {"plan": plan.hash, "attempt": attempt}, controller)
    params = {"healthy_polls": 2, "poll_interval_s": 0.5, "isr_timeout_s": 60, "timeout_s": 60}
    restored = restore_tasks.restore_backup(
        s, restore_plan, params, f"restore-{attempt}", ssh_connect(inv), connect_controller=controller_connect
    )
    assert restored["status"] == "done" and restored["lock_released"] is True, restored
    assert restored["lock"] == ctx["state"].cluster_id and lock_record(ctx) is None
    repair_journal = json.loads((attempt_dir(ctx, plan, attempt) / layout.JOURNAL).read_text())
    assert repair_journal["status"] == "restored" and repair_journal["brokers"][str(VICTIM)]["state"] == "pending"
    fleet.wait_healthy(ctx["state"], timeout=60)
    ROWS.append(
        f"the restore of that attempt (the KRaft lock, gates and order): node {VICTIM}'s backups put back, done, "
        "the lock free"
    )


def test_a_voter_lost_mid_repair_holds_the_next_voter_at_the_quorum_gate(ctx: dict[str, Any]) -> None:
    plan = planned(ctx)
    assert plan.restart_order == [VICTIM, STRAY_NODE]
    state = ctx["state"]
    stops = len([e for e in fleet.broker_events(state)[STRAY_NODE] if e["event"] == "stop-requested"])

    class VoterLost(Executor):
        def precheck(self, b: BrokerPlan, host: BrokerHost) -> str:
            if b.broker_id == STRAY_NODE:
                fleet.kill_sshd(state, 1)  # node 1's host gone: it cannot be read
            return super().precheck(b, host)

    attempt = "kraft-voter-lost"
    quick = dataclasses.replace(GATES, isr_timeout_s=15.0)  # how long the quorum gate waits before the halt
    try:
        with pytest.raises(RepairError, match=f"quorum gate before broker {STRAY_NODE} did not pass"):
            run(ctx, plan, attempt, VoterLost, quick)
        journal = json.loads((attempt_dir(ctx, plan, attempt) / layout.JOURNAL).read_text())
        assert journal["status"] == "halted" and journal["brokers"][str(VICTIM)]["state"] == "done"
        assert journal["brokers"][str(STRAY_NODE)]["state"] == "pending"  # never got past its pre-check
        now = len([e for e in fleet.broker_events(state)[STRAY_NODE] if e["event"] == "stop-requested"])
        assert now == stops and fleet.running_pid(state.broker(STRAY_NODE).config()) is not None
        held = lock_record(ctx)  # node 3's files changed: the lock stays for a human (or the rerun)
        assert held is not None and held["holder"]["run_id"] == attempt
        why = journal["brokers"][str(STRAY_NODE)]["failed"]
        assert "controller 1" in why and "cannot connect" in why, why
        assert lost_files(ctx["originals"], attempt_dir(ctx, plan, attempt), quarantined(ctx)) == []
    finally:
        fleet.start_sshd(state, 1)
    ROWS.append(
        f"a voter lost mid-repair (node 1 unreachable before node {STRAY_NODE}): the quorum gate held node "
        f"{STRAY_NODE} (never stopped), halted with the lock kept for a human, 0 bytes lost"
    )
