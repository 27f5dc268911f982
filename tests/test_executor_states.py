"""The executor's resume rules, in milliseconds: every journaled state × every failure point, on fakes of the broker
host and the cluster (tests/harness/fakes.py, checked against the real ones by tests/test_fakes_contract.py).

For each row the first run meets one fault while broker 1 (restarted first; broker 2, the controller, last) is in one
step: a command that fails, a check that fails, the worker dying (SIGKILL: the journal as it was on disk), or the
lock's fence lost. The row says what must happen: the error raised, the step the journal says was completed last,
whether the broker is journaled as failed and as changing, whether it is running, and whether the cluster lock stays
for a human (``Journal.keeps_lock``, what ``session.cluster_lock`` asks at the end). Then the same attempt runs again
without the fault and must end done: every planned file changed, no data lost (each original either untouched or in
a verified backup of the attempt), the stop sent again only when the run had not got past its backup's change.
"""

from __future__ import annotations

import dataclasses
import hashlib
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowTaskTimeout

from fleet_doctor.inventory import Inventory
from fleet_doctor.remote import RemoteError
from fleet_doctor.repair import backups
from fleet_doctor.repair import journal as journal_module
from fleet_doctor.repair.errors import FenceLost, RepairError
from fleet_doctor.repair.executor import Executor
from fleet_doctor.repair.gates import Gates
from fleet_doctor.repair.journal import ORDER, Journal, State
from fleet_doctor.repair.plan import BrokerPlan, FileAction, Plan
from harness.fakes import Crash, FakeCluster, FakeFleet, FakePartition, fake_hosts

LOG_DIR = "/var/lib/kafka/data"
GATES = Gates(
    stop_timeout_s=1,
    start_timeout_s=1,
    healthy_polls=2,
    poll_interval_s=0.001,
    # long enough for two healthy polls on a loaded machine (0.05 s failed once, the suite's workers busy); only a
    # broker that never comes back waits it out
    isr_timeout_s=1.0,
    pause_between_brokers_s=0,
    progress_every_s=0,
)


def path(topic_partition: str, name: str) -> str:
    return f"{LOG_DIR}/{topic_partition}/{name}"


INDEX = path("t-0", "00000000000000000000.index")
PLANNED = {
    1: [
        ("remove", path("t-0", "leader-epoch-checkpoint")),
        ("remove", path("t-0", "partition.metadata")),
        ("quarantine", INDEX),
    ],
    2: [("remove", path("t-1", "leader-epoch-checkpoint")), ("remove", path("t-1", "partition.metadata"))],
}


def make_plan() -> Plan:
    brokers = []
    for bid, actions in PLANNED.items():
        acts = tuple(
            FileAction(a, p, "topic-id-mismatch", "t", int(p.split("/t-")[1].split("/")[0]), "why") for a, p in actions
        )
        brokers.append(BrokerPlan(bid, bid == 2, True, acts))
    return Plan("unit", "run1", {}, tuple(brokers), (), ())


def make_fleet() -> FakeFleet:
    files = {bid: {p: f"{bid}:{p}".encode() for _, p in actions} for bid, actions in PLANNED.items()}
    parts = [FakePartition("t", n, [1, 2], [1, 2], 1 + n) for n in (0, 1)]
    return FakeFleet(files, parts, controller=2)


def inventory() -> Inventory:
    from fleet_doctor import inventory as inv

    def broker(bid: int) -> dict[str, Any]:
        entry = {"id": bid, "host": "127.0.0.1", "ssh_port": 22, "ssh_user": "k", "ssh_key_file": "/k"}
        entry |= {"host_key": "ssh-ed25519 AAAA", "log_dirs": [LOG_DIR], "kafka_version": "3.6.2"}
        return entry | {"service": {"stop": "stop", "start": "start", "status": "status"}}

    data = {"inventory_version": 1, "cluster": "unit", "zookeeper": "h:2181/kafka", "brokers": [broker(1), broker(2)]}
    return inv.parse(data)


def verified(fleet: FakeFleet) -> Callable[..., list[str]]:
    """The post-verify: every planned file is changed on the fake broker (its fault: ``(bid, "verify")``)."""

    def check(host: Any, b: BrokerPlan, stage: Callable[[str], None]) -> list[str]:
        fleet.fault(b.broker_id, "verify")
        return [f"{a.path} still there" for a in b.actions if a.path in fleet.brokers[b.broker_id]]

    return check


def executor(plan: Plan, fleet: FakeFleet, where: Path) -> Executor:
    def fence() -> None:
        fleet.fault(0, "fence")
        if fleet.session_lost:
            raise FenceLost("the ZooKeeper session this repair locked the cluster with was lost")

    ex = Executor(
        plan, where, inventory(), fake_hosts(fleet), FakeCluster(fleet), GATES, fence=fence, post_verify=verified(fleet)
    )
    fleet.journal = ex.journal.path
    return ex


