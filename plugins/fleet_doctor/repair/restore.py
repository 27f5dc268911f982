"""Undoing a repair (dags/kafka_fleet_restore.py): an attempt's backups put back over the brokers' files, as a plan of
its own that a human approves, run by the repair's own state machine (``Executor``) with the same gates.

The restore plan names, per broker, every file that goes back with the checksum it must have, the backup tarballs
they come from (with their own checksums), and the restart order, the controller last. Its hash is what the human
approves. Run, per broker: pre-check (everything registered, nothing under-replicated beyond what this restore puts
back, min ISR kept), stop, back up the files as they are now (a restore changes a broker too), check it is still
down, put the backup back (each tarball's checksum checked on the broker before it is unpacked; only the manifest's
files, never an absolute or ``..`` member), files owned as their partition dir is and equal to the manifest, start,
health gates. The repair attempt's journal then marks the broker pending again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fleet_doctor import inventory, layout
from fleet_doctor.repair import backups
from fleet_doctor.repair.broker import BrokerHost
from fleet_doctor.repair.errors import RepairError
from fleet_doctor.repair.executor import Executor, Step
from fleet_doctor.repair.journal import Journal, State
from fleet_doctor.repair.kraft_refusals import plan_refusals
from fleet_doctor.repair.plan import BrokerPlan, FileAction, Plan, planned_path_ok, restart_order

PLAN_HASH_RE = re.compile(r"[0-9a-f]{12,64}")
RESTORE_ACTION = "restore"


def find_plan(repairs: Path, plan: str) -> Path:
    """The repair plan dir a hash (or a prefix of 12+ hex digits) names: exactly one, inside ``repairs``."""
    if not isinstance(plan, str) or not PLAN_HASH_RE.fullmatch(plan):
        raise RepairError(f"plan {plan!r} is not a plan hash (12 to 64 lowercase hex digits)")
    root = repairs.resolve()
    if not root.is_dir():
        raise RepairError(f"no repairs dir {root}")
    known = [
        d for d in root.iterdir() if d.name.startswith(plan) and d.is_dir() and not d.is_symlink() and d.parent == root
    ]
    known = [d for d in known if (d / layout.PLAN).is_file() and d.resolve().parent == root]
    if len(known) != 1:
        raise RepairError(f"{len(known)} repair plans match {plan!r} in {root}")
    return known[0]


def _attempts_with_backups(plan_dir: Path) -> list[Path]:
    """The plan's attempts that hold a backup, oldest first."""
    found = []
    for journal in layout.RepairsDir(plan_dir.parent).attempts(plan_dir.name).glob(f"*/{layout.JOURNAL}"):
        data = json.loads(journal.read_text())
        if any(b.get("backups") for b in data["brokers"].values()):
            first = min((h["ts"] for b in data["brokers"].values() for h in b["history"]), default=0.0)
            found.append((first, journal.parent))
    return [d for _, d in sorted(found)]


def find_attempt(plan_dir: Path, attempt: str | None) -> Path:
    """The attempt whose backups go back: the one named (its Airflow run id), else the newest with a backup."""
    attempts = _attempts_with_backups(plan_dir)
    if attempt:
        named = [d for d in attempts if d.name in (attempt, layout.attempt_name(attempt))]
        if not named:
            raise RepairError(f"plan {plan_dir.name[:12]} has no attempt {attempt!r} with a backup")
        return named[0]
    if not attempts:
        raise RepairError(f"plan {plan_dir.name[:12]} has no backup (no attempt got to one)")
    return attempts[-1]


def _partition_of(path: str) -> tuple[str | None, int | None]:
    name = path.rsplit("/", 2)[-2] if path.count("/") >= 2 else ""
    topic, _, part = name.rpartition("-")
    return (topic, int(part)) if topic and part.isdigit() else (None, None)


