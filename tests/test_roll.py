"""The roll's executor (``repair.roll.RollExecutor``) on the unit tier, over the fakes of a broker's host and of the
cluster (``harness.fakes``, checked against the real ones by ``tests/test_fakes_contract.py``): batches stop and start
together, min ISR is kept at every moment, each broker leads its preferred partitions again before the next goes,
a broker recovering its logs is waited for and one that failed is not, the controller of the moment goes last, a
failure starts the batch's other brokers again, and a rerun resumes."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor.inventory import Inventory
from fleet_doctor.remote import RemoteError
from fleet_doctor.repair import approval_text
from fleet_doctor.repair.broker import parse_broker_state, parse_election
from fleet_doctor.repair.errors import RepairError
from fleet_doctor.repair.gates import Gates
from fleet_doctor.repair.journal import State
from fleet_doctor.repair.plan import Plan, RestartPreview
from fleet_doctor.repair.roll import RollExecutor
from fleet_doctor.repair.roll_plan import (
    DOWN_FIRST,
    LEADERSHIP_OFF,
    LEADERSHIP_VIA_TOOL,
    LEADERSHIP_VIA_ZOOKEEPER,
    StepTimes,
    build_roll_plan,
    leadership_balance,
    measure_recovery,
    measure_steps,
    recovery_bytes,
)
from fleet_doctor.roll_status import HELD, MIN_ISR, UNDER_REPLICATED, Control, RollStatus
from harness.fakes import Crash, FakeCluster, FakeFleet, FakePartition, fake_hosts

GATES = Gates(
    stop_timeout_s=1,
    start_timeout_s=0.05,
    healthy_polls=2,
    poll_interval_s=0.001,
    isr_timeout_s=0.2,
    pause_between_brokers_s=0,
    progress_every_s=0,
    blocked_timeout_s=0.05,
)
BROKERS = list(range(1, 7))


class WatchedFleet(FakeFleet):
    """A fake fleet that records, after every stop and start, the fewest in-sync replicas any partition has left
    compared with its min ISR, and who leads what: the benchmark's two measures, at every moment."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.below_min_isr: list[str] = []
        self.events: list[tuple[str, int]] = []

    def _watch(self) -> None:
        for p in self.partitions:
            live = [r for r in p.isr if r in self.registered()]
            if len(live) < p.min_isr:
                self.below_min_isr.append(f"{p.topic}-{p.partition} ISR {live}")

    def stop(self, broker_id: int) -> None:
        super().stop(broker_id)
        self.events.append(("stop", broker_id))
        self._watch()

    def start(self, broker_id: int) -> None:
        super().start(broker_id)
        self.events.append(("start", broker_id))


def make_fleet(controller: int = 1) -> WatchedFleet:
    """6 brokers in 3 racks, RF 3, min ISR 2, every partition on 3 consecutive brokers (so across racks)."""
    racks = {b: f"rack-{(b - 1) % 3}" for b in BROKERS}
    parts = []
    for n in range(12):
        replicas = [BROKERS[(n + k) % 6] for k in range(3)]
        parts.append(FakePartition("t", n, replicas, list(replicas), replicas[0], min_isr=2))
    return WatchedFleet({b: {} for b in BROKERS}, parts, controller=controller, racks=racks)


def inventory(brokers: list[int] = BROKERS) -> Inventory:
    from fleet_doctor import inventory as inv

    def broker(bid: int) -> dict[str, Any]:
        entry = {"id": bid, "host": "127.0.0.1", "ssh_port": 22, "ssh_user": "k", "ssh_key_file": "/k"}
        entry |= {"host_key": "ssh-ed25519 AAAA", "log_dirs": ["/var/lib/kafka"], "kafka_version": "3.6.2"}
        return entry | {"service": {"stop": "stop", "start": "start", "status": "status"}}

    data = {
        "inventory_version": 1,
        "cluster": "unit",
        "zookeeper": "h:2181/kafka",
        "brokers": [broker(b) for b in brokers],
    }
    return inv.parse(data)


