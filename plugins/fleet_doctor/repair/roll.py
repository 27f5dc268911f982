"""Running an approved roll: the repair's state machine (``repair.executor``) with no file changed, batch by batch.

Per batch of the plan (one broker, or brokers that share no partition: ``repair.roll_plan``), each step for every
broker of the batch before the next step, each broker's state journaled (``repair.journal``)::

    PENDING -> PRECHECKED -> STOPPED -> STARTED -> HEALTHY -> VERIFIED (leads its preferred partitions) -> DONE
                  any step fails -> FAILED: the chain halts; a broker this attempt stopped is started again

- **pre-check**: each host is its broker; every other broker registered and no partition under-replicated but for
  the batch's own replicas; with every broker of the batch stopped, no partition below ``min.insync.replicas`` (plus
  the plan's ``isr_margin`` when the batch has several), and no two of the batch sharing a partition, both read live
  (a reassignment since the plan is caught here); on KRaft the quorum gate for a voter;
- **stop**: every stop journaled as issued, then sent to the whole batch at once, then waited for (the process gone,
  the registration gone);
- **start**: sent to the whole batch at once, then each broker waited for until it registers. Until then its state is
  read each poll (the inventory's ``broker_state``: Kafka's BrokerState): a broker in RECOVERY is recovering, never
  failed; its wait goes on past ``start_timeout_s`` up to ``recovery_timeout_s``, the remaining logs and segments and
  an ETA in the log every few seconds. A broker whose process exited has failed;
- **healthy**: ``healthy_polls`` consecutive healthy polls, the batch back in every ISR;
- **leadership back**: a preferred-leader election for exactly the partitions each broker of the batch is the
  preferred replica of and does not lead (``roll_plan.preferred_elections``), through the plan's ``leadership`` way
  (``kafka-leader-election.sh`` on the broker, or ZooKeeper's ``/admin/preferred_replica_election``), then polled
  until it leads them within ``leadership_timeout_s``. A partition that cannot move back (its preferred replica out
  of ISR) or has not moved in time is journaled with why and the roll goes on: leadership is balance, not safety.

The next batch never stops while one still recovers or catches up: its pre-check comes after this batch's healthy
polls. The active controller goes last: a batch that holds the controller of this moment (it can move during a
roll) is split, the controller deferred to a batch of its own at the end.

**Why blocked.** Before a step's pre-check the roll waits while the step cannot go: an operator holds one of its
brokers, or a gate fails (``roll_status.GATES``: a broker outside the step not registered, a partition
under-replicated, two of the step sharing a partition, a partition that would fall below min ISR). The gate, the
partitions or brokers and since when go to the task log every few seconds and to the cluster's roll status
(``roll_status``: the fleet page); past ``blocked_timeout_s`` the roll halts, nothing of the step stopped (the lock
goes), and clearing the task resumes. The operator's skips are honoured there too: a skipped broker the roll has not
stopped is left out (journaled ``skipped``), one it has stopped is started and waited for all the same.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from fleet_doctor.remote import RemoteError
from fleet_doctor.repair.broker import NOT_NEEDED, BrokerHost
from fleet_doctor.repair.errors import FenceLost, RepairError
from fleet_doctor.repair.executor import Executor, StillStopping
from fleet_doctor.repair.journal import ORDER, State
from fleet_doctor.repair.plan import BrokerPlan
from fleet_doctor.repair.progress import Progress, pause
from fleet_doctor.repair.roll_plan import (
    DOWN_FIRST,
    LEADERSHIP_OFF,
    LEADERSHIP_VIA_ZOOKEEPER,
    Batch,
    batch_below_min_isr,
    batches_of,
    preferred_elections,
    shared_partitions,
)
from fleet_doctor.roll_status import (
    BLOCKED,
    DONE,
    HALTED,
    HELD,
    MIN_ISR,
    PARTITION_DISJOINT,
    REGISTERED,
    RUNNING,
    UNDER_REPLICATED,
    Blocked,
    Control,
    RollStatus,
)

LOG = logging.getLogger(__name__)
ROLL_STEPS = (State.PRECHECKED, State.STOPPED, State.STARTED, State.HEALTHY, State.VERIFIED, State.DONE)
# what a step does while it is in each state's step (the roll status's ``phase``)
PHASES = {
    State.PRECHECKED: "pre-check",
    State.STOPPED: "stop",
    State.STARTED: "start (registered again, a log recovery waited out)",
    State.HEALTHY: "back in ISR",
    State.VERIFIED: "leadership back",
    State.DONE: "done",
}


class RollExecutor(Executor):
    """The chain of one attempt at an approved roll plan (``repair.roll_plan.build_roll_plan``): the executor's
    gates, stop, start, journal and failure handling, batch by batch, and the leadership step."""

    def __init__(
        self,
        *args: Any,
        controls: Callable[[], Control] = Control,
        status: Callable[[RollStatus], None] | None = None,
        run_id: str = "",
        **kwargs: Any,
    ) -> None:
        """``controls``: the operator's holds and skips now (``roll_status.read_control``); ``status``: where the
        roll's status goes (``roll_status.record_status``); ``run_id``: the Airflow run, in the status."""
        kwargs.setdefault("post_verify", lambda host, b, stage: [])  # nothing changed: nothing to verify on disk
        super().__init__(*args, **kwargs)
        self.journal.data["changes_files"] = False  # a halt keeps the lock only for a broker left down
        self.isr_margin = int(self.plan.scope.get("isr_margin") or 0)
        self.leadership = dict(self.plan.scope.get("leadership") or {"via": LEADERSHIP_OFF})
        self.controls = controls
        self.status_sink = status or (lambda s: None)
        self.run_id = run_id
        self.step_no, self.steps_planned = 0, len(batches_of(self.plan))
        self.current: tuple[int, ...] = ()
        self.phase = ""
        self.blocked: Blocked | None = None

    def run(self) -> dict[str, Any]:
        """``Executor.run``, the roll's status written at its end: done, or halted with why."""
        try:
            data = super().run()
        except BaseException as e:
            if not self.fenced:
                self.publish(HALTED, str(e) or type(e).__name__)
            raise
        self.current, self.phase, self.blocked = (), "", None
        self.publish(DONE)
        return data

    def publish(self, state: str | None = None, error: str | None = None) -> None:
        """The roll's status now to ``status`` (best effort: a status that cannot go is logged, never fails)."""
        restarted = [b.broker_id for b in self.plan.brokers if b.restart]
        try:
            self.status_sink(
                RollStatus(
                    run_id=self.run_id,
                    plan_hash=self.plan.hash,
                    state=state or (BLOCKED if self.blocked else RUNNING),
                    updated_at=time.time(),
                    step=self.step_no,
                    steps=self.steps_planned,
                    brokers=self.current,
                    phase=self.phase,
                    done=tuple(b for b in restarted if self.journal.completed(b) == State.DONE),
                    skipped=tuple(
                        b
                        for b in restarted
                        if self.journal.broker(b).get("skipped") and self.journal.completed(b) != State.DONE
                    ),
                    blocked=self.blocked,
                    error=error,
                )
            )
        except Exception as e:
            LOG.warning("the roll's status could not be written: %s", e)

    # ---- the chain
    def chain(self) -> None:
        """Step after step (``_next_batch``), each through every step for all of its brokers, the pause between."""
        by_id = {b.broker_id: b for b in self.plan.brokers if b.restart}
        pending = [Batch(tuple(x for x in batch.brokers if x in by_id), batch.why) for batch in batches_of(self.plan)]
        pending = [batch for batch in pending if batch.brokers]
        while pending:
            batch = self._next_batch(pending)
            todo = [by_id[x] for x in batch.brokers if self.journal.completed(x) != State.DONE]
            if not todo:
                continue
            self.step_no += 1
            left = sum(1 for p in pending if any(self.journal.completed(x) != State.DONE for x in p.brokers))
            self.steps_planned = self.step_no + left
            while True:
                todo = self._until_clear(todo)
                if not todo:
                    break
                try:
                    self._roll(batch, todo)
                    break
                except _ControlsChanged as e:  # held or skipped during the pre-check: nothing stopped, wait again
                    LOG.warning("%s: %s: back to waiting before the step", _named(b.broker_id for b in todo), e)
            if not todo:
                continue
            left = sum(1 for p in pending for x in p.brokers if self.journal.completed(x) != State.DONE)
            if left and self.gates.pause_between_brokers_s:
                what = f"pause after {_named(batch.brokers)} before the next step ({left} broker(s) left)"
                pause(what, self.gates.pause_between_brokers_s, self.gates.progress_every_s, log=LOG)

    def _next_batch(self, pending: list[Batch]) -> Batch:
        """The next batch in plan order, the controller of this moment last: a batch holding it while others remain
        gives it up to a batch of its own at the end (journaled); voters stay after the plain brokers. Brokers of the
        roll that are down now go first, together, out of their batches (a broker killed since the plan, or a batch
        a dead worker left stopped): every gate before them would fail on them, and their start stops nothing."""
        controller = self.cluster.controller()
        voters = self.cluster.voters()
        registered = self.cluster.registered()
        down = [
            x for p in pending for x in p.brokers if x not in registered and self.journal.completed(x) != State.DONE
        ]
        if down:
            pending[:] = [Batch(tuple(x for x in p.brokers if x not in down), p.why) for p in pending]
            pending[:] = [p for p in pending if p.brokers]
            return Batch(tuple(down), DOWN_FIRST)
        undone = [p for p in pending if any(self.journal.completed(x) != State.DONE for x in p.brokers)]
        if controller is not None and (len(undone) > 1 or any(len(p.brokers) > 1 for p in undone)):
            for i, p in enumerate(pending):
                alone_last = p.brokers == (controller,) and p is undone[-1]
                if controller in p.brokers and not alone_last and self.journal.completed(controller) != State.DONE:
                    rest = tuple(x for x in p.brokers if x != controller)
                    pending[i] = Batch(rest, p.why)
                    pending.append(Batch((controller,), "the active controller of this moment, deferred to the end"))
                    self._save_quietly(
                        lambda: self.journal.note(controller, "deferred", "the active controller: restarted last")
                    )
                    break
        pending[:] = [p for p in pending if p.brokers]
        ordered = sorted(
            range(len(pending)),
            key=lambda i: (bool(set(pending[i].brokers) & voters), controller in pending[i].brokers, i),
        )
        return pending.pop(ordered[0])

    def _roll(self, batch: Batch, todo: list[BrokerPlan]) -> None:
        """Every step of the roll for the batch's unfinished brokers, each broker resuming after its last finished
        step (a step finished before a crash is never repeated, but one before its start is: see ``_resume_after``)."""
        for b in todo:  # which step each broker rolled in, and why (the measured step times leave the down ones out)
            if self.journal.broker(b.broker_id).get("step") != batch.to_dict():
                self._save_quietly(lambda b=b: self.journal.note(b.broker_id, "step", batch.to_dict()))
        hosts: dict[int, BrokerHost] = {}
        try:
            try:  # every host of the step reached at once, each over its own connection
                self._together(todo, lambda b: hosts.__setitem__(b.broker_id, self._host(b)))
            except _BrokerFailed as e:
                self._failed_batch(e.broker, todo, e.cause, "connecting over SSH")
            steps: list[tuple[State, Callable[[list[BrokerPlan], dict[int, BrokerHost]], dict[int, str]]]] = [
                (State.PRECHECKED, self._precheck_batch),
                (State.STOPPED, self._stop_batch),
                (State.STARTED, self._start_batch),
                (State.HEALTHY, self._healthy_batch),
                (State.VERIFIED, self._leadership_batch),
                (State.DONE, lambda bs, hs: dict.fromkeys((b.broker_id for b in bs), "done")),
            ]
            for target, step in steps:
                due = [b for b in todo if ORDER.index(self._resume_after(b)) < ORDER.index(target)]
                if not due:
                    continue
                try:
                    self.fence()
                    self.current, self.phase = tuple(b.broker_id for b in todo), PHASES[target]
                    if target != State.STARTED:  # never a store write between a stop and its start
                        self.publish()
                    details = step(due, hosts)
                    for b in due:
                        self.journal.advance(b.broker_id, target, details.get(b.broker_id, ""))
                except (FenceLost, _ControlsChanged):
                    raise
                except _BrokerFailed as e:
                    self._failed_batch(e.broker, todo, e.cause, f"step {target}")
                except BaseException as e:
                    self._failed_batch(due[0], todo, e, f"step {target}")
        finally:
            for h in hosts.values():
                h.close()

    def _failed_batch(self, b: BrokerPlan, batch: list[BrokerPlan], e: BaseException, where: str) -> None:
        """``b`` failed: every other broker of the batch that this attempt stopped is started again first (nothing
        of theirs changed), then ``b`` is recorded failed and the chain halts (``Executor._failed``)."""
        for other in batch:
            if other.broker_id != b.broker_id and self.journal.left_down(other.broker_id):
                self._restart_if_unchanged(other, e)
        self._failed(b, e, where)

    # ---- before a step: the operator's word, and the gates waited for
    def _until_clear(self, todo: list[BrokerPlan]) -> list[BrokerPlan]:
        """The step's brokers once it may go: the operator's skips left out, then waited for while a broker is held
        or a gate fails (``_gate``), why in the log and the roll status; RepairError past ``blocked_timeout_s``.
        Brokers resuming after their pre-check (started already by a halted attempt) are not gated again, and a step
        holding a broker this roll stopped is never held back: its pre-check comes at once (a failure there starts it
        again), so no wait, hold or halt here leaves a broker the roll stopped down."""
        progress: Progress | None = None
        deadline = since = 0.0
        try:
            while True:
                due = [b for b in todo if ORDER.index(self._resume_after(b)) < ORDER.index(State.PRECHECKED)]
                if not due:
                    return todo
                stopped = any(self.journal.left_down(b.broker_id) for b in todo)
                try:
                    control = self._read_controls()
                except RepairError:
                    if stopped:
                        return todo  # a broker this roll stopped is started whatever they say
                    raise
                todo = self._skip(todo, control)
                due = [b for b in due if b in todo]
                if not todo or not due or stopped:
                    return todo
                self.current, self.phase = tuple(b.broker_id for b in todo), "waiting for its gates"
                blocked = self._held(due, control) or self._gate(frozenset(b.broker_id for b in due))
                if blocked is None:
                    if self.blocked is not None:
                        LOG.info("%s: no longer blocked (%s)", _named(self.current), self.blocked.gate)
                    self.blocked = None
                    self.publish()
                    return todo
                if progress is None:
                    since, deadline = time.time(), time.monotonic() + self.gates.blocked_timeout_s
                    what = f"step {self.step_no} of {self.steps_planned} ({_named(self.current)}): blocked"
                    progress = self._progress(what, self.gates.blocked_timeout_s)
                blocked = Blocked(blocked.gate, blocked.why, blocked.items, since)
                if blocked != self.blocked:  # a new why (``since`` is this wait's)
                    LOG.warning("%s: blocked: %s", _named(self.current), blocked.describe(10))
                    self.blocked = blocked
                    self.publish()
                if progress.update(blocked.describe()):
                    self.publish()  # the status stays fresh while blocked: a worker still alive
                if time.monotonic() >= deadline:
                    raise RepairError(
                        f"{_named(self.current)} blocked for {self.gates.blocked_timeout_s:.0f} s "
                        f"(blocked_timeout_s), nothing of the step stopped: {blocked.describe(10)}"
                    )
                time.sleep(self.gates.poll_interval_s)
        except BaseException as e:
            if progress is not None:
                progress.failed(str(e))
            raise
        finally:
            if progress is not None and not progress.finished:
                progress.done()

    def _read_controls(self) -> Control:
        """The operator's holds and skips now; RepairError when they cannot be read (a hold must not be missed:
        the step halts before anything of it stops)."""
        try:
            return self.controls()
        except Exception as e:
            raise RepairError(f"the operator's holds and skips cannot be read: {e}") from e

    def _skip(self, todo: list[BrokerPlan], control: Control) -> list[BrokerPlan]:
        """``todo`` but the brokers the operator skips (journaled ``skipped``); a skip that comes after this roll
        stopped the broker cannot hold: it is said, and the broker is started and waited for."""
        out = []
        for b in todo:
            if b.broker_id not in control.skip:
                out.append(b)
                continue
            said = control.describe(b.broker_id)
            past = ORDER.index(self._resume_after(b)) >= ORDER.index(State.PRECHECKED)
            if self.journal.left_down(b.broker_id) or past:
                if self.journal.broker(b.broker_id).get("skip_too_late") != said:
                    LOG.warning("broker %s: %s, too late: this roll stopped it; it is started again", b.broker_id, said)
                    self._save_quietly(lambda b=b, said=said: self.journal.note(b.broker_id, "skip_too_late", said))
                out.append(b)
                continue
            LOG.warning("broker %s: %s: left out of the roll, not restarted", b.broker_id, said)
            self._save_quietly(lambda b=b, said=said: self.journal.note(b.broker_id, "skipped", said))
        return out

    def _held(self, due: list[BrokerPlan], control: Control) -> Blocked | None:
        held = [b.broker_id for b in due if b.broker_id in control.hold]
        if not held:
            return None
        release = f"bin/fleet-doctor roll-control {self.inventory.cluster} release {held[0]}"
        return Blocked(
            HELD,
            f"the operator holds {_named(held)} (lifted by: {release})",
            tuple(f"broker {b}: {control.describe(b)}" for b in held),
        )

    def _gate(self, ids: frozenset[int]) -> Blocked | None:
        """The first gate the step ``ids`` fails now, read live (None: it may go): every broker outside it
        registered, no partition under-replicated or offline but for the step's own replicas, no two of the step
        sharing a partition, min ISR (+ the margin for several) kept with all of it stopped."""
        expected = {x.id for x in self.inventory.brokers}
        registered = self.cluster.registered()
        if not (ids & registered):  # all down already: their start takes nothing below anything, it only helps
            return None
        missing = sorted(expected - registered - ids)
        if missing:
            return Blocked(
                REGISTERED,
                f"broker(s) outside the step not registered ({self.cluster.registration})",
                tuple(f"broker {b}" for b in missing),
            )
        partitions = self.cluster.partitions()
        problems = self.cluster.problems(expected, ids, partitions=partitions)  # a roll repairs no replica
        if problems:
            return Blocked(UNDER_REPLICATED, "partitions under-replicated or offline", tuple(problems))
        shared = shared_partitions(ids, partitions)
        if shared:
            return Blocked(
                PARTITION_DISJOINT,
                f"{_named(ids)} share partition(s) now (reassigned since the plan?)",
                tuple(shared),
            )
        below = batch_below_min_isr(ids, partitions, self.isr_margin)
        if below:
            margin = f" + margin {self.isr_margin}" if len(ids) > 1 and self.isr_margin else ""
            return Blocked(MIN_ISR, f"stopping {_named(ids)} would take below min ISR{margin}", tuple(below))
        return None

    # ---- the steps, for a batch
    def _precheck_batch(self, bs: list[BrokerPlan], hosts: dict[int, BrokerHost]) -> dict[int, str]:
        """Each host is its broker, the quorum gate for a voter, and the gates once more (``_until_clear`` waited
        for them just now: one failing again here fails the step)."""
        ids = frozenset(b.broker_id for b in bs)
        self._together(bs, lambda b: hosts[b.broker_id].identity())
        quorum = ""
        for b in bs:
            quorum = _each(b, lambda b=b: self._quorum_gate(b))
        blocked = self._gate(ids)
        if blocked is not None:
            raise RepairError(f"pre-check before {_named(ids)}: {blocked.describe(10)}")
        if not any(self.journal.left_down(b.broker_id) for b in bs):  # the operator's word once more, right before
            control = self._read_controls()  # the stop (identity and the quorum gate may have taken minutes)
            late = sorted(b.broker_id for b in bs if b.broker_id in control.hold or b.broker_id in control.skip)
            if late:
                raise _ControlsChanged(f"{_named(late)} held or skipped during the pre-check")
        what = "the hosts are these brokers" if len(ids) > 1 else "the host is this broker"
        detail = (
            f"{what}; all other brokers registered, no under-replicated partition, min ISR kept with "
            f"{_named(ids)} stopped{quorum}"
        )
        return dict.fromkeys(ids, detail)

    def _stop_batch(self, bs: list[BrokerPlan], hosts: dict[int, BrokerHost]) -> dict[int, str]:
        """Stop the step's registered brokers together and wait until all are gone. A broker of the step that is not
        registered is never stopped: either its process is gone already, or it runs and is starting or recovering
        its logs (a rerun while it recovers, a KRaft node fenced but running): its start is then a no-op and the
        roll waits for it. Once a stop is journaled as issued, any failure of the step leaves every broker of it
        counted as possibly still stopping (``StillStopping``): none is counted as up again until seen started."""
        registered = self.cluster.registered()
        stopping = [b for b in bs if b.broker_id in registered]
        running: dict[int, bool] = {}
        self._together(
            [b for b in bs if b.broker_id not in registered],
            lambda b: running.__setitem__(b.broker_id, hosts[b.broker_id].running()),
        )
        if not self.dry_run:
            for b in stopping:
                self.journal.stop_issued(b.broker_id)
        try:
            if not self.dry_run:
                self._together(stopping, lambda b: self.send_stop(b, hosts[b.broker_id]))
            self._wait_all_stopped(stopping, hosts)
        except _BrokerFailed as e:
            cause = e.cause if isinstance(e.cause, StillStopping) else StillStopping(str(e.cause))
            raise _BrokerFailed(e.broker, cause) from e.cause
        out = {b.broker_id: f"process gone and its {self.cluster.registration} removed" for b in stopping}
        for bid, up in running.items():
            out[bid] = (
                f"not stopped: its process runs without its {self.cluster.registration} (starting, or recovering "
                "its logs): waited for at the start"
                if up
                else f"not stopped: its process was gone already and its {self.cluster.registration} too"
            )
        return out

    def _wait_all_stopped(self, bs: list[BrokerPlan], hosts: dict[int, BrokerHost]) -> None:
        """Until every broker of the step is unregistered and its process gone (``Executor._wait_stopped`` for a
        step: one read of the registrations per poll, the services' status asked at once)."""
        if self.dry_run:
            return
        left = {b.broker_id: b for b in bs}
        what = f"{_named(left)}: waiting for the processes to exit and their {self.cluster.registration} to go"

        def stopped(p: Progress) -> bool:
            gone = [b for b in left.values() if b.broker_id not in self.cluster.registered()]
            running: dict[int, bool] = {}
            self._together(gone, lambda b: running.__setitem__(b.broker_id, hosts[b.broker_id].running()))
            for bid, up in running.items():
                if not up:
                    left.pop(bid)
            p.detail = f"still stopping: {_named(left)}" if left else ""
            return not left

        try:
            self._wait(stopped, self.gates.stop_timeout_s, f"{_named(left)} did not stop", what)
        except (RepairError, RemoteError, _BrokerFailed) as e:  # a poll that failed says nothing of the stops
            b = next(iter(left.values()), bs[0])
            raise _BrokerFailed(b, StillStopping(f"{e} (the plan's stop_timeout_s)")) from e

    def _start_batch(self, bs: list[BrokerPlan], hosts: dict[int, BrokerHost]) -> dict[int, str]:
        if not self.dry_run:
            self._together(bs, lambda b: hosts[b.broker_id].service("start", self.gates.start_timeout_s))
        out = {}
        for b in bs:
            out[b.broker_id] = _each(b, lambda b=b: self.wait_registered(b, hosts[b.broker_id]))
            if not self.dry_run:
                self.journal.up_again(b.broker_id, "registered again after its start")
        return out

    def _healthy_batch(self, bs: list[BrokerPlan], hosts: dict[int, BrokerHost]) -> dict[int, str]:
        """The healthy polls once for the whole step (``Executor.wait_healthy``)."""
        try:
            return self.wait_healthy([b.broker_id for b in bs], frozenset())
        except RepairError as e:
            raise _BrokerFailed(bs[0], e) from e

    def _leadership_batch(self, bs: list[BrokerPlan], hosts: dict[int, BrokerHost]) -> dict[int, str]:
        via = self.leadership.get("via", LEADERSHIP_OFF)
        if via == LEADERSHIP_OFF or self.dry_run:
            why = self.leadership.get("why") or "off"
            return {b.broker_id: f"leadership not moved back: {why}" for b in bs}
        partitions = self.cluster.partitions()
        wanted: dict[int, list[tuple[str, int]]] = {}
        blocked: dict[int, list[str]] = {}
        for b in bs:
            wanted[b.broker_id], blocked[b.broker_id] = preferred_elections(partitions, b.broker_id)
        every = sorted({tp for tps in wanted.values() for tp in tps})
        outcome: dict[str, str | None] = {}
        if every:
            try:
                if via == LEADERSHIP_VIA_ZOOKEEPER:
                    outcome = self.cluster.elect_preferred(every, self.gates.leadership_timeout_s)  # type: ignore[attr-defined]
                else:
                    outcome = hosts[bs[0].broker_id].elect_preferred(every, self.gates.leadership_timeout_s)
            except (RepairError, RemoteError, TimeoutError) as e:  # balance, not safety: said, and the roll goes on
                outcome = dict.fromkeys((f"{t}-{p}" for t, p in every), f"the election failed: {e}")
        led = self._lead_again(bs, wanted, outcome)
        return {
            b.broker_id: self._leadership_detail(
                b, wanted[b.broker_id], blocked[b.broker_id], outcome, led[b.broker_id]
            )
            for b in bs
        }

    def _lead_again(
        self, bs: list[BrokerPlan], wanted: dict[int, list[tuple[str, int]]], outcome: dict[str, str | None]
    ) -> dict[int, set[str]]:
        """Poll (``leadership_timeout_s``) until each broker of the step leads the partitions elected for it; what
        each leads of them by then."""
        waiting = {
            b.broker_id: {f"{t}-{p}" for t, p in wanted[b.broker_id]}
            - {n for n, why in outcome.items() if why not in (None, NOT_NEEDED)}
            for b in bs
        }
        deadline = time.monotonic() + self.gates.leadership_timeout_s
        while True:
            leaders = {f"{p['topic']}-{p['partition']}": p["leader"] for p in self.cluster.partitions()}
            got = {bid: {n for n in names if leaders.get(n) == bid} for bid, names in waiting.items()}
            if got == waiting or time.monotonic() >= deadline:
                return got
            time.sleep(min(self.gates.poll_interval_s, 1.0))

    def _leadership_detail(
        self,
        b: BrokerPlan,
        wanted: list[tuple[str, int]],
        blocked: list[str],
        outcome: dict[str, str | None],
        got: set[str],
    ) -> str:
        """What ``b`` leads again of its preferred partitions, and what it does not, why (journaled apart)."""
        if not wanted and not blocked:
            return "already leads every partition it is the preferred replica of"
        names = {f"{t}-{p}" for t, p in wanted}
        failed = {n: outcome[n] for n in names if outcome.get(n) not in (None, NOT_NEEDED)}
        late = sorted(names - set(failed) - got)
        parts = [f"leads {len(got)}/{len(names) + len(blocked)} of its preferred partitions again"]
        if failed:
            parts.append("not elected: " + "; ".join(f"{n}: {why}" for n, why in sorted(failed.items())[:5]))
        if blocked:
            parts.append("cannot move back: " + "; ".join(blocked[:5]))
        if late:
            parts.append(f"not moved within {self.gates.leadership_timeout_s:.0f} s: {', '.join(late[:10])}")
        if failed or blocked or late:
            self._save_quietly(lambda: self.journal.note(b.broker_id, "leadership_left", parts[1:]))
        return "; ".join(parts)

    # ---- helpers
    def _together(self, bs: list[BrokerPlan], act: Callable[[BrokerPlan], None]) -> None:
        """``act`` on every broker of the batch at once (each host has its own connection); the first failure is
        raised for its broker after all have returned."""
        if len(bs) == 1:
            _each(bs[0], lambda: act(bs[0]))
            return
        errors: dict[int, BaseException] = {}

        def one(b: BrokerPlan) -> None:
            try:
                act(b)
            except BaseException as e:  # raised in the chain's thread below
                errors[b.broker_id] = e

        threads = [threading.Thread(target=one, args=(b,), name=f"roll-{b.broker_id}") for b in bs]
        for t in threads:
            t.start()
        try:
            for t in threads:
                t.join()
        finally:  # a SIGTERM'd task raises in this thread: the commands under way end first, then the failure path
            for t in threads:
                t.join()
        for b in bs:
            if b.broker_id in errors:
                raise _BrokerFailed(b, errors[b.broker_id])


class _ControlsChanged(Exception):
    """A broker of the step was held or skipped while its pre-check ran: nothing of it stopped, it waits again."""


class _BrokerFailed(Exception):
    """A step of a batch failed for one of its brokers."""

    def __init__(self, broker: BrokerPlan, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.broker = broker
        self.cause = cause


def _each(b: BrokerPlan, act: Callable[[], Any]) -> Any:
    """``act`` for broker ``b`` of a batch: a failure is ``b``'s (``_BrokerFailed``)."""
    try:
        return act()
    except FenceLost:
        raise
    except _BrokerFailed:
        raise
    except BaseException as e:
        raise _BrokerFailed(b, e) from e


def _named(ids: Any) -> str:
    ids = sorted(ids)
    return f"broker {ids[0]}" if len(ids) == 1 else f"brokers {', '.join(map(str, ids))}"
