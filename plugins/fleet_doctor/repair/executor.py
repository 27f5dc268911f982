"""Executing an approved repair plan: one broker at a time, as an explicit, journaled state machine.

Per broker, in plan order (the controller last)::

    PENDING -> PRECHECKED -> STOPPED -> BACKED_UP -> CHANGED -> STARTED -> HEALTHY -> VERIFIED -> DONE
                  any step fails -> FAILED: the chain halts, later brokers stay PENDING (untouched)

VERIFIED is the post-verify: the broker is probed again and every file the plan touched must now be right
(``partition.metadata`` holds ZooKeeper's topic ID, a quarantined index was rebuilt and is sane).

Every transition is written to the journal (``<repairs>/<plan hash>/journal.json``, atomically) before the next
step starts, and every step is idempotent, so rerunning after a crash resumes at the first unfinished step of the
first unfinished broker without repeating finished work. Every remote command is logged with its exit status.
Nothing here imports Airflow: the DAG hands in SSH clients and a ZooKeeper client.

Which broker goes next is the plan's order, with the controller last (``plan.controller_last``, asked again before
every broker: the controller can move during a roll).
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import shlex
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

from fleet_doctor.identity import verify_broker
from fleet_doctor.remote import Remote, RemoteError
from fleet_doctor.repair.plan import QUARANTINE_DIR, BrokerPlan, Plan, controller_last
from fleet_doctor.repair.progress import EVERY_S, Progress, heartbeat, pause
from fleet_doctor.repair.verify import post_verify
from fleet_doctor.settings import safe_run_id
from fleet_doctor.store import write_atomic
from fleet_doctor.zookeeper.cluster import Cluster

LOG = logging.getLogger(__name__)


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


class RepairError(RuntimeError):
    """A step could not be completed; the chain halts."""


class FenceLost(RepairError):
    """This worker lost the session its lock was taken with: it stops at once, writing nothing more (not even its
    journal, which a newer worker of the same run may own by now) and starting nothing."""


@dataclass(frozen=True)
class Gates:
    stop_timeout_s: float = 300.0
    start_timeout_s: float = 600.0
    healthy_polls: int = 3  # consecutive polls with zero under-replicated partitions
    poll_interval_s: float = 5.0
    isr_timeout_s: float = 900.0
    pause_between_brokers_s: float = 0.0
    progress_every_s: float = EVERY_S  # a long wait writes its progress to the log at most this often


# --------------------------------------------------------------------------------------------
def _digest(stream: IO[bytes]) -> str:
    h = hashlib.sha256()
    for chunk in iter(lambda: stream.read(1 << 20), b""):
        h.update(chunk)
    return h.hexdigest()


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return _digest(f)


# --------------------------------------------------------------------------------------------
class Journal:
    """One attempt at a plan (``<repairs>/<hash>/attempts/<run>/journal.json``): the state of each broker, every
    remote command, the backups taken, the approval the attempt ran under. A rerun of the same Airflow run reads it
    and resumes; a new run of the same plan is a new attempt with a journal of its own."""

    def __init__(self, path: Path, plan: Plan) -> None:
        self.path = path
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
        """Whether a file of this broker may have been changed (the change step began, or finished)."""
        b = self.data["brokers"][str(broker_id)]
        return bool(b.get("changing")) or ORDER.index(State(b["state"])) >= ORDER.index(State.CHANGED)

    def changed_any(self) -> bool:
        """Whether this attempt may have changed a file on any broker (a halt then keeps the cluster lock)."""
        return not self.data.get("dry_run") and any(self.changing(int(b)) for b in self.data["brokers"])

    def left_down(self, broker_id: int) -> bool:
        """Whether a broker this attempt stopped may still be down after a failure (it could not be started again)."""
        return str(self.data["brokers"][str(broker_id)].get("after_failure", "")).startswith("may be left")

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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(self.data, indent=2, default=str).encode())


def attempt_name(run_id: str) -> str:
    """A file-name-safe, one-to-one name for an Airflow run id (``safe_run_id`` alone maps ``a:b`` and ``a_b`` to
    one name: two runs would share an attempt)."""
    safe = safe_run_id(run_id)
    return safe if safe == run_id else f"{safe}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}"


def attempt_dir(repairs: Path, plan_hash: str, attempt: str) -> Path:
    """Where one attempt at a plan keeps its journal, result and backups: ``<repairs>/<hash>/attempts/<run>``."""
    return repairs / plan_hash / "attempts" / attempt_name(attempt)


def _sums(text: str) -> dict[str, str]:
    """``sha256sum -z`` output (NUL-terminated ``<hex>  <path>`` entries: no escaping of odd names) as path -> hex."""
    out = {}
    for entry in text.split("\0"):
        if entry.strip():
            digest, _, path = entry.partition("  ")
            out[path] = digest
    return out


def remote_sums(remote: Remote, paths: list[str]) -> tuple[dict[str, str], list[str]]:
    """The sha256 of each of ``paths`` that exists on the broker right now, and the ones that do not exist."""
    quoted = " ".join(shlex.quote(p) for p in paths)
    out = remote.run(
        f'set -e; for f in {quoted}; do if [ -e "$f" ] || [ -L "$f" ]; then sha256sum -z -- "$f"; '
        "else printf 'missing  %s\\0' \"$f\"; fi; done"
    ).stdout
    sums = _sums(out)
    missing = sorted(p for p, d in sums.items() if d == "missing")
    return {p: d for p, d in sums.items() if d != "missing"}, missing


def lock_holders_command(log_dirs: list[str]) -> str:
    """Prints the pid of every process holding a log dir's ``.lock`` (from /proc/locks, by inode; never takes it)."""
    dirs = " ".join(shlex.quote(d) for d in log_dirs)
    return (
        f'for d in {dirs}; do i=$(stat -c %i -- "$d/.lock" 2>/dev/null) || continue; '
        'awk -v i="$i" \'$2 != "->" { n = split($6, a, ":"); if (n == 3 && a[3] == i) print $5 }\' /proc/locks; '
        "done"
    )


