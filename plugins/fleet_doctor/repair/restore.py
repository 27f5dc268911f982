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
import shlex
import tarfile
import time
from pathlib import Path
from typing import Any

from fleet_doctor import inventory
from fleet_doctor.remote import Remote
from fleet_doctor.repair.executor import (
    Executor,
    Gates,
    Journal,
    RepairError,
    State,
    _sha256,
    attempt_name,
    locked,
    planned_path_ok,
    remote_sums,
    tar_manifest,
)
from fleet_doctor.repair.plan import FILES_SHOWN, HASH_LINE, BrokerPlan, FileAction, Plan, controller_last, md_cell
from fleet_doctor.repair.tasks import cluster_for, finish, gates_from, lock_fence, repairs_dir, ssh_connect
from fleet_doctor.settings import Settings, safe_run_id
from fleet_doctor.store import write_atomic
from fleet_doctor.zookeeper import cluster_session
from fleet_doctor.zookeeper.lock import ACTIVE_ROOT, LockHeld, acquire_lock, hand_back, hand_over, lock_holder

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
    known = [d for d in known if (d / "plan.json").is_file() and d.resolve().parent == root]
    if len(known) != 1:
        raise RepairError(f"{len(known)} repair plans match {plan!r} in {root}")
    return known[0]


def _attempts_with_backups(plan_dir: Path) -> list[Path]:
    """The plan's attempts (``attempts/<run>``) that hold a backup, oldest first."""
    found = []
    for journal in (plan_dir / "attempts").glob("*/journal.json"):
        data = json.loads(journal.read_text())
        if any(b.get("backups") for b in data["brokers"].values()):
            first = min((h["ts"] for b in data["brokers"].values() for h in b["history"]), default=0.0)
            found.append((first, journal.parent))
    return [d for _, d in sorted(found)]


def find_attempt(plan_dir: Path, attempt: str | None) -> Path:
    """The attempt whose backups go back: the one named (its Airflow run id), else the newest with a backup."""
    attempts = _attempts_with_backups(plan_dir)
    if attempt:
        named = [d for d in attempts if d.name in (attempt, attempt_name(attempt))]
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
    settings: Settings,
    plan: str,
    broker_ids: list[int],
    start: bool,
    controller: int | None,
    attempt: str | None = None,
) -> Plan:
    """What a restore will do, for approval: per broker the files put back (path, sha256, from which backup), the
    backups' checksums, the order (the controller last). Every backup is checked here already: its checksum, and
    its members exactly the manifest's files, inside the broker's log dirs."""
    plan_dir = find_plan(repairs_dir(settings), plan)
    attempt_dir = find_attempt(plan_dir, attempt)
    repair = Plan.from_json((plan_dir / "plan.json").read_text())
    journal = json.loads((attempt_dir / "journal.json").read_text())
    with_backup = sorted(int(b) for b, d in journal["brokers"].items() if d.get("backups"))
    targets = sorted(set(broker_ids)) or with_backup
    if not start and len(targets) > 1:
        raise RepairError(
            f"start=false for {len(targets)} brokers at once is refused: it would leave them all stopped (name one)"
        )
    missing = sorted(set(targets) - set(with_backup))
    if missing:
        raise RepairError(f"plan {plan_dir.name[:12]} attempt {attempt_dir.name} has no backup for broker(s) {missing}")
    inv = inventory.load(settings.inventory)
    brokers, backups = [], {}
    for bid in targets:
        log_dirs = inv.broker(bid).log_dirs
        files: dict[str, tuple[str, int]] = {}
        backups[str(bid)] = []
        for bk in journal["brokers"][str(bid)]["backups"]:
            tarball = attempt_dir / bk["tarball"]
            if not tarball.is_file() or _sha256(tarball) != bk["sha256"]:
                raise RepairError(f"broker {bid}: backup {tarball} is missing or does not match its checksum")
            if tar_manifest(tarball) != bk["files"]:
                raise RepairError(f"broker {bid}: backup {tarball} does not hold exactly its manifest's files")
            outside = [p for p in bk["files"] if not planned_path_ok(RESTORE_ACTION, p, log_dirs)]
            if outside:
                raise RepairError(f"broker {bid}: backup {tarball} holds files outside its log dirs: {outside[:5]}")
            backups[str(bid)].append({"tarball": bk["tarball"], "sha256": bk["sha256"], "files": bk["files"]})
            files.update({p: (d, bk["n"]) for p, d in bk["files"].items()})  # the newest backup of a file wins
        actions = [
            FileAction(RESTORE_ACTION, p, "restore", *_partition_of(p), f"backup {n}, sha256 {d}")
            for p, (d, n) in sorted(files.items())
        ]
        is_controller = bid == controller
        brokers.append(BrokerPlan(bid, is_controller, True, actions))
    scope = {
        "restore_of": plan_dir.name,
        "attempt": attempt_dir.name,
        "start": start,
        "backups": backups,
        "repair_audit_run": repair.audit_run,
    }
    return Plan(repair.cluster, f"restore-{plan_dir.name[:12]}", scope, controller_last(brokers, controller), [], [])