def roll_plan(fleet: FakeFleet, batched: bool, **kw: Any) -> Plan:
    cluster = FakeCluster(fleet)
    plan = build_roll_plan(
        "unit",
        BROKERS,
        reason={"kind": "os-patch", "text": "kernel"},
        partitions=cluster.partitions(),
        racks=cluster.racks(),
        controller=fleet.controller,
        down=set(BROKERS) - cluster.registered(),
        batched=batched,
        isr_wait_s=1,
        pause_s=0,
        **{"leadership": {"via": LEADERSHIP_VIA_TOOL}, "recovery_bytes_per_s": 1e8, **kw},
    )
    return plan


def executor(plan: Plan, fleet: FakeFleet, where: Path, gates: Gates = GATES) -> RollExecutor:
    ex = RollExecutor(plan, where, inventory(), fake_hosts(fleet), FakeCluster(fleet), gates)
    fleet.journal = ex.journal.path
    return ex


def test_one_at_a_time_each_broker_leads_its_partitions_again_before_the_next(tmp_path: Path) -> None:
    fleet = make_fleet()
    plan = roll_plan(fleet, batched=False)
    ex = executor(plan, fleet, tmp_path, gates=dataclasses.replace(GATES, leadership_timeout_s=0.5))
    done = ex.run()
    assert done["status"] == "done"
    assert all(b["state"] == State.DONE for b in done["brokers"].values())
    stops = [b for what, b in fleet.events if what == "stop"]
    assert stops == [2, 3, 4, 5, 6, 1]  # the controller last
    assert fleet.below_min_isr == []
    # after each broker, exactly its preferred partitions (the ones it lost when it stopped) were elected back
    assert [sorted({p for _t, p in e}) for e in fleet.elections] == [
        [p.partition for p in fleet.partitions if p.replicas[0] == b] for b in stops
    ]
    assert leadership_balance(FakeCluster(fleet).partitions())["not_preferred"] == 0
    assert "leads 2/2 of its preferred partitions again" in done["brokers"]["3"]["history"][-2]["detail"]


def test_batched_rack_by_rack_the_batch_stops_and_starts_together_and_min_isr_holds(tmp_path: Path) -> None:
    fleet = make_fleet(controller=1)
    plan = roll_plan(fleet, batched=True)
    assert [b["brokers"] for b in plan.scope["batches"]] == [[4], [2, 5], [3, 6], [1]]
    done = executor(plan, fleet, tmp_path).run()
    assert done["status"] == "done"
    kinds = [(what, b) for what, b in fleet.events]
    # brokers 2 and 5 both stopped before either started
    assert kinds.index(("stop", 5)) < kinds.index(("start", 2))
    assert kinds.index(("stop", 2)) < kinds.index(("start", 5))
    assert fleet.below_min_isr == []
    assert leadership_balance(FakeCluster(fleet).partitions())["not_preferred"] == 0


def test_the_batch_gate_refuses_a_batch_that_shares_a_partition_since_the_plan(tmp_path: Path) -> None:
    fleet = make_fleet(controller=1)
    plan = roll_plan(fleet, batched=True)
    moved = next(p for p in fleet.partitions if 4 not in p.replicas)
    moved.replicas = moved.isr = [2, 5, 3]  # reassigned since the plan: brokers 2 and 5 now share it
    with pytest.raises(RepairError, match=r"brokers 2, 5 share partition\(s\) now"):
        executor(plan, fleet, tmp_path).run()
    assert {b for _, b in fleet.events} == {4}  # the batch before it rolled; this one stopped nothing