FAIL = RemoteError("broker 1: `command` exited 1: no")
TIMEOUT = AirflowTaskTimeout("Timeout, PID: 4242")  # an execution_timeout (or a cluster policy's) mid-step
LOST = FenceLost("the ZooKeeper session this repair locked the cluster with was lost")


@dataclasses.dataclass(frozen=True)
class Row:
    """One fault and what must follow it."""

    fault: tuple[int, str]
    what: Any  # the exception raised at the fault, or "crash"
    raised: type[BaseException]
    completed: State  # broker 1's last completed step, as the journal says after the first run
    failed: bool  # journaled as failed (a crash journals nothing)
    changing: bool  # a file of it may have changed
    running: bool  # broker 1 runs after the first run
    lock_kept: bool  # a human must look first (Journal.keeps_lock; a dead worker's lock always stays)
    stops_again: bool  # the rerun sends broker 1 a stop again
    rejoins: bool = True  # broker 1 comes back in ISR after its start


ROWS = {
    # the pre-check: the host is not this broker, or the worker dies there
    "precheck: identity refused": Row(
        (1, "identity"), FAIL, RepairError, State.PENDING, True, False, True, False, True
    ),
    "precheck: worker killed": Row((1, "identity"), "crash", Crash, State.PENDING, False, False, True, True, True),
    # the change's user cannot change the planned dirs (a non-root SSH user, no kafka_user): refused before the stop
    "precheck: the change's user cannot change the files": Row(
        (1, "can_change"),
        RepairError("broker 1: the change cannot run as the SSH user kafka-doctor: refused"),
        RepairError,
        State.PENDING,
        True,
        False,
        True,
        False,
        True,
    ),
    "precheck: fence lost": Row((0, "fence#1"), LOST, FenceLost, State.PENDING, False, False, True, True, True),
    # the stop: the command fails before it reaches the broker; or the broker stops and the worker dies then
    # (a failed stop command may have taken all the same: a wrapper's timeout, a session that broke mid-command; the
    # broker still runs, so it is journaled as may be left stopping and the lock stays)
    "stop: command fails": Row((1, "stop"), FAIL, RepairError, State.PRECHECKED, True, False, True, True, True),
    "stop: killed after": Row((1, "stop:after"), "crash", Crash, State.PRECHECKED, False, False, False, True, True),
    "stop: fence lost": Row((0, "fence#2"), LOST, FenceLost, State.PRECHECKED, False, False, True, True, True),
    # the lock's session expires while the stop is awaited: nothing journaled, nothing started, the lock left alone
    "stop: session expired in the wait": Row(
        (1, "stop:after"), "session-expired", FenceLost, State.PRECHECKED, False, False, False, True, True
    ),
    # Airflow's execution_timeout fires once the broker is down: it is started again before the task ends
    "stop: task timeout": Row(
        (1, "stop:after"), TIMEOUT, AirflowTaskTimeout, State.PRECHECKED, True, False, True, False, True
    ),
    # the repairs volume fills up right after the stop: the broker is started again, and the journal on disk (which
    # says the stop was issued) keeps the lock: it is behind what happened
    "stop: journal volume full": Row(
        (1, "stop:after"), "disk-full", RepairError, State.PRECHECKED, False, False, True, True, True
    ),
    # a controlled shutdown slower than the plan's stop_timeout_s: still running when the gate ends, so it is not
    # started, not counted as up, and the lock stays
    "stop: slower than its gate": Row(
        (1, "stop"), "slow-stop", RepairError, State.PRECHECKED, True, False, True, True, True
    ),
    # the same with a stop command that blocks through the shutdown (systemctl stop): it does not return in time; the
    # broker still runs, yet its stop did take: not "running, its stop never took" with the lock released
    "stop: its command blocks past its gate": Row(
        (1, "stop"), "slow-stop-blocks", RepairError, State.PRECHECKED, True, False, True, True, True
    ),
    # the backup: tar fails; the tarball made, not fetched; taken and fetched, not journaled
    "backup: tar fails": Row((1, "backup"), FAIL, RepairError, State.STOPPED, True, False, True, False, True),
    "backup: task timeout": Row(
        (1, "backup"), TIMEOUT, AirflowTaskTimeout, State.STOPPED, True, False, True, False, True
    ),
    "backup: killed before fetch": Row((1, "fetched"), "crash", Crash, State.STOPPED, False, False, False, True, True),
    "backup: killed after": Row((1, "backup:after"), "crash", Crash, State.STOPPED, False, False, False, True, True),
    # the change: its first file fails; the first file removed, then the worker dies; the broker started by someone
    "change: first file fails": Row((1, "remove"), FAIL, RepairError, State.BACKED_UP, True, True, False, True, False),
    "change: killed mid-change": Row(
        (1, "remove:after"), "crash", Crash, State.BACKED_UP, False, True, False, True, False
    ),
    "change: host refused": Row((1, "identity#2"), FAIL, RepairError, State.BACKED_UP, True, False, True, False, True),
    "change: fence lost": Row((0, "fence#4"), LOST, FenceLost, State.BACKED_UP, False, False, False, True, True),
    # the start: the command fails; the broker started, the worker dies
    "start: command fails": Row((1, "start"), FAIL, RepairError, State.CHANGED, True, True, False, True, False),
    "start: killed after": Row((1, "start:after"), "crash", Crash, State.CHANGED, False, True, True, True, False),
    # the health gates: the broker never comes back in ISR; the worker dies polling
    "healthy: never in ISR": Row(
        (9, "none"), None, RepairError, State.STARTED, True, True, True, True, False, rejoins=False
    ),
    "healthy: session expired in the ISR wait": Row(
        (0, "partitions#4"), "session-expired", FenceLost, State.STARTED, False, True, True, True, False
    ),
    "healthy: killed polling": Row((0, "partitions#3"), "crash", Crash, State.STARTED, False, True, True, True, False),
    # the post-verify: a touched file is not right; the worker dies in it
    "verify: a file not right": Row(
        (1, "verify"), RepairError("post-verify: no"), RepairError, State.HEALTHY, True, True, True, True, False
    ),
    "verify: killed": Row((1, "verify"), "crash", Crash, State.HEALTHY, False, True, True, True, False),
    "verify: fence lost": Row((0, "fence#7"), LOST, FenceLost, State.HEALTHY, False, True, True, True, False),
}