def _files(p: Plan) -> int:
    return sum(len(b.actions) for b in p.brokers)


def restore_subject(p: Plan) -> str:
    """The restore approval's headline (the restore task checks the request showed exactly this)."""
    left = "" if p.scope["start"] else ", left stopped"
    return (
        f"Kafka restore {md_cell(p.cluster, table=False)} plan {p.hash[:12]}: put back {_files(p)} file(s) on "
        f"broker(s) {', '.join(map(str, p.restart_order))}{left} from repair {p.scope['restore_of'][:12]}"
    )


def restore_approve_option(p: Plan) -> str:
    """The restore approval's one "yes": what approving does (and that the broker stays stopped with
    ``start=false``), and which restore plan. The restore task accepts exactly this answer (``approval.check``)."""
    n = len(p.restart_order)
    left = "" if p.scope["start"] else ", left stopped"
    return f"Approve: put back {_files(p)} file(s) on {n} broker(s){left} (restore {p.hash[:12]})"


def restore_markdown(p: Plan) -> str:
    scope = p.scope
    lines = [
        f"**Restore** of repair plan `{scope['restore_of'][:16]}` (attempt {md_cell(scope['attempt'], table=False)}) "
        f"on cluster {md_cell(p.cluster, table=False)}.",
        "",
        f"Order (the controller last): {', '.join(str(b) for b in p.restart_order)}. "
        + ("Each broker is started again and gated (ISR, healthy polls)." if scope["start"] else "")
        + ("" if scope["start"] else "The broker is **left stopped** after its files are back (start=false)."),
        "",
        "Per broker: pre-check, stop, back up the files as they are now, put the backup back (checksums checked "
        "before unpacking), files checked against the manifest below.",
        "",
    ]
    for b in p.brokers:
        lines += [f"### Broker {b.broker_id}{' (controller)' if b.is_controller else ''}", ""]
        for bk in scope["backups"][str(b.broker_id)]:
            lines.append(f"- backup {md_cell(bk['tarball'], table=False)} sha256 `{bk['sha256'][:16]}…`")
        lines += ["", "| file | sha256 after restore |", "|---|---|"]
        lines += [f"| {md_cell(a.path)} | `{a.reason.rsplit(' ', 1)[-1]}` |" for a in b.actions[:FILES_SHOWN]]
        if len(b.actions) > FILES_SHOWN:  # the buttons come after the text: plan.json has every file and checksum
            listed = md_cell(f"{scope['restore_of']}/restores/{p.hash}/plan.json")
            lines.append(f"| … and {len(b.actions) - FILES_SHOWN} more: every file in {listed} of the repairs dir | |")
        lines.append("")
    lines.append(HASH_LINE.format(p.hash))  # the restore task checks the approval names this plan
    return "\n".join(lines)