def test_the_batch_gate_counts_the_margin_with_the_whole_batch_stopped(tmp_path: Path) -> None:
    fleet = make_fleet(controller=1)
    planned = roll_plan(fleet, batched=True)
    # the approver asked for one in-sync replica to spare: a batch of two may leave every partition min ISR + 1
    plan = Plan(planned.cluster, "", {**planned.scope, "isr_margin": 1}, planned.brokers, (), (), planned.risk)
    with pytest.raises(RepairError, match=r"stopping brokers 2, 5 would take below min ISR \+ margin 1"):
        executor(plan, fleet, tmp_path).run()
    assert {b for what, b in fleet.events if what == "stop"} == {4}  # the single broker before it: no margin
    assert fleet.below_min_isr == []


def test_a_broker_running_without_its_registration_is_never_stopped(tmp_path: Path) -> None:
    """A broker recovering its logs (a rerun while it recovers; a KRaft node fenced but running) is down for the
    cluster but not for its host: the roll starts it first with the others down, never stops it, and waits for it."""
    fleet = make_fleet()
    fleet.recovering[3] = 20  # started by someone, recovering: running, not registered, out of every ISR
    for p in fleet.partitions:
        p.isr = [r for r in p.isr if r != 3]
        if p.leader == 3:
            p.leader = p.isr[0]
    plan = roll_plan(fleet, batched=True)
    assert plan.scope["batches"][0] == {"brokers": [3], "why": DOWN_FIRST}
    done = executor(plan, fleet, tmp_path).run()
    assert done["status"] == "done"
    assert (3, "stop") not in fleet.calls
    stopped = next(h for h in done["brokers"]["3"]["history"] if h["state"] == State.STOPPED)
    assert stopped["detail"].startswith("not stopped: its process runs without its /brokers/ids entry"), stopped
    assert fleet.below_min_isr == []


def test_a_failed_poll_while_a_batch_stops_keeps_its_brokers_counted_down(tmp_path: Path) -> None:
    """Broker 5's controlled shutdown takes its time (it still runs, registered) when the status poll of broker 2
    fails: neither may count as up again, and the lock stays for a human."""
    fleet = make_fleet(controller=1)
    plan = roll_plan(fleet, batched=True)
    fleet.faults[(5, "stop")] = "slow-stop"
    fleet.faults[(2, "status")] = RemoteError("broker 2: `status` could not run: EOFError")  # in the batch [2, 5]
    with pytest.raises(RepairError):
        executor(plan, fleet, tmp_path).run()
    journal = executor(plan, fleet, tmp_path).journal
    assert journal.left_down(5), journal.broker(5)
    assert journal.keeps_lock()


def test_a_recovering_broker_is_waited_for_past_its_start_timeout(tmp_path: Path) -> None:
    fleet = make_fleet()
    fleet.recovery_polls[3] = 60  # 60 polls of RECOVERY: longer than start_timeout_s
    plan = roll_plan(fleet, batched=False)
    done = executor(plan, fleet, tmp_path).run()
    assert done["status"] == "done"
    started = next(h for h in done["brokers"]["3"]["history"] if h["state"] == State.STARTED)
    assert "of it recovering its logs" in started["detail"]


def test_a_broker_not_registering_and_not_recovering_fails_and_the_roll_halts(tmp_path: Path) -> None:
    fleet = make_fleet()
    fleet.recovery_polls[3] = 60
    fleet.broker_states = False  # the inventory has no broker_state command: no way to tell recovery
    plan = roll_plan(fleet, batched=False)
    with pytest.raises(RepairError, match="did not register within"):
        executor(plan, fleet, tmp_path).run()
    journal = executor(plan, fleet, tmp_path).journal
    assert journal.state(3) == State.FAILED
    assert journal.completed(4) == State.PENDING  # the next broker never stopped


def test_a_failure_in_a_batch_starts_its_other_brokers_again(tmp_path: Path) -> None:
    fleet = make_fleet(controller=1)
    plan = roll_plan(fleet, batched=True)
    fleet.faults[(5, "start")] = RepairError("broker 5: start refused")
    with pytest.raises(RepairError, match="start refused"):
        executor(plan, fleet, tmp_path).run()
    assert {2, 5} <= fleet.running
    journal = executor(plan, fleet, tmp_path).journal
    assert journal.state(5) == State.FAILED and not journal.left_down(2) and not journal.left_down(5)


