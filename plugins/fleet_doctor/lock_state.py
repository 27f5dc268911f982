"""The repair lock as the fleet page and the metrics show it: the cluster's lock (znodes in its ZooKeeper,
``zookeeper.lock``) as last seen, mirrored in the cluster's store (``layout.REPAIR_LOCK``).

Why a mirror: reading every cluster's ZooKeeper at each page view or scrape makes the page as slow as the slowest
ensemble of the fleet, and the api-server may not reach the ensembles at all (the workers do). So whoever sees the
lock says what it saw:

- a repair or a restore when it has taken the lock, and again when it is done with it (released, kept for a human
  and why, or handed back), read back from ZooKeeper (``repair.session``);
- every audit of a ZooKeeper cluster, from the session it reads the brokers' registrations in (so a lock released
  by hand shows as free after the next audit).

A newer observation replaces an older one, never the reverse; an audit that sees the very holder a repair said it
kept keeps the repair's reason. Best effort: a mirror that cannot be written is logged, never fails a repair or an
audit; what the page shows says when, and by whom, the lock was seen.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

from fleet_doctor.layout import REPAIR_LOCK
from fleet_doctor.zookeeper.lock import ACTIVE_ROOT, lock_holder

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class LockState:
    """The cluster's repair lock as seen at ``observed_at`` (Unix time) by ``seen_by`` (``audit``, ``repair``,
    ``restore``)."""

    held: bool
    observed_at: float
    seen_by: str
    holder: dict[str, Any] | None = None  # plan_hash, step, run_id, since, cluster (zookeeper.lock)
    worker_alive: bool | None = None  # the holder's liveness node: a worker is executing the repair now
    kept: str | None = None  # why the lock stays for a human (the repair that kept it said so)

    @property
    def needs_human(self) -> bool:
        """Held with no worker executing: a halted repair (or a crashed worker's) waits for a person
        (docs/repair.md, "After a halt")."""
        return self.held and self.worker_alive is False

    def describe(self) -> str:
        """One line for people: who holds it, since when, and whether a human must act."""
        if not self.held:
            return "free"
        h = self.holder or {}
        plan = str(h.get("plan_hash") or "")[:12]
        since = h.get("since")
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(since))) if isinstance(since, int | float) else ""
        text = f"held by run {h.get('run_id')} (plan {plan}, step {h.get('step')}" + (f", since {when}" if when else "")
        text += ")"
        if self.worker_alive:
            return text + ": executing"
        if self.worker_alive is False:
            text += ": no worker executing it, a person must resume, restore or release it"
        return text + (f"; kept: {self.kept}" if self.kept else "")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> LockState | None:
        """The state in ``data`` (a mirror's or a discovery's JSON), None when it is not one."""
        if not isinstance(data, dict) or not isinstance(data.get("held"), bool):
            return None
        try:
            observed = float(data["observed_at"])
        except (KeyError, TypeError, ValueError):
            return None
        holder = data.get("holder")
        alive = data.get("worker_alive")
        return cls(
            held=data["held"],
            observed_at=observed,
            seen_by=str(data.get("seen_by") or "?"),
            holder=dict(holder) if isinstance(holder, dict) else None,
            worker_alive=alive if isinstance(alive, bool) else None,
            kept=str(data["kept"]) if data.get("kept") else None,
        )


def seen_in_zookeeper(zk: Any, key: str, seen_by: str, kept: str | None = None) -> LockState:
    """The lock of the cluster whose id is ``key`` as the kazoo session ``zk`` sees it now (``kept``: why the one
    who saw it keeps it)."""
    observed = time.time()
    holder = lock_holder(zk, key)
    alive = zk.exists(f"{ACTIVE_ROOT}/{key}") is not None if holder is not None else None
    return LockState(holder is not None, observed, seen_by, holder, alive, kept if holder is not None else None)


def _same_holder(a: LockState, b: LockState) -> bool:
    ha, hb = a.holder or {}, b.holder or {}
    return a.held and b.held and (ha.get("plan_hash"), ha.get("run_id")) == (hb.get("plan_hash"), hb.get("run_id"))


def read(store: Any) -> LockState | None:
    """The mirror in the cluster's store ``store``, None when no one has seen the lock yet (or the mirror is not
    one: logged). StoreError when the store cannot be read or the mirror is not JSON."""
    data = store.read_json(REPAIR_LOCK)
    state = LockState.from_json(data) if data is not None else None
    if data is not None and state is None:
        LOG.warning("%s: not a repair lock state (ignored): %.200r", store.url(REPAIR_LOCK), data)
    return state


def record(store: Any, state: LockState | None) -> None:
    """Mirror ``state`` in the cluster's store ``store`` unless a newer one is there; never raises."""
    if state is None:
        return
    try:
        try:
            old = read(store)
        except Exception:  # an unreadable mirror: this observation replaces it
            old = None
        if old is not None and old.observed_at > state.observed_at:
            return
        if old is not None and old.kept and not state.kept and _same_holder(old, state):
            state = LockState(**{**state.to_json(), "kept": old.kept})
        store.write_text(REPAIR_LOCK, json.dumps(state.to_json(), indent=2, default=str) + "\n")
    except Exception as e:
        LOG.warning(
            "the repair lock's state could not be mirrored in %s (the fleet page shows an older one): %s",
            store.url(REPAIR_LOCK),
            e,
        )