def make_restore_plan(settings: Settings, params: dict[str, Any], controller: int | None) -> dict[str, Any]:
    """The restore DAG's plan task: the plan, saved under ``<repairs>/<hash>/restores/<restore hash>/``."""
    p = restore_plan(
        settings,
        str(params.get("plan") or ""),
        [int(b) for b in params.get("brokers") or ()],
        bool(params.get("start", True)),
        controller,
        str(params.get("attempt") or "") or None,
    )
    d = repairs_dir(settings) / p.scope["restore_of"] / "restores" / p.hash
    d.mkdir(parents=True, exist_ok=True)
    write_atomic(d / "plan.json", p.to_json().encode())
    markdown = restore_markdown(p)
    write_atomic(d / "plan.md", markdown.encode())
    return {
        "hash": p.hash,
        "restore_of": p.scope["restore_of"],
        "subject": restore_subject(p),
        "markdown": markdown,
        "approve_option": restore_approve_option(p),
    }


def stored_restore_plan(settings: Settings, planned: dict[str, Any]) -> Plan:
    """The restore plan the plan task saved, checked to hash to ``planned["hash"]`` (both ids validated first)."""
    restore_of, digest = str(planned.get("restore_of")), str(planned.get("hash"))
    if not (PLAN_HASH_RE.fullmatch(restore_of) and len(restore_of) == 64 and PLAN_HASH_RE.fullmatch(digest)):
        raise RepairError(f"not a restore plan: {planned.get('restore_of')!r} / {planned.get('hash')!r}")
    path = repairs_dir(settings) / restore_of / "restores" / digest / "plan.json"
    if not path.is_file():
        raise RepairError(f"no restore plan {digest!r} for repair {restore_of[:12]}")
    p = Plan.from_json(path.read_text())
    if p.hash != digest or p.scope.get("restore_of") != restore_of:
        raise RepairError(f"the stored restore plan does not hash to the approved {digest[:12]}: refusing")
    return p