def restore_plan(
    repairs: layout.RepairsDir,
    inv: inventory.Inventory,
    plan: str,
    broker_ids: list[int],
    start: bool,
    controller: int | None,
    attempt: str | None = None,
    gates: Mapping[str, Any] | None = None,
) -> Plan:
    """What a restore will do, for approval: per broker the files put back (path, sha256, from which backup), the
    backups' checksums, the order (the controller last), and ``gates`` (the form's, ``gates.gates_of`` with
    ``RESTORE_GATE_PARAMS``: part of the hash and the approval text, run as approved). Every backup is checked here
    already: its checksum, and its members exactly the manifest's files, inside the broker's log dirs."""
    plan_dir = find_plan(repairs.root, plan)
    attempt_dir = find_attempt(plan_dir, attempt)
    repair = Plan.from_json((plan_dir / layout.PLAN).read_text())
    journal = json.loads((attempt_dir / layout.JOURNAL).read_text())
    with_backup = sorted(int(b) for b, d in journal["brokers"].items() if d.get("backups"))
    targets = sorted(set(broker_ids)) or with_backup
    if not start and len(targets) > 1:
        raise RepairError(
            f"start=false for {len(targets)} brokers at once is refused: it would leave them all stopped (name one)"
        )
    missing = sorted(set(targets) - set(with_backup))
    if missing:
        raise RepairError(f"plan {plan_dir.name[:12]} attempt {attempt_dir.name} has no backup for broker(s) {missing}")
    brokers, taken = [], {}
    for bid in targets:
        log_dirs = inv.broker(bid).log_dirs
        files: dict[str, tuple[str, int]] = {}
        taken[str(bid)] = []
        for bk in journal["brokers"][str(bid)]["backups"]:
            tarball = attempt_dir / bk["tarball"]
            if not tarball.is_file() or backups.sha256_file(tarball) != bk["sha256"]:
                raise RepairError(f"broker {bid}: backup {tarball} is missing or does not match its checksum")
            if backups.tar_manifest(tarball) != bk["files"]:
                raise RepairError(f"broker {bid}: backup {tarball} does not hold exactly its manifest's files")
            outside = [p for p in bk["files"] if not planned_path_ok(RESTORE_ACTION, p, log_dirs)]
            if outside:
                raise RepairError(f"broker {bid}: backup {tarball} holds files outside its log dirs: {outside[:5]}")
            taken[str(bid)].append({"tarball": bk["tarball"], "sha256": bk["sha256"], "files": bk["files"]})
            files.update({p: (d, bk["n"]) for p, d in bk["files"].items()})  # the newest backup of a file wins
        actions = [
            FileAction(RESTORE_ACTION, p, "restore", *_partition_of(p), f"backup {n}, sha256 {d}")
            for p, (d, n) in sorted(files.items())
        ]
        brokers.append(BrokerPlan(bid, bid == controller, True, tuple(actions)))
    scope = {
        "restore_of": plan_dir.name,
        "attempt": attempt_dir.name,
        "start": start,
        "backups": taken,
        "repair_audit_run": repair.audit_run,
    }
    if gates is not None:
        scope["gates"] = dict(gates)
    voters = [c.id for c in inv.controllers] if inv.kraft else []
    if inv.kraft:  # the same refusals as the repair's: nothing goes back onto a voter's metadata, nor a topic-ID file
        refused = plan_refusals([a for b in brokers for a in b.actions], [c.metadata_log_dir for c in inv.controllers])
        if refused:
            raise RepairError(
                f"restore of plan {plan_dir.name[:12]} refused on KRaft cluster {inv.cluster}: " + "; ".join(refused)
            )
    order = restart_order(brokers, controller, voters)
    return Plan(repair.cluster, f"restore-{plan_dir.name[:12]}", scope, tuple(order), (), ())


def stored_restore_plan(repairs: layout.RepairsDir, planned: dict[str, Any]) -> Plan:
    """The restore plan the plan task saved, checked to hash to ``planned["hash"]`` (both ids validated first)."""
    restore_of, digest = str(planned.get("restore_of")), str(planned.get("hash"))
    if not (PLAN_HASH_RE.fullmatch(restore_of) and len(restore_of) == 64 and PLAN_HASH_RE.fullmatch(digest)):
        raise RepairError(f"not a restore plan: {planned.get('restore_of')!r} / {planned.get('hash')!r}")
    path = repairs.restore_dir(restore_of, digest) / layout.PLAN
    if not path.is_file():
        raise RepairError(f"no restore plan {digest!r} for repair {restore_of[:12]}")
    p = Plan.from_json(path.read_text())
    if p.hash != digest or p.scope.get("restore_of") != restore_of:
        raise RepairError(f"the stored restore plan does not hash to the approved {digest[:12]}: refusing")
    return p


def still_needs_human(repair_journal: Path, plan: Plan, restored: set[int]) -> list[int]:
    """Brokers of the halted attempt that this restore did not put back and that still need a human (changed and
    not done, or left stopped)."""
    if not repair_journal.is_file():
        return []
    return [b for b in Journal(repair_journal, plan).left_for_human() if b not in restored]