# Runs a shell command while holding every log dir's .lock the way Kafka does (an fcntl lock: Java's FileLock), so no
# broker can start on those dirs while a file changes; exits 75 without running it when a broker holds one. A
# missing .lock is not created (a file made by this user could stop Kafka's own user from opening it).
LOCKED = (
    "import fcntl, os, subprocess, sys\n"
    "held = []\n"
    "for d in sys.argv[2:]:\n"
    "    p = os.path.join(d, '.lock')\n"
    "    try:\n"
    "        fd = os.open(p, os.O_RDWR)\n"
    "    except FileNotFoundError:\n"
    "        continue\n"
    "    try:\n"
    "        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
    "    except OSError:\n"
    "        sys.stderr.write('%s is locked: a broker runs on this log dir\\n' % p)\n"
    "        sys.exit(75)\n"
    "    held.append(fd)\n"
    "sys.exit(subprocess.call(['/bin/sh', '-c', sys.argv[1]]))\n"
)


LOCK_HELD = 75  # LOCKED's exit status when a broker holds a .lock (the command did not run)
REMOVABLE = ("partition.metadata", "leader-epoch-checkpoint")
QUARANTINABLE = (".index", ".timeindex", ".txnindex")


def planned_path_ok(action: str, path: str, log_dirs: list[str]) -> bool:
    """A plan's file is ``<log dir>/<partition dir>/<name>`` of one of the broker's log dirs, and a file its action
    may touch (defence in depth: the plan was built from probe output, itself from the broker's disk)."""
    parts = path.split("/")
    if len(parts) < 3 or any(p in ("", ".", "..") for p in parts[1:]) or "\n" in path:
        return False
    parent, name = "/".join(parts[:-2]), parts[-1]
    if parent not in {d.rstrip("/") for d in log_dirs}:
        return False
    if action == "remove":
        return name in REMOVABLE
    if action == "quarantine":
        return name.endswith(QUARANTINABLE)
    return action == "restore" and (name in REMOVABLE or name.endswith(QUARANTINABLE))  # what a repair took away


def locked(command: str, log_dirs: list[str]) -> str:
    """``command`` run on the broker under its log dirs' ``.lock`` (``LOCKED``)."""
    dirs = " ".join(shlex.quote(d) for d in log_dirs)
    return f"python3 -c {shlex.quote(LOCKED)} {shlex.quote(command)} {dirs}"