class RestoreExecutor(Executor):
    """The repair's state machine with the change being "put the backup back"; started again only with ``start``.
    ``source``: the repair attempt's dir, where the backups are."""

    def __init__(self, plan: Plan, source: Path, repair: Plan, *args: Any, **kwargs: Any) -> None:
        super().__init__(plan, *args, **kwargs)
        self.source = source
        self.repair = repair  # the repair plan whose attempt's backups go back

    def steps(self) -> list[tuple[State, Any]]:
        steps = super().steps()
        if not self.plan.scope["start"]:  # left stopped (one broker only): nothing to start, gate or verify
            skipped = (State.STARTED, State.HEALTHY, State.VERIFIED)
            steps = [(s, (lambda b, r: "start=false: left stopped") if s in skipped else f) for s, f in steps]
        return steps

    def _pending_replicas(self, current: BrokerPlan) -> frozenset[tuple[str, int, int]]:
        """Every replica this restore puts back, the current broker's too: what it restores is the state the repair
        found, which may be out of ISR (seed-004's drifted partition.metadata)."""
        return frozenset(
            (a.topic, a.partition, o.broker_id)
            for o in self.plan.brokers
            for a in o.actions
            if a.topic is not None and a.partition is not None
        )

    def backup(self, b: BrokerPlan, remote: Remote) -> str:
        """The files as they are now, before they are overwritten (only those that exist)."""
        present, _ = remote_sums(remote, b.backup_paths)
        backups = self.journal.backups(b.broker_id)
        if backups and all(backups[-1]["files"].get(p) == d for p, d in present.items()):
            return "a backup of this restore already holds the files as they are now"
        if not present:
            return "none of the files exists now: nothing to back up"
        bk = self._take_backup(b, remote, present, len(backups) + 1)
        self.journal.add_backup(b.broker_id, bk)
        return f"{len(present)} file(s) as they were before the restore in {bk['tarball']}"

    def change(self, b: BrokerPlan, remote: Remote) -> str:
        self.identity(b, remote)
        self.still_down(b, remote)
        self.journal.note(b.broker_id, "changing", True)
        for bk in self.plan.scope["backups"][str(b.broker_id)]:
            self._put_back(b, remote, self.source / bk["tarball"], bk)
        self._mark_restored(b)
        expected = {a.path: a.reason.rsplit(" ", 1)[-1] for a in b.actions}
        dirs = sorted({p.rsplit("/", 1)[0] for p in expected})
        owners = " ".join(shlex.quote(p) for p in sorted(expected))
        for d in dirs:  # restored files owned as their partition dir is (the SSH user need not be Kafka's)
            mine = " ".join(shlex.quote(p) for p in sorted(expected) if p.rsplit("/", 1)[0] == d)
            remote.run(f"chown --reference={shlex.quote(d)} -- {mine}")
        present, missing = remote_sums(remote, sorted(expected))
        if missing or present != expected:
            raise RepairError(f"broker {b.broker_id}: restored files do not match the backup manifest")
        stat = remote.run(f"stat -c '%u:%g %n' -- {owners} " + " ".join(shlex.quote(d) for d in dirs)).stdout
        owner = dict(reversed(line.split(" ", 1)) for line in stat.splitlines() if line)
        wrong = [p for p in expected if owner.get(p) != owner.get(p.rsplit("/", 1)[0])]
        if wrong:
            raise RepairError(f"broker {b.broker_id}: restored files not owned as their partition dir: {wrong[:5]}")
        return f"{len(expected)} file(s) put back, equal to the manifest, owned as their partition dirs"

    def _put_back(self, b: BrokerPlan, remote: Remote, tarball: Path, bk: dict[str, Any]) -> None:
        """Upload into a private dir (``mktemp -d``), check its checksum there, unpack only the manifest's members
        relative to ``/`` (no ``--absolute-names``: GNU tar refuses ``..`` and strips a leading ``/``)."""
        if _sha256(tarball) != bk["sha256"]:
            raise RepairError(f"broker {b.broker_id}: {tarball} does not match its checksum")
        members = tar_manifest(tarball)
        if members != bk["files"] or not set(members) <= {a.path for a in b.actions}:
            raise RepairError(f"broker {b.broker_id}: {tarball} holds other files than the restore plan's")
        with tarfile.open(tarball, "r:gz") as tar:
            names = [m.name for m in tar]
        base = self._tmp(b)
        tmp = remote.run(f"mktemp -d {shlex.quote(base)}/fleet-doctor.XXXXXXXXXX").stdout.strip()
        if not re.fullmatch(re.escape(base.rstrip("/")) + r"/fleet-doctor\.[A-Za-z0-9]{10}", tmp):
            raise RepairError(f"broker {b.broker_id}: mktemp gave {tmp!r}")
        target = f"{tmp}/backup.tar.gz"
        try:
            remote.put(tarball, target)
            quoted = " ".join(shlex.quote(n) for n in names)
            unpack = (
                f'[ "$(sha256sum < {target} | cut -c1-64)" = {bk["sha256"]} ] || '
                f'{{ echo "checksum mismatch after upload" >&2; exit 1; }}; '
                f"tar -xzf {target} -C / --no-recursion -- {quoted}"
            )  # under the log dirs' .lock, as the repair's change
            remote.run(locked(unpack, self.inventory.broker(b.broker_id).log_dirs))
        finally:
            remote.run(f"rm -rf -- {tmp}", check=False)

    def verify(self, b: BrokerPlan, remote: Remote) -> str:
        return "restored files checked against the manifest before the start"

    def _mark_restored(self, b: BrokerPlan) -> None:
        """The repair attempt's journal: this broker is where the plan found it, so a rerun of that run starts it
        over (re-verified). Marked as soon as its files are back, broker by broker (a later halt keeps it)."""
        journal = self.source / "journal.json"
        if journal.is_file():
            Journal(journal, self.repair).restored(b.broker_id)


def _take_over_lock(zk: Any, cluster: str, plan_hash: str, attempt: str, owner: dict[str, Any]) -> dict | None:
    """A halted attempt of this repair keeps the lock for a human; restoring that very attempt is what the human
    does about it. Taken over (the holder kept in the lock, to be handed back) only when no worker of it is alive
    (its ephemeral znode is gone); returns the holder taken over from, or None."""
    held = lock_holder(zk, cluster)
    if held is None or held.get("plan_hash") != plan_hash or held.get("step") != "brokers":
        return None  # free, ours (a resumed restore), or another plan's: acquire_lock decides
    if attempt_name(str(held.get("run_id"))) != attempt:
        raise LockHeld(
            f"cluster {cluster} is locked by run {held.get('run_id')} of this repair, not by attempt {attempt} that "
            "this restore puts back: restore that run's attempt (param attempt), or resume it"
        )
    if zk.exists(f"{ACTIVE_ROOT}/{cluster}"):
        raise LockHeld(f"a worker is executing a repair of {cluster} right now: {held}")
    hand_over(zk, cluster, held, owner)
    return held