def originals(fleet: FakeFleet) -> dict[tuple[int, str], bytes]:
    return {(b, p): data for b, files in fleet.brokers.items() for p, data in files.items()}


def lost(before: dict[tuple[int, str], bytes], fleet: FakeFleet, journal: Journal, where: Path) -> list[str]:
    """Planned files whose original bytes are neither on the fake broker nor in a verified backup of the attempt."""
    held: dict[str, set[str]] = {}
    for b in (1, 2):
        for bk in journal.backups(b):
            tarball = where / bk["tarball"]
            if tarball.is_file() and backups.sha256_file(tarball) == bk["sha256"]:
                with tarfile.open(tarball) as tar:
                    for m in tar:
                        f = tar.extractfile(m)
                        assert f is not None
                        held.setdefault("/" + m.name, set()).add(hashlib.sha256(f.read()).hexdigest())
    out = []
    for (b, p), data in before.items():
        now = fleet.brokers[b].get(p)
        if now != data and hashlib.sha256(data).hexdigest() not in held.get(p, set()):
            out.append(p)
    return out


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_every_state_and_failure_point(row: Row, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan, fleet = make_plan(), make_fleet()
    write = journal_module.write_atomic
    monkeypatch.setattr(journal_module, "write_atomic", lambda p, data: write(p, data) if fleet.write(p) else None)
    before = originals(fleet)
    fleet.rejoins = row.rejoins
    if row.what is not None:
        fleet.faults[row.fault] = row.what
    first = executor(plan, fleet, tmp_path)
    with pytest.raises(row.raised):
        first.run()
    if row.what == "crash":
        fleet.crash_journal()  # a SIGKILL'd worker's handlers never ran: the journal is what it had saved
    assert first.journal.keeps_lock() is None or row.lock_kept  # what the worker itself decides at the end
    journal = Journal(tmp_path / "journal.json", plan)
    assert journal.completed(1) == row.completed, journal.broker(1)["history"]
    assert bool(journal.broker(1).get("failed")) == row.failed
    assert journal.changing(1) == row.changing
    assert (1 in fleet.running) == row.running
    fenced = isinstance(row.what, FenceLost) or row.what == "session-expired"
    kept = row.what == "crash" or fenced or journal.keeps_lock() is not None
    assert kept == row.lock_kept, journal.keeps_lock()
    assert journal.completed(2) == State.PENDING and 2 in fleet.running  # the controller, last, untouched
    if not row.running:  # down: the journal says so (a step after the stop, before the start), or why it was left so
        by_attempt = ORDER.index(State.STOPPED) <= ORDER.index(journal.completed(1)) < ORDER.index(State.STARTED)
        stopped_by_crash = row.what == "crash"  # killed right after the stop, before the journal said it
        assert by_attempt or stopped_by_crash or journal.left_down(1), journal.broker(1)
    assert lost(before, fleet, journal, tmp_path) == []

    # the same attempt again (the task cleared), nothing failing now
    fleet.revive()
    fleet.rejoins = True
    fleet.calls.clear()
    again = executor(plan, fleet, tmp_path)
    result = again.run()
    assert result["status"] == "done" and all(b["state"] == "done" for b in result["brokers"].values())
    assert ((1, "stop") in fleet.calls) == row.stops_again
    for b, actions in PLANNED.items():
        assert not {p for _, p in actions} & set(fleet.brokers[b]), fleet.brokers[b]
    assert any(p.startswith(f"{LOG_DIR}/t-0/fleet-doctor-quarantine/{plan.hash[:16]}/") for p in fleet.brokers[1])
    assert lost(before, fleet, again.journal, tmp_path) == []
    assert fleet.running == {1, 2} and again.journal.keeps_lock() is None


def test_the_table_covers_every_step_and_every_kind_of_fault() -> None:
    """Each step the executor journals meets a failing call and a dead worker; the fence falls between steps."""
    steps = {str(r.completed) for r in ROWS.values()}
    assert steps == {str(s) for s in State if s not in (State.VERIFIED, State.DONE, State.FAILED)}
    for state in steps:
        kinds = {
            "crash" if r.what == "crash" else type(r.what).__name__ if r.what is not None else "a check"
            for r in ROWS.values()
            if r.completed == state
        }
        assert "crash" in kinds and kinds - {"crash", "FenceLost"}, (state, kinds)


def test_a_dry_run_writes_nothing_and_stops_nothing(tmp_path: Path) -> None:
    plan, fleet = make_plan(), make_fleet()
    before = {b: dict(files) for b, files in fleet.brokers.items()}
    ex = executor(plan, fleet, tmp_path)
    ex.dry_run = True
    assert ex.run()["status"] == "done"
    assert fleet.brokers == before and fleet.running == {1, 2}
    assert not [c for c in fleet.calls if c[1] in ("stop", "start", "backup", "remove", "quarantine")]
    assert not list(tmp_path.glob("broker-*"))


def test_the_controller_of_the_moment_goes_last(tmp_path: Path) -> None:
    """The plan says 1 then 2 (the controller); the controller moves to 1 before the first stop: 2 goes first."""
    plan, fleet = make_plan(), make_fleet()
    fleet.controller = 1
    ex = executor(plan, fleet, tmp_path)
    assert ex.run()["status"] == "done"
    stops = [b for b, op in fleet.calls if op == "stop"]
    assert stops == [2, 1]


# ---- KRaft: the voters after the brokers, the active controller last, each behind the quorum gate
class QuorumCluster(FakeCluster):
    """The fake fleet as a KRaft cluster: ``voters`` are quorum members; ``refusals`` per node, polled in turn
    (``None``: the quorum gate passes)."""

    def __init__(self, fleet: FakeFleet, voters: set[int], refusals: dict[int, list[str | None]]) -> None:
        super().__init__(fleet)
        self._voters, self.refusals, self.asked = frozenset(voters), refusals, []

    def voters(self) -> frozenset[int]:
        return self._voters

    def restart_refusal(self, node_id: int) -> str | None:
        self.asked.append(node_id)
        left = self.refusals.get(node_id) or [None]
        return left.pop(0) if len(left) > 1 else left[0]


def test_on_kraft_the_voters_go_after_the_brokers_each_once_its_quorum_gate_passes(tmp_path: Path) -> None:
    fleet = make_fleet()
    fleet.controller = 1  # node 1: a voter, the active controller; node 2: a broker only
    cluster = QuorumCluster(fleet, {1}, {1: ["node 3 behind", None]})
    ex = Executor(make_plan(), tmp_path, inventory(), fake_hosts(fleet), cluster, GATES, post_verify=verified(fleet))
    assert ex.run()["status"] == "done"
    stops = [b for b, op in fleet.calls if op == "stop"]
    assert stops == [2, 1]  # the broker first, then the voter (the active controller) last, against plan order
    assert cluster.asked.count(1) >= 2  # node 1 waited until its gate passed
    detail = ex.journal.data["brokers"]["1"]["history"][0]["detail"]
    assert "the quorum keeps a caught-up majority without this voter" in detail


def test_a_quorum_gate_that_never_passes_halts_before_the_stop_with_the_reason(tmp_path: Path) -> None:
    fleet = make_fleet()
    cluster = QuorumCluster(fleet, {1, 2}, {1: ["1 of the other 1 voter(s) caught up, 2 needed"]})
    ex = Executor(make_plan(), tmp_path, inventory(), fake_hosts(fleet), cluster, GATES, post_verify=verified(fleet))
    within = f"{GATES.isr_timeout_s:.0f} s"
    with pytest.raises(RepairError, match=rf"quorum gate before broker 1 did not pass within {within}: 1 of the other"):
        ex.run()
    assert not [c for c in fleet.calls if c[1] == "stop"]  # nothing stopped, nothing changed
    assert ex.journal.keeps_lock() is None and ex.journal.data["brokers"]["1"]["state"] == "pending"