def test_a_worker_killed_mid_batch_resumes_where_it_died(tmp_path: Path) -> None:
    fleet = make_fleet(controller=1)
    plan = roll_plan(fleet, batched=True)
    fleet.faults[(5, "stop:after")] = "crash"
    with pytest.raises(Crash):
        executor(plan, fleet, tmp_path).run()
    fleet.crash_journal()
    journal = executor(plan, fleet, tmp_path).journal
    assert journal.left_down(2) and journal.left_down(5)  # the stops were journaled as issued
    fleet.revive()
    before = len(fleet.events)
    done = executor(plan, fleet, tmp_path).run()
    assert done["status"] == "done"
    again = [b for what, b in fleet.events[before:] if what == "stop"]
    assert again.count(4) == 0  # finished before the crash: never repeated
    assert fleet.below_min_isr == []


def test_the_controller_moving_into_an_early_batch_is_deferred_to_the_end(tmp_path: Path) -> None:
    fleet = make_fleet(controller=1)
    plan = roll_plan(fleet, batched=True)
    fleet.controller = 5  # moved since the plan, into batch [2, 5]
    done = executor(plan, fleet, tmp_path).run()
    assert done["status"] == "done"
    stops = [b for what, b in fleet.events if what == "stop"]
    assert stops[-1] == 5 and stops.index(5) > stops.index(3)
    assert done["brokers"]["5"]["deferred"]


@pytest.mark.parametrize("via", [LEADERSHIP_VIA_ZOOKEEPER, LEADERSHIP_OFF])
def test_leadership_through_zookeeper_or_not_at_all(tmp_path: Path, via: str) -> None:
    fleet = make_fleet()
    plan = roll_plan(fleet, batched=False, leadership={"via": via, "why": "the inventory has no leader_election"})
    done = executor(plan, fleet, tmp_path).run()
    assert done["status"] == "done"
    balance = leadership_balance(FakeCluster(fleet).partitions())
    if via == LEADERSHIP_OFF:
        assert balance["not_preferred"] > 0
        assert "leadership not moved back: the inventory has no leader_election" in str(done["brokers"]["2"])
    else:
        assert balance["not_preferred"] == 0 and ("0", "elect") in [(str(b), op) for b, op in fleet.calls]


def test_a_partition_that_cannot_move_back_is_said_and_the_roll_goes_on(tmp_path: Path) -> None:
    fleet = make_fleet()
    plan = roll_plan(fleet, batched=False)
    stuck = next(p for p in fleet.partitions if p.replicas[0] == 2)
    stuck.min_isr = 1
    original = fleet.catch_up

    def catch_up() -> None:  # broker 2's replica of ``stuck`` never catches up again
        original()
        stuck.isr = [r for r in stuck.isr if r != 2] if 2 not in fleet.stopping else stuck.isr

    fleet.catch_up = catch_up  # type: ignore[method-assign]
    ex = executor(plan, fleet, tmp_path, gates=dataclasses.replace(GATES, leadership_timeout_s=0.05))
    ex.cluster.problems = lambda *a, **k: []  # type: ignore[method-assign]
    done = ex.run()
    assert done["status"] == "done"
    left = done["brokers"]["2"]["leadership_left"]
    assert any(f"t-{stuck.partition}: its preferred replica 2 is not in ISR" in x for x in left), left