def backup_covers(backups: list[dict[str, Any]], present: dict[str, str], missing: list[str]) -> bool:
    """Whether the backups already taken hold every planned file as it is now: each present file with its current
    checksum in the newest backup that has it, each missing file in some backup (this attempt removed or moved it)."""
    newest: dict[str, str] = {}
    for bk in backups:
        newest.update(bk["files"])
    return all(newest.get(p) == d for p, d in present.items()) and all(p in newest for p in missing)


# --------------------------------------------------------------------------------------------
class Executor:
    """The broker chain of one attempt at an approved plan. Subclasses change what ``change`` and ``verify`` do (the
    restore puts backups back); the gates, the stop and start, the backup and the journal are the same."""

    def __init__(
        self,
        plan: Plan,
        workdir: Path,
        inventory: Any,
        connect: Callable[[int], Any],
        cluster: Cluster,
        gates: Gates = Gates(),
        dry_run: bool = False,
        attempt: str = "manual",
        journal_dir: Path | None = None,
        fence: Callable[[], None] | None = None,
    ) -> None:
        """``fence``: called before every step; raises when this worker may no longer act (``tasks.lock_fence``:
        its ZooKeeper session, and with it the lock's liveness node, was lost)."""
        self.plan = plan
        self.workdir = journal_dir or attempt_dir(workdir, plan.hash, attempt)
        self.inventory = inventory
        self.connect = connect
        self.cluster = cluster
        self.gates = gates
        self.dry_run = dry_run
        self.journal = Journal(self.workdir / "journal.json", plan)
        self.fence = fence or (lambda: None)
        self.fenced = False  # set when the fence fell: nothing more may be written or run

    # ---- the chain
    def run(self) -> dict[str, Any]:
        pending = [b for b in self.plan.brokers if b.restart]
        self.journal.data["status"] = "running"  # a rerun of a halted or restored plan runs again
        self.journal.data["dry_run"] = self.dry_run
        self.journal.data.pop("error", None)
        self.journal.save()
        try:
            while pending:
                b = self._next(pending)
                pending.remove(b)
                if self.journal.completed(b.broker_id) == State.DONE:
                    continue
                self._repair(b)
                if pending and self.gates.pause_between_brokers_s:
                    left = len([o for o in pending if self.journal.completed(o.broker_id) != State.DONE])
                    what = f"pause after broker {b.broker_id} before the next ({left} left)"
                    pause(what, self.gates.pause_between_brokers_s, self.gates.progress_every_s, log=LOG)
            self.journal.data["status"] = "done"
        except FenceLost:
            self.fenced = True
            raise
        except BaseException as e:  # also a SIGTERM'd task (Airflow raises a BaseException): the journal says why
            self.journal.data["status"] = "halted"
            self.journal.data["error"] = str(e) or type(e).__name__
            raise
        finally:
            if not self.fenced:
                self.journal.save()
        return self.journal.data

    def _next(self, pending: list[BrokerPlan]) -> BrokerPlan:
        """Plan order, the controller of this moment last."""
        return controller_last(pending, self.cluster.controller())[0]

    def steps(self) -> list[tuple[State, Callable[[BrokerPlan, Remote], str]]]:
        return [
            (State.PRECHECKED, self.precheck),
            (State.STOPPED, self.stop),
            (State.BACKED_UP, self.backup),
            (State.CHANGED, self.change),
            (State.STARTED, self.start),
            (State.HEALTHY, self.healthy),
            (State.VERIFIED, self.verify),
            (State.DONE, lambda b, r: "done"),
        ]

    def _resume_after(self, b: BrokerPlan) -> State:
        """The step after which this broker resumes. Until a file may have changed, everything is done again from
        the pre-check: it is re-run right before every stop (a pre-check hours old says nothing about now), and the
        backup is checked against the files as they are (Kafka may have rewritten one while the broker ran)."""
        done = self.journal.completed(b.broker_id)
        if done in (State.PRECHECKED, State.STOPPED, State.BACKED_UP) and not self.journal.changing(b.broker_id):
            return State.PENDING
        if done == State.BACKED_UP:  # the change began and did not finish: it is idempotent, finish it
            return State.BACKED_UP
        return done

    def _repair(self, b: BrokerPlan) -> None:
        try:
            remote = Remote(self.connect(b.broker_id), b.broker_id, self.journal.data["commands"])
        except Exception as e:
            self._failed(b, e, "connecting over SSH", None)
        try:
            resume = self._resume_after(b)
            for target, step in self.steps():
                if ORDER.index(resume) >= ORDER.index(target):
                    continue  # finished before a crash: never repeated
                try:
                    self.fence()
                    detail = step(b, remote)
                except FenceLost:
                    raise  # not this worker's to record or undo any more
                except BaseException as e:  # any failure halts the chain, and the journal says where and why
                    self._failed(b, e, f"step {target}", remote)
                self.journal.advance(b.broker_id, target, detail)
        finally:
            remote.close()

    def _failed(self, b: BrokerPlan, e: BaseException, where: str, remote: Remote | None) -> NoReturn:
        """Record the broker as failed (its last completed step stays), start it again when it is down and nothing
        of it was changed, and halt the chain with a RepairError (a BaseException such as a SIGTERM goes on up)."""
        known = isinstance(e, (RepairError, RemoteError))
        detail = str(e) if known else f"{where}: {type(e).__name__}: {e}"
        self.journal.advance(b.broker_id, State.FAILED, detail)
        if isinstance(e, Exception):
            self._restart_if_unchanged(b)
        if not isinstance(e, Exception) or isinstance(e, RepairError):
            raise e
        raise RepairError(detail if known else f"broker {b.broker_id}, {detail}") from e

    def _restart_if_unchanged(self, b: BrokerPlan) -> None:
        """After a failure: a broker that this attempt stopped and whose files it has not touched is started again
        (it is as the plan found it); once a file may have changed it stays as it is, for a human (docs/repair.md)."""
        if self.dry_run or self.journal.changing(b.broker_id):
            return
        if ORDER.index(self.journal.completed(b.broker_id)) < ORDER.index(State.PRECHECKED):
            return  # never got to its stop
        try:
            remote = Remote(self.connect(b.broker_id), b.broker_id, self.journal.data["commands"])
            try:
                if remote.run(self._service(b, "status"), check=False).exit_status == 0:
                    self.journal.note(b.broker_id, "after_failure", "running (nothing of it was changed)")
                    return
                remote.run(self._service(b, "start"), timeout=self.gates.start_timeout_s)
            finally:
                remote.close()
            self._wait(
                lambda p: b.broker_id in self.cluster.registered(),
                self.gates.start_timeout_s,
                f"broker {b.broker_id} did not register after its start",
                f"broker {b.broker_id}: started again after the failure, waiting for it to register in ZooKeeper",
            )
            self.journal.note(b.broker_id, "after_failure", "started again: nothing of it had been changed")
        except Exception as e:
            self.journal.note(
                b.broker_id,
                "after_failure",
                f"may be left stopped: checking or starting it again failed: {type(e).__name__}: {e}",
            )

    # ---- steps
    def identity(self, b: BrokerPlan, remote: Remote) -> str:
        """The SSH host is broker N: its pinned host key on the live transport, ``broker.id`` in meta.properties."""
        return verify_broker(remote, self.inventory.broker(b.broker_id), require_meta=True)

    def precheck(self, b: BrokerPlan, remote: Remote) -> str:
        self.identity(b, remote)
        expected = {x.id for x in self.inventory.brokers}
        problems = self.cluster.problems(expected, frozenset({b.broker_id}), self._pending_replicas(b))
        if problems:
            raise RepairError(f"pre-check before broker {b.broker_id}: " + "; ".join(problems[:10]))
        below = self.cluster.below_min_isr_if_stopped(b.broker_id)
        if below:
            raise RepairError(f"stopping broker {b.broker_id} would take below min ISR: " + "; ".join(below[:10]))
        return "the host is this broker; all brokers registered, no under-replicated partition, min ISR kept"

    def _pending_replicas(self, current: BrokerPlan) -> frozenset[tuple[str, int, int]]:
        """(topic, partition, broker) replicas that later brokers of this plan repair (not ``current``)."""
        return frozenset(
            (a.topic, a.partition, o.broker_id)
            for o in self.plan.brokers
            if o.restart and o.broker_id != current.broker_id and self.journal.completed(o.broker_id) != State.DONE
            for a in o.actions
            if a.topic is not None and a.partition is not None
        )

    def _tmp(self, b: BrokerPlan) -> str:
        return str(self.inventory.broker(b.broker_id).tmp_dir)

    def _service(self, b: BrokerPlan, name: str) -> str:
        return self.inventory.broker(b.broker_id).service_command(name)

    def stop(self, b: BrokerPlan, remote: Remote) -> str:
        if not self.dry_run:
            remote.run(self._service(b, "stop"), timeout=self.gates.stop_timeout_s)

        def stopped(p: Progress) -> bool:
            if self.dry_run:
                return True
            if b.broker_id in self.cluster.registered():
                p.detail = "still registered in /brokers/ids"
                return False
            if remote.run(self._service(b, "status"), check=False).exit_status == 0:
                p.detail = "gone from /brokers/ids, its process still running"
                return False
            return True

        what = f"broker {b.broker_id}: waiting for the process to exit and its /brokers/ids entry to go"
        self._wait(stopped, self.gates.stop_timeout_s, f"broker {b.broker_id} did not stop", what)
        return "process gone and /brokers/ids entry removed"

    def backup(self, b: BrokerPlan, remote: Remote) -> str:
        """Back up the files about to change, unless a backup of this attempt already holds each of them exactly as it
        is now (a fresh checksum on the broker, compared with the backup's manifest)."""
        present, missing = remote_sums(remote, b.backup_paths)
        if self.dry_run:  # reads only: nothing is written on the broker
            return f"dry run: would back up {len(present)} file(s) (checksums read), {len(missing)} missing"
        backups = self.journal.backups(b.broker_id)
        if backup_covers(backups, present, missing):
            for bk in backups:
                if _sha256(self.workdir / bk["tarball"]) != bk["sha256"]:
                    raise RepairError(f"broker {b.broker_id}: backup {bk['tarball']} no longer matches its checksum")
            return f"{len(backups)} backup(s) already hold every planned file as it is now (fresh checksums)"
        if missing and not backup_covers(backups, {}, missing):
            raise RepairError(f"broker {b.broker_id}: planned file(s) missing and never backed up: {missing[:10]}")
        bk = self._take_backup(b, remote, present, len(backups) + 1)
        self.journal.add_backup(b.broker_id, bk)
        return (
            f"{len(present)} file(s) in {bk['tarball']} (sha256 {bk['sha256'][:16]}), "
            f"also kept on the broker in {bk['remote_dir']}"
        )

    def _take_backup(self, b: BrokerPlan, remote: Remote, present: dict[str, str], n: int) -> dict[str, Any]:
        """tar.gz of the ``present`` files (path -> the sha256 just read on the broker) in a private directory on
        the broker (``mktemp -d``: 0700, unpredictable), fetched, its checksum compared with the broker's, and each
        member's checksum compared with ``present`` (the manifest is what the tarball holds, read back from it)."""
        paths = sorted(present)
        rel = f"broker-{b.broker_id}/backup-{n}.tar.gz"
        tarball = self.workdir / rel
        tarball.parent.mkdir(parents=True, exist_ok=True)
        quoted = " ".join(shlex.quote(p) for p in paths)
        out = remote.run(
            f"d=$(mktemp -d {shlex.quote(self._tmp(b))}/fleet-doctor.XXXXXXXXXX) && "
            f'{{ tar -czf "$d/backup.tar.gz" -- {quoted} && sha256sum -- "$d/backup.tar.gz"; }} '
            '|| { rc=$?; rm -rf -- "$d"; exit $rc; }'
        ).stdout
        digest, _, remote_tar = out.strip().partition("  ")
        remote.fetch(remote_tar, tarball)
        if _sha256(tarball) != digest:
            raise RepairError(f"broker {b.broker_id}: the fetched backup does not match its checksum on the broker")
        files = tar_manifest(tarball)
        if files != present:
            raise RepairError(
                f"broker {b.broker_id}: backup {rel} does not hold the files as they are on the broker "
                f"(differ: {sorted(set(files.items()) ^ set(present.items()))[:5]})"
            )
        manifest = "".join(f"{d}  {p}\n" for p, d in sorted(files.items()))
        write_atomic(tarball.with_name(f"manifest-{n}.sha256"), manifest.encode(), mode=0o600)
        write_atomic(tarball.with_name(f"backup-{n}.sha256"), f"{digest}  {tarball.name}\n".encode())
        return {
            "n": n,
            "tarball": rel,
            "sha256": digest,
            "files": files,
            "remote_dir": remote_tar.rsplit("/", 1)[0],
            "ts": time.time(),
        }

    def still_down(self, b: BrokerPlan, remote: Remote) -> None:
        """Right before a file changes: the broker is not registered in ZooKeeper, its service reports it stopped,
        and no process holds a log dir's ``.lock`` (a supervisor may have started it since it was stopped)."""
        if self.dry_run:
            return
        if b.broker_id in self.cluster.registered():
            raise RepairError(f"broker {b.broker_id} is registered in ZooKeeper again (started by someone else?)")
        if remote.run(self._service(b, "status"), check=False).exit_status == 0:
            raise RepairError(f"broker {b.broker_id}: its service reports it running (started by someone else?)")
        holders = remote.run(lock_holders_command(self.inventory.broker(b.broker_id).log_dirs)).stdout.split()
        if holders:
            raise RepairError(f"broker {b.broker_id}: process(es) {holders} hold a log dir's .lock: it is running")

    def unchanged_since_backup(self, b: BrokerPlan, remote: Remote) -> None:
        """Right before a file changes: every planned file is as its newest backup holds it (or already gone, by this
        attempt's own change: then a backup holds it)."""
        if self.dry_run:
            return
        present, missing = remote_sums(remote, b.backup_paths)
        if not backup_covers(self.journal.backups(b.broker_id), present, missing):
            raise RepairError(f"broker {b.broker_id}: a planned file changed since its backup: nothing changed")

    def change(self, b: BrokerPlan, remote: Remote) -> str:
        self.identity(b, remote)
        self.still_down(b, remote)
        self.unchanged_since_backup(b, remote)
        log_dirs = self.inventory.broker(b.broker_id).log_dirs
        outside = [a.path for a in b.actions if not planned_path_ok(a.action, a.path, log_dirs)]
        if outside:
            raise RepairError(f"broker {b.broker_id}: planned path(s) not a repairable file of its log dirs: {outside}")
        if not self.dry_run:
            self.journal.note(b.broker_id, "changing", True)
        done = []
        for a in b.actions:
            path = shlex.quote(a.path)
            pdir = shlex.quote(a.path.rsplit("/", 1)[0])
            if a.action == "remove":
                cmd = f"rm -f -- {path}"
            else:
                parent, name = a.path.rsplit("/", 1)
                qroot = f"{parent}/{QUARANTINE_DIR}"
                qdir = f"{qroot}/{self.plan.hash[:16]}"  # see QUARANTINE_DIR: never in the log dir
                dest = shlex.quote(f"{qdir}/{name}")
                # never overwrite an earlier quarantined copy (a plan run again after a restore): dest, dest.1, ...
                # the quarantine dirs are owned as the partition dir is (the SSH user need not be Kafka's user)
                cmd = (
                    f"if [ -e {path} ]; then mkdir -p -- {shlex.quote(qdir)} && "
                    f"chown --reference={pdir} -- {shlex.quote(qroot)} {shlex.quote(qdir)} && d={dest} && n=0 && "
                    f'while [ -e "$d" ]; do n=$((n+1)); d={dest}.$n; done && mv -n -- {path} "$d"; fi'
                )
            if self.dry_run:
                LOG.info("dry run: would run on broker %s: %s", b.broker_id, cmd)
            else:  # under the log dirs' .lock: a broker started since the checks above cannot start meanwhile
                ran = remote.run(locked(cmd, log_dirs), check=False)
                if ran.exit_status == LOCK_HELD and not done:
                    self.journal.note(b.broker_id, "changing", False)  # refused before its first file: none changed
                    raise RepairError(f"broker {b.broker_id} holds its log dir's .lock (started by someone else?)")
                if ran.exit_status != 0:
                    raise RepairError(
                        f"broker {b.broker_id}: `{a.action} {a.path}` failed: {ran.stderr.strip()[-300:]}"
                    )
            done.append(f"{a.action} {a.path}")
        return "; ".join(done)

    def start(self, b: BrokerPlan, remote: Remote) -> str:
        if not self.dry_run:
            remote.run(self._service(b, "start"), timeout=self.gates.start_timeout_s)
        self._wait(
            lambda p: self.dry_run or b.broker_id in self.cluster.registered(),
            self.gates.start_timeout_s,
            f"broker {b.broker_id} did not register after its start",
            f"broker {b.broker_id}: started, waiting for it to register in /brokers/ids",
        )
        return "registered again"

    def healthy(self, b: BrokerPlan, remote: Remote) -> str:
        """``healthy_polls`` consecutive polls without a problem (``Cluster.problems``) within ``isr_timeout_s``;
        each poll's progress in the log: how many of the broker's partitions have it back in ISR, the streak."""
        expected = {x.id for x in self.inventory.brokers}
        polls = self.gates.healthy_polls
        streak = 0
        deadline = time.monotonic() + self.gates.isr_timeout_s
        last: list[str] = []
        with self._progress(f"broker {b.broker_id}: waiting for ISR", self.gates.isr_timeout_s) as progress:
            while time.monotonic() < deadline:
                if self.dry_run:
                    last, back = [], "dry run"
                else:
                    partitions = self.cluster.partitions()
                    last = self.cluster.problems(expected, pending=self._pending_replicas(b), partitions=partitions)
                    back = "{}/{} partitions back".format(*self.cluster.in_isr(partitions, b.broker_id))
                streak = streak + 1 if not last else 0
                state = f"{back}, {streak}/{polls} healthy polls"
                if streak >= polls:
                    progress.done(state)
                    return f"{streak} consecutive healthy polls"
                why = f" ({len(last)} problem(s): {'; '.join(last[:3])})" if last else ""
                progress.update(state + why)
                time.sleep(self.gates.poll_interval_s)
            raise RepairError(f"broker {b.broker_id} did not become healthy: {'; '.join(last[:10])}")

    def verify(self, b: BrokerPlan, remote: Remote) -> str:
        """Post-verify (repair.verify): a fresh probe of the broker through detection; every touched file right."""
        if self.dry_run:
            return "dry run: nothing changed, nothing to verify"
        entry = self.inventory.broker(b.broker_id)
        what = f"broker {b.broker_id}: post-verify of {len(b.actions)} file(s) (a fresh probe, Spark detection)"
        with heartbeat(what, self.gates.progress_every_s, log=LOG) as progress:
            found = post_verify(
                remote,
                b.broker_id,
                b.actions,
                entry.log_dirs,
                entry.kafka_version,
                self.inventory.zookeeper,
                stage=lambda s: setattr(progress, "detail", s),
            )
        if found:
            raise RepairError(f"post-verify of broker {b.broker_id}: " + "; ".join(found[:10]))
        return f"post-verify: {len(b.actions)} file(s) right by a fresh probe and detection"

    def _progress(self, what: str, timeout: float) -> Progress:
        return Progress(what, timeout, self.gates.progress_every_s, log=LOG)

    def _wait(self, check: Callable[[Progress], bool], timeout: float, message: str, what: str) -> None:
        """``wait_until`` the ``check`` holds, its progress in the log after each poll that did not hold: ``what``,
        and the state ``check`` left in the Progress's ``detail``."""
        with self._progress(what, timeout) as progress:

            def checked() -> bool:
                ok = check(progress)
                if not ok:
                    progress.update(progress.detail)
                return ok

            wait_until(checked, timeout, message, min(self.gates.poll_interval_s, 1.0))


def tar_manifest(tarball: Path) -> dict[str, str]:
    """path -> sha256 of every member of a backup tarball (absolute paths; GNU tar stores them without the leading
    ``/``). Refuses anything but regular files, and a name twice."""
    out: dict[str, str] = {}
    with tarfile.open(tarball, "r:gz") as tar:
        for m in tar:
            path = "/" + m.name.lstrip("/")
            if not m.isfile() or path in out or ".." in path.split("/"):
                raise RepairError(f"{tarball}: member {m.name!r} is not a plain file of the backup")
            stream = tar.extractfile(m)
            assert stream is not None  # a regular file
            out[path] = _digest(stream)
    return out


def wait_until(check: Callable[[], bool], timeout: float, message: str, interval: float = 0.5) -> None:
    """Poll ``check`` until it holds; RepairError("<message> within N s") when it does not in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise RepairError(f"{message} within {timeout:.0f} s")


# --------------------------------------------------------------------------------------------
