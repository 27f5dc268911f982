"""The repair lock as the fleet page and the metrics show it: the cluster's lock (znodes in its ZooKeeper,
``zookeeper.lock``) as last seen, mirrored in the cluster's store (``layout.REPAIR_LOCK``).

Why a mirror: reading every cluster's ZooKeeper at each page view or scrape makes the page as slow as the slowest
ensemble of the fleet, and the api-server may not reach the ensembles at all (the workers do). So whoever sees the
lock says what it saw:

- a repair or a restore when it has taken the lock, and again when it is done with it (released, kept for a human
  and why, handed back, or left alone after its session was lost), read back from ZooKeeper (``repair.session``);
- every audit of a ZooKeeper cluster, from the session it reads the brokers' registrations in (so a lock released
  by hand shows as free after the next audit).

Which observation is newer is ZooKeeper's to say, not the writers' clocks (workers' clocks differ, and a read-only
session may read a lagging server): each carries ``zxid``, the newest transaction that changed the lock (the lock
znode's ``mzxid``, the ``pzxid`` of its two parents: a holder created, rewritten, handed over or deleted, a liveness
node come or gone). A mirror is replaced only by an observation of a zxid at least as new; an older one (a stale read,
a writer that lost the race) leaves it. An audit that sees the very holder a repair said it kept, still without a
worker, keeps the repair's reason. Best effort: a mirror that cannot be written is logged, never fails a repair or an
audit, and two writers at the same instant may lose one write until the next observation; what the page shows says
when, and by whom, the lock was seen.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fleet_doctor.audit.summary import TIME_FORMAT
from fleet_doctor.layout import REPAIR_LOCK, dir_lock_files
from fleet_doctor.zookeeper.lock import ACTIVE_ROOT, LOCK_ROOT, lock_holder

LOG = logging.getLogger(__name__)
FREE, HELD, NEEDS_HUMAN = "free", "held", "needs-human"


def unix_time(value: Any) -> float | None:
    """A plausible Unix time (2001 to 5138), else None: a damaged mirror must not take a page down."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and 1e9 <= value < 1e11 else None


@dataclass(frozen=True)
class LockState:
    """The cluster's repair lock as seen at ``observed_at`` (Unix time) by ``seen_by`` (``audit``, ``repair``,
    ``restore``, ``roll``, ``purge``); ``zxid``: the newest ZooKeeper transaction that changed it (what orders
    observations)."""

    held: bool
    observed_at: float
    seen_by: str
    holder: dict[str, Any] | None = None  # plan_hash, step, run_id, since, cluster (zookeeper.lock)
    worker_alive: bool | None = None  # the holder's liveness node: a worker is executing the repair now
    kept: str | None = None  # why the lock stays for a human (the repair that kept it said so)
    zxid: int | None = None

    @property
    def needs_human(self) -> bool:
        """Held with no worker executing: a halted repair (or a crashed worker's) waits for a person
        (docs/repair.md, "After a halt")."""
        return self.held and self.worker_alive is False

    @property
    def state(self) -> str:
        """``free``, ``held`` (a worker executing, or not known) or ``needs-human``."""
        return NEEDS_HUMAN if self.needs_human else HELD if self.held else FREE

    def describe(self) -> str:
        """One line for people: who holds it, since when, and whether a human must act."""
        if not self.held:
            return "free"
        h = self.holder or {}
        plan = str(h.get("plan_hash") or "")[:12]
        since = unix_time(h.get("since"))
        when = f", since {time.strftime(TIME_FORMAT, time.gmtime(since))}" if since is not None else ""
        text = f"held by run {h.get('run_id')} (plan {plan}, step {h.get('step')}{when})"
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
        observed = unix_time(data.get("observed_at"))
        zxid = data.get("zxid")
        if observed is None or not (zxid is None or (isinstance(zxid, int) and not isinstance(zxid, bool))):
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
            zxid=zxid,
        )


def seen_in_zookeeper(zk: Any, key: str, seen_by: str, kept: str | None = None) -> LockState:
    """The lock of the cluster whose id is ``key`` as the kazoo session ``zk`` sees it now (``kept``: why the one
    who saw it keeps it), with the zxid of the newest change to it."""
    observed = time.time()
    zxids = [stat.pzxid for stat in (zk.exists(LOCK_ROOT), zk.exists(ACTIVE_ROOT)) if stat is not None]
    lock = zk.exists(f"{LOCK_ROOT}/{key}")
    holder = lock_holder(zk, key) if lock is not None else None
    if lock is not None:
        zxids.append(lock.mzxid)
    alive = zk.exists(f"{ACTIVE_ROOT}/{key}") is not None if holder is not None else None
    held = holder is not None
    return LockState(held, observed, seen_by, holder, alive, kept if held else None, max(zxids) if zxids else 0)


def seen_in_dir(lock_dir: Path, key: str, seen_by: str, kept: str | None = None) -> LockState:
    """The lock of a cluster without ZooKeeper (``repair.dir_lock``: its files in ``lock_dir``, ``layout``) as they
    say now: its holder, and whether a worker's liveness file is there. No zxid orders these: the observers' clocks
    do. ValueError when the holder record is not one (``DirLock`` refuses it alike)."""
    files = dir_lock_files(lock_dir, key)
    try:
        record = json.loads(files["holder"].read_bytes())
    except FileNotFoundError:
        record = None
    if record is not None and not (isinstance(record, dict) and isinstance(record.get("holder"), dict)):
        raise ValueError(f"{files['holder']}: not a repair lock record")
    holder = dict(record["holder"]) if record else None
    held = holder is not None
    alive = files["active"].exists() if held else None
    return LockState(held, time.time(), seen_by, holder, alive, kept if held else None, None)


def _same_holder(a: LockState, b: LockState) -> bool:
    ha, hb = a.holder or {}, b.holder or {}
    return a.held and b.held and (ha.get("plan_hash"), ha.get("run_id")) == (hb.get("plan_hash"), hb.get("run_id"))


def _older(new: LockState, old: LockState) -> bool:
    """Whether ``new`` was seen before ``old``: by zxid when both carry one, else by the observers' clocks."""
    if new.zxid is not None and old.zxid is not None:
        return new.zxid < old.zxid
    return new.observed_at < old.observed_at


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
        if old is not None and _older(state, old):
            return
        if old is not None and old.kept and not state.kept and state.needs_human and _same_holder(old, state):
            state = LockState(**{**state.to_json(), "kept": old.kept})
        store.write_text(REPAIR_LOCK, json.dumps(state.to_json(), indent=2, default=str) + "\n")
    except Exception as e:
        LOG.warning(
            "the repair lock's state could not be mirrored in %s (the fleet page shows an older one): %s",
            store.url(REPAIR_LOCK),
            e,
        )