def _still_needs_human(repair_journal: Path, plan: Plan, restored: set[int]) -> list[int]:
    """Brokers of the halted attempt that this restore did not put back and that still need a human (changed and
    not done, or left stopped)."""
    if not repair_journal.is_file():
        return []
    return [b for b in Journal(repair_journal, plan).left_for_human() if b not in restored]


def restore_backup(
    settings: Settings,
    planned: dict[str, Any],
    params: dict[str, Any],
    run_id: str,
    connect: Any = None,
    approval: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run an approved restore plan (``make_restore_plan``) under the cluster lock; the repair attempt's journal
    marks each restored broker pending again. ``<repairs>/<hash>/restores/<restore hash>/result.json`` says what
    was done either way."""
    repairs = repairs_dir(settings)
    p = stored_restore_plan(settings, planned)
    rdir = repairs / p.scope["restore_of"] / "restores" / p.hash
    plan_dir = find_plan(repairs, p.scope["restore_of"])
    source = plan_dir / "attempts" / p.scope["attempt"]
    inv = inventory.load(settings.inventory)
    connect = connect or ssh_connect(inv)
    owner = {"plan_hash": plan_dir.name, "step": "restore", "run_id": run_id, "since": time.time()}
    report: dict[str, Any] = {"restore": p.hash, "of": plan_dir.name, "run_id": run_id, "order": p.restart_order}
    journal: Journal | None = None
    gates = gates_from({"pause_between_brokers_s": 0, **params})
    gates = Gates(**{**gates.__dict__, "stop_timeout_s": float(params.get("timeout_s", 600))})
    repair = Plan.from_json((plan_dir / "plan.json").read_text())
    try:
        with cluster_session(inv, timeout=10, start_timeout=15) as zk:
            taken = _take_over_lock(zk, inv.cluster, plan_dir.name, p.scope["attempt"], owner)
            acquire_lock(zk, inv.cluster, owner)
            ex: RestoreExecutor | None = None
            try:
                runs = rdir / "runs" / attempt_name(run_id)
                cluster = cluster_for(zk, inv, params)
                fence = lock_fence(zk, inv.cluster, owner)
                ex = RestoreExecutor(
                    p, source, repair, repairs, inv, connect, cluster, gates, journal_dir=runs, fence=fence
                )
                journal = ex.journal
                if approval is not None:
                    journal.approved(approval)
                ex.run()
            finally:
                done = {b for b in p.restart_order if journal and journal.completed(b) == State.DONE}
                left = _still_needs_human(source / "journal.json", repair, done) if taken else []
                if taken is not None and (left or not journal or journal.data.get("status") != "done"):
                    hand_back(zk, inv.cluster, owner)  # the halted repair still needs a human: its lock stays
                    report["lock_kept"] = f"handed back to {taken.get('run_id')}: broker(s) {left} still need a human"
                    report["lock_released"] = False
                else:
                    finish(zk, inv, owner, journal, report, fenced=bool(ex and ex.fenced))
    finally:
        if journal is not None:
            brokers = journal.data["brokers"]
            report["status"] = journal.data.get("status")
            report["error"] = journal.data.get("error")
            report["done"] = [b for b in p.restart_order if brokers[str(b)]["state"] == State.DONE]
            report["states"] = {b: brokers[str(b)]["state"] for b in p.restart_order}
            report["changed"] = [b for b in p.restart_order if journal.changing(b)]
        write_atomic(rdir / f"result-{safe_run_id(run_id)}.json", json.dumps(report, indent=2, default=str).encode())
    return report
