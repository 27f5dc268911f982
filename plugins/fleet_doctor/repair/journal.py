"""One attempt at a plan, journaled: the state of each broker, every remote command, the backups taken, the approvals
it ran under (``<attempt dir>/journal.json``, ``layout.RepairsDir``). Every transition is saved, atomically, before
the next step starts; a rerun of the same attempt reads it and resumes (``repair.executor``).

Per broker, in plan order::

    PENDING -> PRECHECKED -> STOPPED -> BACKED_UP -> CHANGED -> STARTED -> HEALTHY -> VERIFIED -> DONE
                  any step fails -> FAILED: a flag on top of the last step completed (a rerun resumes after it)
"""

from __future__ import annotations

import enum
import json
import time
from pathlib import Path
from typing import Any

from fleet_doctor.repair.errors import RepairError
from fleet_doctor.repair.plan import Plan
from fleet_doctor.store import write_atomic


class State(enum.StrEnum):
    PENDING = "pending"
    PRECHECKED = "prechecked"
    STOPPED = "stopped"
    BACKED_UP = "backed_up"
    CHANGED = "changed"
    STARTED = "started"
    HEALTHY = "healthy"
    VERIFIED = "verified"
    DONE = "done"
    FAILED = "failed"


# the steps in order; FAILED is not one of them but a flag on top of the last completed step
ORDER = [s for s in State if s is not State.FAILED]


