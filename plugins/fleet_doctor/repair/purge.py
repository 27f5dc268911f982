"""Deleting a repair's quarantine: a plan of its own, approved by a person, naming what is freed and how old it is.

A repair never deletes what it takes away from a broker: index files go to ``<partition dir>/fleet-doctor-quarantine/
<plan>/``, a stray replica to ``<log dir's parent>/fleet-doctor-stray-quarantine/<log dir>/<plan>/`` (``repair.plan``).
They hold disk until someone deletes them; this is how, for any repair plan, on either metadata mode:

- **plan** (``purge_plan``): every broker of the inventory (or those named) is asked what the plan quarantined
  there (``BrokerHost.quarantined``: each entry's bytes and when it was moved there, read beside the running
  broker); the entries quarantined at least ``older_than_days`` ago are planned for deletion, the younger ones
  listed as kept. The plan is content-addressed like a repair's (``Plan``: its brokers restart nothing).
- **approve**: its own approval (``approval_text.purge_request``): how many entries, how many bytes, the oldest and
  the newest, per broker.
- **purge** (``run_purge``): under the cluster's repair lock (one change per cluster), broker by broker, each entry
  deleted only while it is still in that quarantine with the planned size (``on_broker``'s ``purge``: nothing
  followed, an entry that changed is refused); an entry gone already is done. No broker stops: Kafka's files are not
  touched. The result (``result-<run>.json``) says what was deleted and freed.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from fleet_doctor import inventory, layout
from fleet_doctor.repair.broker import BrokerHost
from fleet_doctor.repair.errors import RepairError
from fleet_doctor.repair.plan import BrokerPlan, FileAction, Plan
from fleet_doctor.repair.restore import find_plan

LOG = logging.getLogger(__name__)
PURGE_ACTION = "purge"
DAY_S = 86400.0


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def purge_plan(
    repairs: layout.RepairsDir,
    inv: inventory.Inventory,
    plan: str,
    broker_ids: list[int],
    older_than_days: float,
    host: Callable[[int], BrokerHost],
    now: float | None = None,
) -> Plan:
    """The plan to delete what the repair plan ``plan`` (its hash or a 12+ digit prefix) quarantined on
    ``broker_ids`` (default every broker of the inventory), quarantined at least ``older_than_days`` ago; ``host``:
    broker id -> its host, connected (closed here)."""
    if older_than_days < 0:
        raise RepairError(f"older_than_days {older_than_days} is negative")
    plan_dir = find_plan(repairs.root, plan)
    repair = Plan.from_json((plan_dir / layout.PLAN).read_text())
    if repair.cluster != inv.cluster:
        raise RepairError(f"plan {plan_dir.name[:12]} is cluster {repair.cluster}'s, not {inv.cluster}'s")
    now = time.time() if now is None else now
    cutoff = now - older_than_days * DAY_S
    targets = sorted(set(broker_ids)) or [b.id for b in inv.brokers]
    brokers, kept, entries = [], [], {}
    for bid in targets:
        h = host(bid)
        try:
            found = h.quarantined(plan_dir.name)
        finally:
            h.close()
        due = [e for e in found if e["quarantined_at"] <= cutoff]
        kept += [{"broker_id": bid, **e} for e in found if e["quarantined_at"] > cutoff]
        actions = tuple(
            FileAction(
                PURGE_ACTION,
                e["path"],
                "stray-dir" if e["kind"] == "dir" else "quarantine",
                None,
                None,
                f"{e['kind']}, {e['bytes']} bytes, quarantined {_when(e['quarantined_at'])}",
            )
            for e in sorted(due, key=_path)
        )
        if actions:
            brokers.append(BrokerPlan(bid, False, False, actions))
            entries[str(bid)] = [
                {"path": e["path"], "kind": e["kind"], "bytes": e["bytes"], "quarantined": _when(e["quarantined_at"])}
                for e in sorted(due, key=_path)
            ]
    scope = {"purge_of": plan_dir.name, "older_than_days": older_than_days, "entries": entries}
    return Plan(repair.cluster, f"purge-{plan_dir.name[:12]}", scope, tuple(brokers), (), tuple(kept))


def _path(entry: Mapping[str, Any]) -> str:
    return str(entry["path"])


def run_purge(p: Plan, host: Callable[[int], BrokerHost], fence: Callable[[], None], report: dict[str, Any]) -> None:
    """Delete the purge plan's entries, broker by broker (``fence`` before each): ``report`` says what was deleted
    and freed (``deleted``, ``freed_bytes``); RepairError when a broker's deletion is refused or fails (the entries
    deleted before it stay deleted, the report says which)."""
    report.setdefault("deleted", {})
    report.setdefault("freed_bytes", 0)
    for b in p.brokers:
        fence()
        entries: list[Mapping[str, Any]] = p.scope["entries"][str(b.broker_id)]
        h = host(b.broker_id)
        try:
            done = h.purge([dict(e) for e in entries], p.scope["purge_of"])
        finally:
            h.close()
        report["deleted"][str(b.broker_id)] = done
        report["freed_bytes"] += sum(int(d.rsplit("deleted ", 1)[1].split()[0]) for d in done if "deleted " in d)
        LOG.info("purge %s: broker %s: %d entr(ies) done", p.hash[:12], b.broker_id, len(done))