class RestoreExecutor(Executor):
    """The repair's state machine with the change being "put the backup back"; started again only with ``start``.
    ``source``: the repair attempt's dir, where the backups are; ``repair``: the repair plan whose attempt's
    backups go back."""

    def __init__(self, plan: Plan, source: Path, repair: Plan, *args: Any, **kwargs: Any) -> None:
        super().__init__(plan, *args, **kwargs)
        self.source = source
        self.repair = repair

    def steps(self) -> list[tuple[State, Step]]:
        steps = super().steps()
        if not self.plan.scope["start"]:  # left stopped (one broker only): nothing to start, gate or verify
            skipped = (State.STARTED, State.HEALTHY, State.VERIFIED)
            steps = [(s, (lambda b, h: "start=false: left stopped") if s in skipped else f) for s, f in steps]
        return steps

    def _spool_bytes(self, b: BrokerPlan) -> int:
        """The largest of ``b``'s backups: each is sent, spooled and put back in turn (``BrokerHost.put_back``)."""
        sizes = [(self.source / bk["tarball"]).stat().st_size for bk in self.plan.scope["backups"][str(b.broker_id)]]
        return max(sizes, default=0)

    def _pending_replicas(self, current: BrokerPlan) -> frozenset[tuple[str, int, int]]:
        """Every replica this restore puts back, the current broker's too: what it restores is the state the repair
        found, which may be out of ISR (seed-004's drifted partition.metadata)."""
        return frozenset(
            (a.topic, a.partition, o.broker_id)
            for o in self.plan.brokers
            for a in o.actions
            if a.topic is not None and a.partition is not None
        )

    def backup(self, b: BrokerPlan, host: BrokerHost) -> str:
        """The files as they are now, before they are overwritten (only those that exist)."""
        present, _ = host.sums(b.backup_paths)
        taken = self.journal.backups(b.broker_id)
        if taken and all(taken[-1]["files"].get(p) == d for p, d in present.items()):
            return "a backup of this restore already holds the files as they are now"
        if not present:
            return "none of the files exists now: nothing to back up"
        bk = self._take_backup(b, host, present, len(taken) + 1)
        self.journal.add_backup(b.broker_id, bk)
        return f"{len(present)} file(s) as they were before the restore in {bk['tarball']}"

    def change(self, b: BrokerPlan, host: BrokerHost) -> str:
        host.identity()
        self.still_down(b, host)
        self.journal.note(b.broker_id, "changing", True)
        for bk in self.plan.scope["backups"][str(b.broker_id)]:
            self._put_back(b, host, self.source / bk["tarball"], bk)
        self._mark_restored(b)
        expected = {a.path: a.reason.rsplit(" ", 1)[-1] for a in b.actions}
        host.own_as_parent(expected)
        present, missing = host.sums(sorted(expected))
        if missing or present != expected:
            raise RepairError(f"broker {b.broker_id}: restored files do not match the backup manifest")
        dirs = sorted({p.rsplit("/", 1)[0] for p in expected})
        owner = host.owners([*sorted(expected), *dirs])
        wrong = [p for p in expected if owner.get(p) != owner.get(p.rsplit("/", 1)[0])]
        if wrong:
            raise RepairError(f"broker {b.broker_id}: restored files not owned as their partition dir: {wrong[:5]}")
        return f"{len(expected)} file(s) put back, equal to the manifest, owned as their partition dirs"

    def _put_back(self, b: BrokerPlan, host: BrokerHost, tarball: Path, bk: dict[str, Any]) -> None:
        """The tarball checked here (its checksum, its members the restore plan's), then put back on the broker."""
        if backups.sha256_file(tarball) != bk["sha256"]:
            raise RepairError(f"broker {b.broker_id}: {tarball} does not match its checksum")
        members = backups.tar_manifest(tarball)
        if members != bk["files"] or not set(members) <= {a.path for a in b.actions}:
            raise RepairError(f"broker {b.broker_id}: {tarball} holds other files than the restore plan's")
        host.put_back(tarball, bk["sha256"], backups.member_names(tarball))

    def verify(self, b: BrokerPlan, host: BrokerHost) -> str:
        return "restored files checked against the manifest before the start"

    def _mark_restored(self, b: BrokerPlan) -> None:
        """The repair attempt's journal: this broker is where the plan found it, so a rerun of that run starts it
        over (re-verified). Marked as soon as its files are back, broker by broker (a later halt keeps it)."""
        journal = self.source / layout.JOURNAL
        if journal.is_file():
            Journal(journal, self.repair).restored(b.broker_id)