class Journal:
    """One attempt at a plan (``layout.RepairsDir.attempt``): the state of each broker, every
    remote command, the backups taken, the approval the attempt ran under. A rerun of the same Airflow run reads it
    and resumes; a new run of the same plan is a new attempt with a journal of its own."""

    def __init__(self, path: Path, plan: Plan) -> None:
        self.path = path
        self.unsaved: str | None = None  # why the last write failed, until one succeeds
        if path.is_file():
            self.data = json.loads(path.read_text())
            if self.data["plan_hash"] != plan.hash:
                raise RepairError(f"{path} belongs to plan {self.data['plan_hash'][:12]}, not {plan.hash[:12]}")
        else:
            self.data = {
                "plan_hash": plan.hash,
                "attempt": path.parent.name,
                "status": "running",
                "brokers": {
                    str(b.broker_id): {"state": State.PENDING, "history": [], "backups": []}
                    for b in plan.brokers
                    if b.restart
                },
                "approvals": [],
                "commands": [],
            }
            self.save()

    def broker(self, broker_id: int) -> dict[str, Any]:
        return dict(self.data["brokers"][str(broker_id)])

    def state(self, broker_id: int) -> State:
        """The broker's state as reported: FAILED while its last attempt failed."""
        b = self.data["brokers"][str(broker_id)]
        return State.FAILED if b.get("failed") else State(b["state"])

    def completed(self, broker_id: int) -> State:
        """The last step finished for this broker: a rerun resumes after it (a failure does not erase it)."""
        return State(self.data["brokers"][str(broker_id)]["state"])

    def changing(self, broker_id: int) -> bool:
        """Whether a file of this broker may have been changed (the change step began, or finished). Never in an
        attempt that changes no file (a roll: ``changes_files`` false): its halt keeps the lock only for a broker
        left down."""
        if self.data.get("changes_files") is False:
            return False
        b = self.data["brokers"][str(broker_id)]
        return bool(b.get("changing")) or ORDER.index(State(b["state"])) >= ORDER.index(State.CHANGED)

    def changed_any(self) -> bool:
        """Whether this attempt may have changed a file on any broker (a halt then keeps the cluster lock)."""
        return not self.data.get("dry_run") and any(self.changing(int(b)) for b in self.data["brokers"])

    def left_down(self, broker_id: int) -> bool:
        """Whether a broker this attempt stopped may still be down: its stop was sent and no start of it has been
        confirmed since (``stop_issued`` .. ``up_again``), or it could not be started again after a failure."""
        b = self.data["brokers"][str(broker_id)]
        return bool(b.get("down")) or str(b.get("after_failure", "")).startswith("may be left")

    def stop_issued(self, broker_id: int) -> None:
        """Saved before the stop is sent: from here until ``up_again`` the broker counts as down (a worker that dies
        or a journal write that fails in between leaves the lock held, never a broker down under a released lock)."""
        self.note(broker_id, "down", f"stop issued at {time.time():.0f}")

    def up_again(self, broker_id: int, how: str) -> None:
        """A start of the broker was confirmed (it runs and is registered): it no longer counts as down."""
        b = self.data["brokers"][str(broker_id)]
        if b.pop("down", None) is not None:
            b["history"].append({"state": "up", "ts": time.time(), "detail": how})
            self.save()

    def left_for_human(self) -> list[int]:
        """Brokers a human must look at: changed and not done, or left down."""
        return [
            b
            for b in map(int, self.data["brokers"])
            if (self.changing(b) and self.completed(b) != State.DONE) or self.left_down(b)
        ]

    def needs_human(self) -> bool:
        """A halt that keeps the lock: a file may have changed (on any broker), or a broker may be left down."""
        return self.changed_any() or any(self.left_down(int(b)) for b in self.data["brokers"])

    def touched(self) -> bool:
        """Whether any broker got past its pre-check (stopped, and maybe changed) under this attempt."""
        return any(
            ORDER.index(State(b["state"])) > ORDER.index(State.PRECHECKED) for b in self.data["brokers"].values()
        )

    def advance(self, broker_id: int, state: State, detail: str = "") -> None:
        b = self.data["brokers"][str(broker_id)]
        if state == State.FAILED:
            b["failed"] = detail
        else:
            b["state"] = state
            b.pop("failed", None)
        b["history"].append({"state": state, "ts": time.time(), "detail": detail})
        self.save()

    def note(self, broker_id: int, key: str, detail: Any) -> None:
        """Record ``detail`` under the broker's ``key`` (and in its history), saved at once."""
        b = self.data["brokers"][str(broker_id)]
        b[key] = detail
        b["history"].append({"state": key, "ts": time.time(), "detail": detail})
        self.save()

    def add_backup(self, broker_id: int, backup: dict[str, Any]) -> None:
        self.data["brokers"][str(broker_id)].setdefault("backups", []).append(backup)
        self.save()

    def backups(self, broker_id: int) -> list[dict[str, Any]]:
        return list(self.data["brokers"][str(broker_id)].get("backups", []))

    def approved(self, approval: dict[str, Any]) -> None:
        """The human answer this run goes on under (who, when, which plan): kept with every run of the attempt."""
        self.data.setdefault("approvals", []).append({**approval, "recorded": time.time()})
        self.save()

    def restored(self, broker_id: int) -> None:
        """The broker's backup was put back: it is where the plan found it, so a rerun starts it over (re-verified)."""
        b = self.data["brokers"].get(str(broker_id))
        if b is not None:
            b["state"] = State.PENDING
            b.pop("failed", None)
            b.pop("changing", None)
            b["history"].append({"state": "restored", "ts": time.time(), "detail": "backup put back"})
        self.data["status"] = "restored"
        self.save()

    def save(self) -> None:
        """Written atomically; when the write fails (the repairs volume full) the error is kept (``unsaved``) until
        a later write succeeds: what is on disk is then older than what happened, and the lock stays."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps(self.data, indent=2, default=str).encode())
        except OSError as e:
            self.unsaved = f"{self.path} could not be written: {e}"
            raise
        self.unsaved = None

    def keeps_lock(self) -> str | None:
        """Why this attempt, halted, keeps the cluster lock for a human (None: it may go): a file may have changed,
        or a broker it stopped may be left down."""
        if self.unsaved:
            return f"the journal is behind what happened ({self.unsaved}): the lock stays until a human looks"
        if self.data.get("status") != "done" and self.needs_human():
            return (
                "halted after changing files (or with a broker it stopped left down): the lock stays until a human "
                "resumes this run (clear its task), restores its backups (the cluster's kafka_fleet_restore DAG) or "
                "releases it by hand"
            )
        return None


def attempt_report(journal: dict[str, Any], order: list[int]) -> dict[str, Any]:
    """What an attempt did and did not, per broker in ``order``, from its journal's data (the acting tasks' result)."""
    brokers = journal.get("brokers", {})
    done = [b for b in order if brokers.get(str(b), {}).get("state") == "done"]
    failed = {b: brokers[str(b)]["failed"] for b in order if brokers.get(str(b), {}).get("failed")}
    untouched = [b for b in order if brokers.get(str(b), {}).get("state", "pending") == "pending" and b not in failed]
    partly = {b: brokers[str(b)]["state"] for b in order if b not in done and b not in untouched}
    return {
        "status": journal.get("status"),
        "error": journal.get("error"),
        "done": done,
        "failed": failed,
        "partly_done": partly,
        "untouched": untouched,
    }
