"""A roll as the fleet page shows it, and what an operator asks of a running roll: both kept in the cluster's store.

- ``layout.ROLL_STATUS``: the cluster's running (or last) roll as its worker last wrote it (``repair.roll``): its
  step of the plan and the step's brokers, what it does now, who is done or skipped, and, while a step cannot go,
  **why it is blocked**: which gate (``GATES``), which partitions or brokers, since when. Written when a step begins,
  when it moves on (never between a stop and its start), whenever why it is blocked changes and every few seconds
  while it stays blocked, and when the roll ends (done or halted, with why).
- ``layout.ROLL_CONTROL``: the operator's word per broker (``bin/fleet-doctor roll-control``): **hold** a broker
  (the roll waits before the step that holds it, blocked, until it is released) or **skip** it (the roll leaves it
  out: never stopped). Read by the roll before each step and at every poll while a step is blocked; a skip comes too
  late for a broker the roll has stopped already (said in the log). Standing until released: the next roll of the
  cluster honours them too, and its approval says so.

Best effort, like the lock's mirror (``lock_state``): a status that cannot be written is logged and never fails a
roll; a control that cannot be read fails the step (a hold must not be missed). The page says when the status was
written.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from fleet_doctor.audit.summary import TIME_FORMAT
from fleet_doctor.layout import ROLL_CONTROL, ROLL_STATUS
from fleet_doctor.lock_state import unix_time

LOG = logging.getLogger(__name__)

# the gates a roll's step waits at (``Blocked.gate``), in the order they are checked
HELD = "held"  # an operator holds a broker of the step
REGISTERED = "brokers-registered"  # a broker outside the step is not registered
UNDER_REPLICATED = "under-replicated"  # a partition is under-replicated or offline (not counting the step's own)
PARTITION_DISJOINT = "partition-disjoint"  # two brokers of the step share a partition (reassigned since the plan)
MIN_ISR = "min-isr"  # with the step stopped, a partition keeps fewer than min.insync.replicas (+ the margin) in ISR
GATES = (HELD, REGISTERED, UNDER_REPLICATED, PARTITION_DISJOINT, MIN_ISR)

RUNNING, BLOCKED, DONE, HALTED = "running", "blocked", "done", "halted"
HOLD, SKIP, RELEASE = "hold", "skip", "release"


def _when(ts: float) -> str:
    return time.strftime(TIME_FORMAT, time.gmtime(ts))


def _unix_time(value: Any) -> float:
    """``lock_state.unix_time``, or ValueError: a damaged object must not take a page or a roll down."""
    checked = unix_time(value)
    if checked is None:
        raise ValueError(f"not a time: {value!r}")
    return checked


@dataclass(frozen=True)
class Blocked:
    """Why a step cannot go: the gate, what holds it (partitions, brokers, who holds), since when (Unix time)."""

    gate: str
    why: str
    items: tuple[str, ...] = ()
    since: float = 0.0

    def describe(self, limit: int = 5) -> str:
        """``min-isr since 2026-11-29T20:31:05Z: stopping brokers 3, 4 would take ...: orders-3 (...)``."""
        more = f" (+{len(self.items) - limit} more)" if len(self.items) > limit else ""
        listed = f": {'; '.join(self.items[:limit])}{more}" if self.items else ""
        return f"{self.gate} since {_when(self.since)}: {self.why}{listed}"


@dataclass(frozen=True)
class RollStatus:
    """The roll of run ``run_id`` (plan ``plan_hash``) as its worker wrote it at ``updated_at``."""

    run_id: str
    plan_hash: str
    state: str  # running, blocked, done, halted
    updated_at: float
    step: int = 0  # the step under way (1-based), or the last one
    steps: int = 0  # the steps planned (a controller deferred, a skip or a down broker can change the count)
    brokers: tuple[int, ...] = ()  # the step's brokers
    phase: str = ""  # what the step does now: pre-check, stop, start, healthy, leadership
    done: tuple[int, ...] = ()
    skipped: tuple[int, ...] = ()
    blocked: Blocked | None = None
    error: str | None = None  # why it halted

    def describe(self) -> str:
        """One line for people."""
        who = f"broker {self.brokers[0]}" if len(self.brokers) == 1 else f"brokers {', '.join(map(str, self.brokers))}"
        at = f"step {self.step} of {self.steps} ({who})" if self.brokers else f"step {self.step} of {self.steps}"
        if self.state == DONE:
            text = f"done: {len(self.done)} broker(s) restarted"
        elif self.state == HALTED:
            text = f"halted at {at}: {self.error or '?'}"
        elif self.blocked is not None:
            text = f"{at} blocked: {self.blocked.describe()}"
        else:
            text = f"{at}: {self.phase or 'running'}"
        return text + (f"; skipped: {', '.join(map(str, self.skipped))}" if self.skipped else "")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> RollStatus | None:
        """The status in ``data``, None when it is not one (a damaged object must not take a page down)."""
        try:
            blocked = data.get("blocked")
            return cls(
                run_id=str(data["run_id"]),
                plan_hash=str(data["plan_hash"]),
                state=str(data["state"]),
                updated_at=_unix_time(data["updated_at"]),
                step=int(data.get("step") or 0),
                steps=int(data.get("steps") or 0),
                brokers=tuple(int(b) for b in data.get("brokers") or ()),
                phase=str(data.get("phase") or ""),
                done=tuple(int(b) for b in data.get("done") or ()),
                skipped=tuple(int(b) for b in data.get("skipped") or ()),
                blocked=None
                if not blocked
                else Blocked(
                    str(blocked["gate"]),
                    str(blocked["why"]),
                    tuple(str(x) for x in blocked.get("items") or ()),
                    _unix_time(blocked.get("since")),
                ),
                error=str(data["error"]) if data.get("error") else None,
            )
        except (AttributeError, KeyError, TypeError, ValueError):
            return None


def read_status(store: Any) -> RollStatus | None:
    """The cluster's roll status, None when no roll wrote one (or it is not one: logged). StoreError when the store
    cannot be read."""
    data = store.read_json(ROLL_STATUS)
    status = RollStatus.from_json(data) if data is not None else None
    if data is not None and status is None:
        LOG.warning("%s: not a roll status (ignored): %.200r", store.url(ROLL_STATUS), data)
    return status


def record_status(store: Any, status: RollStatus) -> None:
    """Write ``status`` in the cluster's store; never raises (the roll goes on, the page shows an older one)."""
    try:
        store.write_text(ROLL_STATUS, json.dumps(status.to_json(), indent=2) + "\n")
    except Exception as e:
        LOG.warning("the roll's status could not be written to %s: %s", store.url(ROLL_STATUS), e)