def test_a_finished_roll_measures_its_step_times_for_the_next_prediction(tmp_path: Path) -> None:
    fleet = make_fleet()
    fleet.running.discard(4)  # down already: rolled first, its stop took nothing and is not measured
    for p in fleet.partitions:
        p.isr = [r for r in p.isr if r != 4]
        if p.leader == 4:
            p.leader = p.isr[0]
    plan = roll_plan(fleet, batched=False)
    assert plan.scope["batches"][0] == {"brokers": [4], "why": DOWN_FIRST}
    done = executor(plan, fleet, tmp_path).run()
    measured = measure_steps(done, plan.hash)
    assert measured is not None and measured["brokers"] == 5 and measured["roll"] == plan.hash
    assert set(measured) >= {"stop_s", "start_s", "healthy_s", "election_s"}
    times = StepTimes.measured(measured)
    assert times.healthy_s == measured["healthy_s"] and times.source.startswith(f"measured on roll {plan.hash[:12]}")
    again = roll_plan(fleet, batched=False, times=times)
    assert again.risk["predicted"]["step_times_source"] == times.source
    assert again.risk["predicted"]["one_at_a_time_s"] < plan.risk["predicted"]["one_at_a_time_s"]
    assert StepTimes.measured(None) == StepTimes()


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("BrokerState=RECOVERY remainingLogsToRecover=3 remainingSegmentsToRecover=17\n", ("RECOVERY", 3, 17)),
        ("RUNNING\n", ("RUNNING", None, None)),
        ("2\n", ("RECOVERY", None, None)),
        (  # a Jolokia read of the gauge
            '{"request":{"mbean":"kafka.server:name=BrokerState,type=KafkaServer","type":"read"},"value":3,'
            '"timestamp":1795970000,"status":200}',
            ("RUNNING", None, None),
        ),
        ("BrokerState=NOT_RUNNING\n", ("NOT_RUNNING", None, None)),
        ("something else entirely", ("UNKNOWN", None, None)),
        ("jolokia: connection to 127.0.0.1:8778 refused after 2 tries", ("UNKNOWN", None, None)),
        ("BrokerState: 6\n", ("PENDING_CONTROLLED_SHUTDOWN", None, None)),
    ],
)
def test_the_broker_state_is_read_from_what_the_inventory_command_prints(text: str, state: tuple[Any, ...]) -> None:
    got = parse_broker_state(text)
    assert (got.name, got.remaining_logs, got.remaining_segments) == state
    assert got.recovering is (state[0] == "RECOVERY")


def test_the_election_tools_output_is_read_per_partition() -> None:
    out = (
        "Successfully completed leader election (PREFERRED) for partitions orders-0, my.topic-12\n"
        "Valid replica already elected for partitions payments-1\n"
        "Error completing leader election (PREFERRED) for partition: clickstream-3: org.apache.kafka.common.errors."
        "PreferredLeaderNotAvailableException: Failed to elect leader for partition clickstream-3 under strategy "
        "PreferredReplicaPartitionLeaderElectionStrategy\n"
        'Exception in thread "main" kafka.common.AdminCommandFailedException: 1 replica(s) could not be elected\n'
    )
    got = parse_election(out)
    assert got["orders-0"] is None and got["my.topic-12"] is None and got["payments-1"] == "noop"
    assert got["clickstream-3"].startswith("org.apache.kafka.common.errors.PreferredLeaderNotAvailableException")
    assert set(got) == {"orders-0", "my.topic-12", "payments-1", "clickstream-3"}


# ---- why blocked, hold and skip (roll_status)
def controlled(plan: Plan, fleet: FakeFleet, where: Path, controls: Any, **gates: Any) -> tuple[RollExecutor, list]:
    """An executor with the operator's ``controls`` and its roll status kept in a list."""
    statuses: list[RollStatus] = []
    ex = RollExecutor(
        plan,
        where,
        inventory(),
        fake_hosts(fleet),
        FakeCluster(fleet),
        dataclasses.replace(GATES, **gates),
        controls=controls,
        status=statuses.append,
        run_id="manual__1",
    )
    fleet.journal = ex.journal.path
    return ex, statuses


def test_a_step_blocked_by_an_under_replicated_partition_waits_says_why_and_goes_once_it_is_back(
    tmp_path: Path,
) -> None:
    fleet = make_fleet()
    lagging = next(p for p in fleet.partitions if 2 not in p.replicas and 6 in p.replicas)
    lagging.isr = [r for r in lagging.isr if r != 6]  # broker 6 fell behind on a partition broker 2 does not host
    fleet.rejoins = False
    polls = []

    def controls() -> Control:
        polls.append(1)
        if len(polls) == 3:
            fleet.rejoins = True  # caught up
        return Control()

    ex, statuses = controlled(roll_plan(fleet, batched=False), fleet, tmp_path, controls, blocked_timeout_s=30)
    assert ex.run()["status"] == "done"
    blocked = [s for s in statuses if s.state == "blocked"]
    assert blocked and {s.blocked.gate for s in blocked} == {UNDER_REPLICATED}
    first = blocked[0]
    assert first.brokers == (2,) and first.step == 1 and first.steps == 6
    assert first.blocked.items == (
        f"t-{lagging.partition} under-replicated (ISR {sorted(set(lagging.replicas) - {6})})",
    )
    assert time.time() - 60 < first.blocked.since <= time.time()
    assert "blocked: under-replicated since" in first.describe()
    stops = [b for what, b in fleet.events if what == "stop"]
    assert stops == [2, 3, 4, 5, 6, 1]  # nothing stopped while it was blocked; then the roll went on
    assert statuses[-1].state == "done" and statuses[-1].blocked is None and sorted(statuses[-1].done) == BROKERS
    assert fleet.below_min_isr == []


def test_a_step_blocked_past_blocked_timeout_halts_with_the_gate_and_nothing_of_it_stopped(tmp_path: Path) -> None:
    fleet = make_fleet()
    q = next(x for x in fleet.partitions if x.replicas[0] == 3)
    q.min_isr = 3  # a topic whose min.insync.replicas is its RF: any stop of a replica takes it below
    ex, statuses = controlled(roll_plan(fleet, batched=False), fleet, tmp_path, Control, blocked_timeout_s=0.2)
    with pytest.raises(RepairError, match=r"broker 3 blocked for 0 s \(blocked_timeout_s\), nothing of the step"):
        ex.run()
    assert [b for what, b in fleet.events if what == "stop"] == [2]
    assert not ex.journal.left_down(3) and ex.journal.keeps_lock() is None  # the lock goes: nothing is down
    last = statuses[-1]
    assert last.state == "halted" and last.blocked is not None and last.blocked.gate == MIN_ISR
    assert "min-isr since" in last.error and f"t-{q.partition}" in last.error


def test_a_held_broker_blocks_its_step_until_released_and_a_skipped_one_is_never_stopped(tmp_path: Path) -> None:
    fleet = make_fleet()
    entry = {"by": "alice", "at": time.time(), "why": "disk swap first"}
    holding = {"polls": 0}
    ex: RollExecutor | None = None

    def controls() -> Control:
        assert ex is not None
        if 3 in ex.current:
            holding["polls"] += 1
        held = {3: entry} if holding["polls"] < 4 else {}  # released on the 4th look at broker 3's step
        return Control(hold=held, skip={5: {"by": "bob", "at": time.time(), "why": "host in repair"}})

    ex, statuses = controlled(roll_plan(fleet, batched=False), fleet, tmp_path, controls, blocked_timeout_s=30)
    done = ex.run()
    assert done["status"] == "done"
    stops = [b for what, b in fleet.events if what == "stop"]
    assert stops == [2, 3, 4, 6, 1]  # 5 skipped; 3 after its release
    assert done["brokers"]["5"]["state"] == State.PENDING and "skipped by bob" in done["brokers"]["5"]["skipped"]
    held = [s for s in statuses if s.blocked is not None and s.blocked.gate == HELD]
    assert held and held[0].brokers == (3,)
    assert "broker 3: held by alice" in held[0].blocked.items[0] and "disk swap first" in held[0].blocked.items[0]
    assert statuses[-1].state == "done" and statuses[-1].skipped == (5,)
    assert "skipped: 5" in statuses[-1].describe()