@dataclass(frozen=True)
class Control:
    """The operator's holds and skips, per broker: who asked, when, why."""

    hold: dict[int, dict[str, Any]] = field(default_factory=dict)
    skip: dict[int, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"hold": {str(b): v for b, v in self.hold.items()}, "skip": {str(b): v for b, v in self.skip.items()}}

    def describe(self, broker: int) -> str:
        """``held by alice at <when>: <why>`` (or skipped) for a broker with a control, else ""."""
        for kind, entries in (("held", self.hold), ("skipped", self.skip)):
            if broker in entries:
                e = entries[broker]
                why = f": {e['why']}" if e.get("why") else ""
                return f"{kind} by {e.get('by') or '?'} at {_when(float(e.get('at') or 0))}{why}"
        return ""

    def said(self) -> dict[int, str]:
        """Every broker held or skipped, in order, with what was said (``describe``)."""
        return {b: self.describe(b) for b in sorted({*self.hold, *self.skip})}


def read_control(store: Any) -> Control:
    """The cluster's standing holds and skips (none when nothing was ever asked). StoreError when the store cannot be
    read, ValueError naming the object when it is not a control: the roll must not miss a hold."""
    data = store.read_json(ROLL_CONTROL)
    if data is None:
        return Control()

    def entries(kind: str) -> dict[int, dict[str, Any]]:
        out = {}
        for b, v in (data.get(kind) or {}).items():
            if not isinstance(v, dict) or not isinstance(v.get("by", ""), str) or not isinstance(v.get("why", ""), str):
                raise ValueError(f"{kind} of broker {b}: {v!r} is not {{by, at, why}}")
            try:
                at = _unix_time(v.get("at"))
            except ValueError as e:
                raise ValueError(f"{kind} of broker {b}: {e}") from e
            out[int(b)] = {"by": v.get("by", ""), "at": at, "why": v.get("why", "")}
        return out

    try:
        return Control(entries("hold"), entries("skip"))
    except (AttributeError, TypeError, ValueError) as e:
        raise ValueError(f"{store.url(ROLL_CONTROL)}: not a roll control ({e}); fix or delete it") from e


def change_control(store: Any, action: str, broker: int, by: str, why: str = "") -> Control:
    """Hold, skip or release (both) ``broker`` in the cluster's control; the control now."""
    if action not in (HOLD, SKIP, RELEASE):
        raise ValueError(f"unknown roll control {action!r}: one of {HOLD}, {SKIP}, {RELEASE}")
    now = read_control(store)
    entry = {"by": by, "at": time.time(), "why": why}
    hold, skip = dict(now.hold), dict(now.skip)
    hold.pop(broker, None)
    skip.pop(broker, None)
    if action == HOLD:
        hold[broker] = entry
    elif action == SKIP:
        skip[broker] = entry
    changed = Control(hold, skip)
    store.write_text(ROLL_CONTROL, json.dumps(changed.to_json(), indent=2) + "\n")
    return changed