def test_a_skip_after_the_roll_stopped_the_broker_cannot_hold_it_is_started_again(tmp_path: Path) -> None:
    fleet = make_fleet()
    plan = roll_plan(fleet, batched=False)
    fleet.faults[(2, "stop:after")] = "crash"  # the first attempt's worker dies with broker 2 stopped
    with pytest.raises(Crash):
        executor(plan, fleet, tmp_path).run()
    fleet.crash_journal()
    assert executor(plan, fleet, tmp_path).journal.left_down(2)
    fleet.revive()
    skip = Control(skip={2: {"by": "carol", "at": time.time(), "why": ""}})
    again, _ = controlled(plan, fleet, tmp_path, lambda: skip)
    assert again.run()["status"] == "done"
    assert 2 in FakeCluster(fleet).registered()
    assert "skipped" not in again.journal.broker(2) and "skipped by carol" in again.journal.broker(2)["skip_too_late"]


def test_the_log_recovery_rate_is_measured_per_cluster_and_kept_until_a_roll_measures_it_again(
    tmp_path: Path,
) -> None:
    from types import SimpleNamespace

    from fleet_doctor.repair.roll_tasks import record_step_times, step_times
    from fleet_doctor.store import Store

    fleet = make_fleet()
    plan = roll_plan(fleet, batched=False)
    gib = 1 << 30
    down = dataclasses.replace(
        plan.brokers[0],
        preview=RestartPreview(False, False, 3, gib, 0, 0, 10.0, 0),  # down after an unclean stop: 1 GiB to recover
    )
    plan = dataclasses.replace(plan, brokers=[down, *plan.brokers[1:]])
    assert recovery_bytes(plan) == {down.broker_id: gib}
    journal = executor(plan, fleet, tmp_path).run()
    journal["brokers"][str(down.broker_id)]["recovery"] = {"seconds": 8.0}
    assert measure_recovery(journal, plan.hash, recovery_bytes(plan))["bytes_per_s"] == gib // 8
    quick = json.loads(json.dumps(journal))
    quick["brokers"][str(down.broker_id)]["recovery"] = {"seconds": 0.5}  # a poll's worth: says nothing of the rate
    assert measure_recovery(quick, plan.hash, recovery_bytes(plan)) is None

    settings = SimpleNamespace(store=Store(tmp_path / "store"))
    record_step_times(settings, journal, plan)  # type: ignore[arg-type]
    times = step_times(settings)  # type: ignore[arg-type]
    assert times.recovery_bytes_per_s == gib // 8 and "median of 1 broker(s) that recovered" in times.recovery_source
    record_step_times(settings, quick, plan)  # type: ignore[arg-type]  # no recovery measured: the rate stays
    assert step_times(settings).recovery_bytes_per_s == gib // 8  # type: ignore[arg-type]
    settings.store.write_text("roll-timings.json", "{torn")  # a damaged record is replaced, not left to block
    record_step_times(settings, journal, plan)  # type: ignore[arg-type]
    assert step_times(settings).recovery_bytes_per_s == gib // 8  # type: ignore[arg-type]
    again = roll_plan(fleet, batched=False, times=times, recovery_bytes_per_s=times.recovery_bytes_per_s)
    assert again.risk["predicted"]["recovery_source"] == times.recovery_source
    body = approval_text.roll_request(again).body
    assert "log recovery at 128.0 MiB/s, `measured on roll" in body, [x for x in body.splitlines() if "Predicted" in x]


def test_the_approval_names_the_holds_and_skips_standing_when_the_roll_is_planned() -> None:
    fleet = make_fleet()
    control = Control(hold={3: {"by": "alice", "at": 1.79e9, "why": "disk swap"}}, skip={9: {"by": "bob", "at": 0}})
    plan = roll_plan(fleet, batched=False, standing={b: control.describe(b) for b in {*control.hold, *control.skip}})
    assert plan.risk["controls"] == {"3": control.describe(3)}  # broker 9 is not rolled: not said
    body = approval_text.roll_request(plan).body
    assert "**Held or skipped by an operator now**" in body and "broker 3: held by alice at 2026-09-21T" in body
    assert roll_plan(fleet, batched=False).hash == plan.hash  # what stands now is shown, never hashed


def test_a_hold_on_a_broker_the_roll_stopped_never_keeps_it_down(tmp_path: Path) -> None:
    """A worker died with broker 2 stopped; the operator then holds it (and the controls cannot even be read on
    a second try): the rerun starts it at once, whatever the controls say; the hold applies to brokers still up."""
    fleet = make_fleet()
    plan = roll_plan(fleet, batched=False)
    fleet.faults[(2, "stop:after")] = "crash"
    with pytest.raises(Crash):
        executor(plan, fleet, tmp_path).run()
    fleet.crash_journal()
    fleet.revive()
    hold = Control(hold={2: {"by": "alice", "at": time.time(), "why": ""}})
    again, statuses = controlled(plan, fleet, tmp_path, lambda: hold, blocked_timeout_s=0.1)
    assert again.run()["status"] == "done"  # the hold on 2 came after the roll stopped it: started, rolled
    assert again.journal.completed(2) == State.DONE and 2 in FakeCluster(fleet).registered()
    assert not any(s.blocked is not None and s.brokers == (2,) for s in statuses)

    def unreadable() -> Control:
        raise ValueError("roll-control.json: not a roll control")

    fleet2 = make_fleet()
    fleet2.faults[(2, "stop:after")] = "crash"
    plan2 = roll_plan(fleet2, batched=False)
    with pytest.raises(Crash):
        executor(plan2, fleet2, tmp_path / "b").run()
    fleet2.crash_journal()
    fleet2.revive()
    third, _ = controlled(plan2, fleet2, tmp_path / "b", unreadable)
    with pytest.raises(RepairError, match="holds and skips cannot be read"):
        third.run()
    assert third.journal.completed(2) == State.DONE  # started first; the next step, which stops, is what halts
    assert not third.journal.left_down(2) and third.journal.keeps_lock() is None


def test_a_hold_that_arrives_during_the_pre_check_is_honoured_before_the_stop(tmp_path: Path) -> None:
    fleet = make_fleet()
    entry = {"by": "alice", "at": time.time(), "why": "late"}
    held = {"calls": 0}
    ex: RollExecutor | None = None

    def controls() -> Control:
        assert ex is not None
        if held["calls"] == 0 and ex.phase == "pre-check" and ex.current == (3,):
            held["calls"] = 1  # placed while broker 3's identity and gates were being checked
        if 0 < held["calls"] <= 3:  # seen by the pre-check, then by two polls of the wait; then released
            held["calls"] += 1
            return Control(hold={3: entry})
        return Control()

    ex, statuses = controlled(roll_plan(fleet, batched=False), fleet, tmp_path, controls, blocked_timeout_s=30)
    assert ex.run()["status"] == "done"
    assert any(s.blocked is not None and s.blocked.gate == HELD and s.brokers == (3,) for s in statuses)
    assert [b for what, b in fleet.events if what == "stop"] == [2, 3, 4, 5, 6, 1]
    assert ex.journal.broker(3)["history"][0]["state"] == "step"


def test_a_damaged_control_is_named_not_half_read(tmp_path: Path) -> None:
    from fleet_doctor import roll_status
    from fleet_doctor.store import Store

    store = Store(tmp_path)
    for bad in ('{"hold": {"3": {"by": "x", "at": "x"}}}', '{"skip": {"3": "bob"}}', '{"hold": {"x": {}}}', "[]"):
        store.write_text("roll-control.json", bad)
        with pytest.raises(ValueError, match=r"roll-control.json: not a roll control .*fix or delete it"):
            roll_status.read_control(store)
    store.write_text("roll-control.json", '{"hold": {"3": {"by": "x", "at": 1790000000}}}')
    assert roll_status.read_control(store).describe(3).startswith("held by x at 2026-09-21T")
