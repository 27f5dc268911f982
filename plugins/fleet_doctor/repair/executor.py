"""Executing an approved plan: one broker at a time, as an explicit, journaled state machine.

Per broker, in plan order (the controller last), the steps of ``Executor.steps``, each a precondition checked, an
action, and the state it leaves journaled (``repair.journal``)::

    PENDING -> PRECHECKED -> STOPPED -> BACKED_UP -> CHANGED -> STARTED -> HEALTHY -> VERIFIED -> DONE
                  any step fails -> FAILED: the chain halts, later brokers stay PENDING (untouched)

VERIFIED is the post-verify: the broker is probed again and every file the plan touched must now be right
(``partition.metadata`` holds ZooKeeper's topic ID, a quarantined index was rebuilt and is sane).

Every transition is journaled before the next step starts, and every step is idempotent, so rerunning after a crash
resumes at the first unfinished step of the first unfinished broker without repeating finished work
(``_resume_after``). What the executor asks of a broker goes through its host (``repair.broker.BrokerHost``: every
command logged with its exit status), what it asks of the cluster through its ``Cluster`` (the health gates); both,
and the fence, are handed in: nothing here imports Airflow, and the unit tests drive it with fakes of both.

Which broker goes next is the plan's order, with the controller last (``plan.restart_order``, asked again before
every broker: the controller can move during a roll). On KRaft the brokers go first, then the voters (controllers and
combined nodes) one at a time, the active controller last; before a node stops, its quorum gate must pass too
(``ClusterHealth.restart_refusal``: no more than one voter impaired, and a voter only while the quorum keeps a
caught-up majority without it), polled until it does within ``isr_timeout_s``: a voter restarted before is caught up
again first, so the next node never stops while the last one still recovers.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from fleet_doctor import layout
from fleet_doctor.cluster_health import ClusterHealth
from fleet_doctor.remote import RemoteError
from fleet_doctor.repair import backups
from fleet_doctor.repair.broker import BrokerHost, Hosts
from fleet_doctor.repair.errors import FenceLost, RepairError
from fleet_doctor.repair.gates import Gates
from fleet_doctor.repair.journal import ORDER, Journal, State
from fleet_doctor.repair.on_broker import LOCK_HELD
from fleet_doctor.repair.plan import BrokerPlan, Plan, planned_path_ok, restart_order
from fleet_doctor.repair.progress import Progress, heartbeat, pause
from fleet_doctor.store import write_atomic

LOG = logging.getLogger(__name__)

Step = Callable[[BrokerPlan, BrokerHost], str]
# the post-verify of a broker after its restart: the problems left on the files the plan touched (repair.verify)
PostVerify = Callable[[BrokerHost, BrokerPlan, Callable[[str], None]], list[str]]


def probe_and_detect(inventory: Any, connect_controller: Any = None) -> PostVerify:
    """The real post-verify: a fresh probe of the broker through the detection app (``repair.verify``); on KRaft
    with the controllers' metadata (reached with ``connect_controller``, default their Airflow connections)."""

    def verify(host: BrokerHost, b: BrokerPlan, stage: Callable[[str], None]) -> list[str]:
        from fleet_doctor.repair.verify import post_verify

        entry = inventory.broker(b.broker_id)
        return post_verify(
            host.remote,
            b.broker_id,
            b.actions,
            entry.log_dirs,
            entry.kafka_version,
            inventory.zookeeper,
            stage=stage,
            metadata_mode=inventory.metadata_mode,
            kafka_user=entry.kafka_user,
            read_cluster=kraft_metadata(inventory, connect_controller) if inventory.kraft else None,
        )

    return verify


def kraft_metadata(inventory: Any, connect: Any = None) -> Callable[[], list[dict[str, Any]]]:
    """A KRaft cluster's metadata as the audit reads it (the most up-to-date controller's image, reached with
    ``connect``: ``audit.kraft.Connect``); RepairError when no controller could be read."""

    def read() -> list[dict[str, Any]]:
        from fleet_doctor.audit import kraft

        endpoints = [inventory.controller_endpoint(c.id) for c in inventory.controllers]
        reads, errors = kraft.read_controllers(endpoints, connect)
        if not reads:
            raise RepairError(f"post-verify: {kraft.error_text(errors)}")
        return reads[0].records

    return read


class StillStopping(RepairError):
    """The broker's stop did not finish within the plan's ``stop_timeout_s``: it may still be shutting down."""


def wait_until(check: Callable[[], bool], timeout: float, message: str, interval: float = 0.5) -> None:
    """Poll ``check`` until it holds; RepairError("<message> within N s") when it does not in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise RepairError(f"{message} within {timeout:.0f} s")


class Executor:
    """The broker chain of one attempt at an approved plan. Subclasses change what ``change`` and ``verify`` do (the
    restore puts backups back); the gates, the stop and start, the backup and the journal are the same.

    ``attempt_dir``: where the attempt keeps its journal and backups (``layout.RepairsDir.attempt``); ``hosts``: how
    a broker's host is reached (``repair.broker.ssh_hosts``); ``cluster``: the health gates' view of the cluster;
    ``fence``: called before every step, raises when this worker may no longer act (``repair.session``: its
    ZooKeeper session, and with it the lock's liveness node, was lost); ``post_verify``: the check after a restart
    (default: ``probe_and_detect``)."""

    def __init__(
        self,
        plan: Plan,
        attempt_dir: Path,
        inventory: Any,
        hosts: Hosts,
        cluster: ClusterHealth,
        gates: Gates,
        *,
        dry_run: bool = False,
        fence: Callable[[], None] | None = None,
        post_verify: PostVerify | None = None,
    ) -> None:
        self.plan = plan
        self.workdir = attempt_dir
        self.inventory = inventory
        self.hosts = hosts
        self.cluster = cluster
        self.gates = gates
        self.dry_run = dry_run
        self.journal = Journal(attempt_dir / layout.JOURNAL, plan)
        self.fence = fence or (lambda: None)
        self.post_verify = post_verify or probe_and_detect(inventory)
        self.fenced = False  # set when the fence fell: nothing more may be written or run

    # ---- the chain
    def run(self) -> dict[str, Any]:
        """The chain (``chain``), its status journaled: running, then done, or halted with why."""
        self.journal.data["status"] = "running"  # a rerun of a halted or restored plan runs again
        self.journal.data["dry_run"] = self.dry_run
        self.journal.data.pop("error", None)
        self.journal.save()
        try:
            self.chain()
            self.journal.data["status"] = "done"
        except FenceLost:
            self.fenced = True
            raise
        except BaseException as e:  # also a SIGTERM'd task (Airflow raises a BaseException): the journal says why
            self.journal.data["status"] = "halted"
            self.journal.data["error"] = str(e) or type(e).__name__
            if not self.fenced:
                self._save_quietly()  # the halt's own error goes up, not a failing journal write's
            raise
        if not self.fenced:
            self.journal.save()
        return self.journal.data

    def chain(self) -> None:
        """Broker after broker (``_next``), each through every step, the pause between them."""
        pending = [b for b in self.plan.brokers if b.restart]
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

    def _next(self, pending: list[BrokerPlan]) -> BrokerPlan:
        """Plan order, the voters after the brokers, the controller of this moment last."""
        return restart_order(pending, self.cluster.controller(), self.cluster.voters())[0]

    def steps(self) -> list[tuple[State, Step]]:
        """The state machine, read top to bottom: the state each step leaves, and the step."""
        return [
            (State.PRECHECKED, self.precheck),
            (State.STOPPED, self.stop),
            (State.BACKED_UP, self.backup),
            (State.CHANGED, self.change),
            (State.STARTED, self.start),
            (State.HEALTHY, self.healthy),
            (State.VERIFIED, self.verify),
            (State.DONE, lambda b, host: "done"),
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

    def _host(self, b: BrokerPlan) -> BrokerHost:
        return self.hosts(b.broker_id, self.journal.data["commands"])

    def _repair(self, b: BrokerPlan) -> None:
        try:
            host = self._host(b)
        except Exception as e:
            self._failed(b, e, "connecting over SSH")
        try:
            resume = self._resume_after(b)
            for target, step in self.steps():
                if ORDER.index(resume) >= ORDER.index(target):
                    continue  # finished before a crash: never repeated
                try:
                    self.fence()
                    detail = step(b, host)
                    self.journal.advance(b.broker_id, target, detail)  # a failing write is a failure of the step
                except FenceLost:
                    raise  # not this worker's to record or undo any more
                except BaseException as e:  # any failure halts the chain, and the journal says where and why
                    self._failed(b, e, f"step {target}")
        finally:
            host.close()

    def _failed(self, b: BrokerPlan, e: BaseException, where: str) -> NoReturn:
        """Record the broker as failed (its last completed step stays), start it again when it is down and nothing
        of it was changed, and halt the chain with a RepairError (a BaseException goes on up: Airflow's
        ``AirflowTaskTimeout`` of an ``execution_timeout``, a SIGTERM's ``AirflowTaskTerminated``; the broker is
        started again first all the same). A journal that cannot be written (the repairs volume full) does not stop
        the restart: the journal keeps the error and the lock stays (``Journal.keeps_lock``)."""
        self._fence_after(e)
        known = isinstance(e, (RepairError, RemoteError))
        detail = str(e) if known else f"{where}: {type(e).__name__}: {e}"
        self._save_quietly(lambda: self.journal.advance(b.broker_id, State.FAILED, detail))
        self._restart_if_unchanged(b, e)
        if not isinstance(e, Exception) or isinstance(e, RepairError):
            raise e
        raise RepairError(detail if known else f"broker {b.broker_id}, {detail}") from e

    def _fence_after(self, e: BaseException) -> None:
        """The failure path starts with the fence: a failure inside a step (a wait of minutes) may be the loss of the
        lock's session itself (kazoo's SessionExpiredError or ConnectionLoss): then this worker records nothing,
        restarts nothing and leaves the lock alone (``FenceLost``)."""
        try:
            self.fence()
        except FenceLost as lost:
            self.fenced = True
            raise lost from e

    def _save_quietly(self, write: Callable[[], None] | None = None) -> None:
        """A journal write on the failure path: a failing one is logged, and kept by the journal (``unsaved``)."""
        try:
            (write or self.journal.save)()
        except OSError as e:
            LOG.error("repair %s: the journal could not be written: %s", self.plan.hash[:12], e)

    def _restart_if_unchanged(self, b: BrokerPlan, cause: BaseException) -> None:
        """After a failure: a broker that this attempt stopped and whose files it has not touched is started again
        (it is as the plan found it); once a file may have changed it stays as it is, for a human (docs/repair.md).
        A stop that did not finish within its gate (``StillStopping``) is checked again first: a broker still
        running may be in the middle of a slow controlled shutdown, so it is neither counted as up nor started."""
        if self.dry_run or self.journal.changing(b.broker_id):
            return
        if ORDER.index(self.journal.completed(b.broker_id)) < ORDER.index(State.PRECHECKED):
            return  # never got to its stop
        after = "after_failure"
        try:
            host = self._host(b)
            try:
                if host.running() and b.broker_id in self.cluster.registered():
                    if isinstance(cause, StillStopping):
                        why = f"may be left stopping: {cause}; it still runs, its controlled shutdown may go on"
                        self._save_quietly(lambda: self.journal.note(b.broker_id, after, why))
                        return
                    self._save_quietly(lambda: self.journal.up_again(b.broker_id, "running: its stop never took"))
                    self._save_quietly(lambda: self.journal.note(b.broker_id, after, "running (nothing changed)"))
                    return
                if isinstance(cause, StillStopping):  # it stopped after all: wait for the process to be gone
                    self._wait_stopped(b, host)
                self.fence()  # still this worker's lock, right before the start
                host.service("start", self.gates.start_timeout_s)
            finally:
                host.close()
            self._wait(
                lambda p: b.broker_id in self.cluster.registered(),
                self.gates.start_timeout_s,
                f"broker {b.broker_id} did not register after its start",
                f"broker {b.broker_id}: started again after the failure, waiting for its {self.cluster.registration}",
            )
            self._save_quietly(lambda: self.journal.up_again(b.broker_id, "started again after the failure"))
            self._save_quietly(lambda: self.journal.note(b.broker_id, after, "started again: nothing was changed"))
        except FenceLost:
            self.fenced = True
            raise
        except Exception as e:
            why = f"may be left stopped: checking or starting it again failed: {type(e).__name__}: {e}"
            self._save_quietly(lambda: self.journal.note(b.broker_id, after, why))

    # ---- steps
    def precheck(self, b: BrokerPlan, host: BrokerHost) -> str:
        host.identity()
        host.can_change([a.path for a in b.actions], self._spool_bytes(b))
        quorum = self._quorum_gate(b)
        expected = {x.id for x in self.inventory.brokers}
        problems = self.cluster.problems(expected, frozenset({b.broker_id}), self._pending_replicas(b))
        if problems:
            raise RepairError(f"pre-check before broker {b.broker_id}: " + "; ".join(problems[:10]))
        below = self.cluster.below_min_isr_if_stopped(b.broker_id)
        if below:
            raise RepairError(f"stopping broker {b.broker_id} would take below min ISR: " + "; ".join(below[:10]))
        return (
            "the host is this broker, its files changeable by the change's user; all brokers registered, no "
            f"under-replicated partition, min ISR kept{quorum}"
        )

    def _quorum_gate(self, b: BrokerPlan) -> str:
        """Wait (within ``isr_timeout_s``) until the cluster lets ``b`` stop beyond the partition gates (KRaft: the
        quorum, ``ClusterHealth.restart_refusal``); what the pre-check's detail adds ("" on ZooKeeper)."""
        if not self.cluster.voters():
            return ""
        why: list[str | None] = [None]

        def passes(p: Progress) -> bool:
            try:
                why[0] = self.cluster.restart_refusal(b.broker_id)
            except RepairError as e:  # the quorum could not be read this time: not yet (fails closed at the end)
                why[0] = str(e)
            p.detail = why[0] or ""
            return why[0] is None

        what = f"broker {b.broker_id}: waiting for the quorum gate"
        timeout = self.gates.isr_timeout_s
        try:
            self._wait(passes, timeout, f"broker {b.broker_id}: the quorum gate did not pass", what)
        except RepairError as e:
            raise RepairError(
                f"quorum gate before broker {b.broker_id} did not pass within {timeout:.0f} s: {why[0]}"
            ) from e
        voter = b.broker_id in self.cluster.voters()
        return "; the quorum keeps a caught-up majority without this voter" if voter else "; the quorum is healthy"

    def _spool_bytes(self, b: BrokerPlan) -> int:
        """Bytes the change spools on ``b``'s host (a restore's backups; a repair's change spools nothing)."""
        return 0

    def _pending_replicas(self, current: BrokerPlan) -> frozenset[tuple[str, int, int]]:
        """(topic, partition, broker) replicas that later brokers of this plan repair (not ``current``)."""
        return frozenset(
            (a.topic, a.partition, o.broker_id)
            for o in self.plan.brokers
            if o.restart and o.broker_id != current.broker_id and self.journal.completed(o.broker_id) != State.DONE
            for a in o.actions
            if a.topic is not None and a.partition is not None
        )

    def stop(self, b: BrokerPlan, host: BrokerHost) -> str:
        """Journal the stop as issued (the broker counts as down until a start is confirmed), send it, and wait for
        the process to exit and its registration to go within the plan's ``stop_timeout_s`` (``StillStopping``)."""
        if not self.dry_run:
            self.journal.stop_issued(b.broker_id)
            self.send_stop(b, host)
        self._wait_stopped(b, host)
        return f"process gone and its {self.cluster.registration} removed"

    def send_stop(self, b: BrokerPlan, host: BrokerHost) -> None:
        """The stop command (its journal entry made first by the caller). Whatever went wrong, the stop may have
        taken: a command that blocks through a slow controlled shutdown past the gate (systemctl stop), a session
        that broke while it ran (exit -1), a wrapper's timeout (exit 124) while the service manager's stop job goes
        on. A broker still running is then not known to be up for good: StillStopping (never started, never counted
        as up, the lock kept)."""
        try:
            host.service("stop", self.gates.stop_timeout_s)
        except RemoteError as e:
            timed_out = isinstance(e.__cause__, TimeoutError)
            what = (
                f"did not return within the plan's stop_timeout_s ({self.gates.stop_timeout_s:g} s)"
                if timed_out
                else "failed"
            )
            raise StillStopping(f"broker {b.broker_id}: its stop command {what}; it may be stopping: {e}") from e

    def _wait_stopped(self, b: BrokerPlan, host: BrokerHost) -> None:
        def stopped(p: Progress) -> bool:
            if self.dry_run:
                return True
            if b.broker_id in self.cluster.registered():
                p.detail = f"its {self.cluster.registration} still there"
                return False
            if host.running():
                p.detail = f"its {self.cluster.registration} gone, its process still running"
                return False
            return True

        what = f"broker {b.broker_id}: waiting for the process to exit and its {self.cluster.registration} to go"
        try:
            self._wait(stopped, self.gates.stop_timeout_s, f"broker {b.broker_id} did not stop", what)
        except (RepairError, RemoteError) as e:  # a poll that failed says nothing of the stop: it may go on
            raise StillStopping(f"{e} (the plan's stop_timeout_s)" if isinstance(e, RepairError) else str(e)) from e

    def backup(self, b: BrokerPlan, host: BrokerHost) -> str:
        """Back up the files about to change, unless a backup of this attempt already holds each of them exactly as it
        is now (a fresh checksum on the broker, compared with the backup's manifest)."""
        present, missing = host.sums(b.backup_paths)
        if self.dry_run:  # reads only: nothing is written on the broker
            return f"dry run: would back up {len(present)} file(s) (checksums read), {len(missing)} missing"
        taken = self.journal.backups(b.broker_id)
        if backups.covers(taken, present, missing):
            for bk in taken:
                if backups.sha256_file(self.workdir / bk["tarball"]) != bk["sha256"]:
                    raise RepairError(f"broker {b.broker_id}: backup {bk['tarball']} no longer matches its checksum")
            return f"{len(taken)} backup(s) already hold every planned file as it is now (fresh checksums)"
        if missing and not backups.covers(taken, {}, missing):
            raise RepairError(f"broker {b.broker_id}: planned file(s) missing and never backed up: {missing[:10]}")
        bk = self._take_backup(b, host, present, len(taken) + 1)
        self.journal.add_backup(b.broker_id, bk)
        return (
            f"{len(present)} file(s) in {bk['tarball']} (sha256 {bk['sha256'][:16]}), "
            f"also kept on the broker in {bk['remote_dir']}"
        )

    def _take_backup(self, b: BrokerPlan, host: BrokerHost, present: dict[str, str], n: int) -> dict[str, Any]:
        """The ``present`` files (path -> the sha256 just read on the broker) backed up on the broker and fetched,
        and each member's checksum compared with ``present`` (the manifest is what the tarball holds, read back)."""
        rel = layout.backup_name(b.broker_id, n)
        tarball = self.workdir / rel
        tarball.parent.mkdir(parents=True, exist_ok=True)
        made = host.backup(sorted(present), tarball)
        files = backups.tar_manifest(tarball)
        if files != present:
            raise RepairError(
                f"broker {b.broker_id}: backup {rel} does not hold the files as they are on the broker "
                f"(differ: {sorted(set(files.items()) ^ set(present.items()))[:5]})"
            )
        manifest = "".join(f"{d}  {p}\n" for p, d in sorted(files.items()))
        write_atomic(layout.backup_manifest(tarball, n), manifest.encode(), mode=0o600)
        write_atomic(layout.backup_checksum(tarball, n), f"{made.sha256}  {tarball.name}\n".encode())
        return {
            "n": n,
            "tarball": rel,
            "sha256": made.sha256,
            "files": files,
            "remote_dir": made.remote_dir,
            "ts": time.time(),
        }

    def still_down(self, b: BrokerPlan, host: BrokerHost) -> None:
        """Right before a file changes: the broker is not registered in ZooKeeper, its service reports it stopped,
        and no process holds a log dir's ``.lock`` (a supervisor may have started it since it was stopped)."""
        if self.dry_run:
            return
        if b.broker_id in self.cluster.registered():
            raise RepairError(
                f"broker {b.broker_id} has its {self.cluster.registration} again (started by someone else?)"
            )
        if host.running():
            raise RepairError(f"broker {b.broker_id}: its service reports it running (started by someone else?)")
        holders = host.lock_holders()
        if holders:
            raise RepairError(f"broker {b.broker_id}: process(es) {holders} hold a log dir's .lock: it is running")

    def unchanged_since_backup(self, b: BrokerPlan, host: BrokerHost) -> None:
        """Right before a file changes: every planned file is as its newest backup holds it (or already gone, by this
        attempt's own change: then a backup holds it)."""
        if self.dry_run:
            return
        present, missing = host.sums(b.backup_paths)
        if not backups.covers(self.journal.backups(b.broker_id), present, missing):
            raise RepairError(f"broker {b.broker_id}: a planned file changed since its backup: nothing changed")

    def change(self, b: BrokerPlan, host: BrokerHost) -> str:
        host.identity()
        self.still_down(b, host)
        self.unchanged_since_backup(b, host)
        log_dirs = self.inventory.broker(b.broker_id).log_dirs
        outside = [a.path for a in b.actions if not planned_path_ok(a.action, a.path, log_dirs)]
        if outside:
            raise RepairError(f"broker {b.broker_id}: planned path(s) not a repairable file of its log dirs: {outside}")
        if not self.dry_run:
            self.journal.note(b.broker_id, "changing", True)
        done = []
        for a in b.actions:
            if self.dry_run:
                LOG.info("dry run: would %s on broker %s: %s", a.action, b.broker_id, a.path)
            else:  # under the log dirs' .lock: a broker started since the checks above cannot start meanwhile
                ran = host.remove(a.path) if a.action == "remove" else host.quarantine(a.path, self.plan.hash)
                if ran.exit_status == LOCK_HELD and not done:
                    self.journal.note(b.broker_id, "changing", False)  # refused before its first file: none changed
                    raise RepairError(f"broker {b.broker_id} holds its log dir's .lock (started by someone else?)")
                if ran.exit_status != 0:
                    raise RepairError(
                        f"broker {b.broker_id}: `{a.action} {a.path}` failed: {ran.stderr.strip()[-300:]}"
                    )
            done.append(f"{a.action} {a.path}")
        return "; ".join(done)

    def start(self, b: BrokerPlan, host: BrokerHost) -> str:
        if not self.dry_run:
            host.service("start", self.gates.start_timeout_s)
        self.wait_registered(b, host)
        if not self.dry_run:
            self.journal.up_again(b.broker_id, "registered again after its start")
        return "registered again"

    def wait_registered(self, b: BrokerPlan, host: BrokerHost) -> str:
        """Until ``b`` registers: within ``start_timeout_s`` of its start or of the end of its log recovery (while its
        BrokerState says RECOVERY it is waited for up to ``recovery_timeout_s``, progress and ETA in the log);
        RepairError when its process exited, or not in time."""
        if self.dry_run:
            return "dry run"
        started = last_recovering = time.monotonic()
        recovered_s = 0.0
        first: tuple[float, int] | None = None  # (when, segments left) at the first RECOVERY seen
        what = f"broker {b.broker_id}: started, waiting for its {self.cluster.registration}"
        with Progress(what, self.gates.recovery_timeout_s, self.gates.progress_every_s, log=LOG) as progress:
            while True:
                if b.broker_id in self.cluster.registered():
                    took = time.monotonic() - started
                    if recovered_s:  # kept: a roll measures the cluster's recovery rate by it (roll_plan)
                        recovery = {"seconds": round(recovered_s, 1)}
                        self._save_quietly(functools.partial(self.journal.note, b.broker_id, "recovery", recovery))
                        return f"registered again after {took:.0f} s, {recovered_s:.0f} s of it recovering its logs"
                    return f"registered again after {took:.0f} s"
                now = time.monotonic()
                state = host.broker_state()
                if state is not None and state.recovering:
                    recovered_s = now - started
                    last_recovering = now
                    left = state.remaining_segments
                    if first is None and left is not None:
                        first = (now, left)
                    progress.update(_recovery_line(b, state, first, now, self._predicted_recovery(b)))
                    if now - started > self.gates.recovery_timeout_s:
                        raise RepairError(
                            f"broker {b.broker_id} still recovering its logs after {now - started:.0f} s "
                            f"(recovery_timeout_s {self.gates.recovery_timeout_s:.0f}): {state.text}"
                        )
                else:
                    if not host.running():
                        raise RepairError(
                            f"broker {b.broker_id} failed: its process exited during its start (not recovering)"
                        )
                    if now - last_recovering > self.gates.start_timeout_s:  # the time it recovered not counted
                        raise RepairError(
                            f"broker {b.broker_id} did not register within {self.gates.start_timeout_s:.0f} s of its "
                            f"start and is not recovering its logs ({state.text if state else 'no broker_state'})"
                        )
                    progress.update(state.name if state else "not registered yet")
                time.sleep(min(self.gates.poll_interval_s, 1.0))

    def _predicted_recovery(self, b: BrokerPlan) -> float | None:
        """The plan's word on the broker's log recovery: a roll's prediction, else the restart preview's."""
        predicted = (self.plan.risk.get("predicted") or {}).get("brokers") or {}
        if str(b.broker_id) in predicted:
            return (predicted[str(b.broker_id)] or {}).get("recovery_if_unclean_s")
        return b.preview.estimated_recovery_s if b.preview else None

    def healthy(self, b: BrokerPlan, host: BrokerHost) -> str:
        """``wait_healthy`` for the broker, the replicas later brokers of the plan repair not counted."""
        return self.wait_healthy([b.broker_id], self._pending_replicas(b))[b.broker_id]

    def wait_healthy(self, ids: list[int], pending: frozenset[tuple[str, int, int]]) -> dict[int, str]:
        """``healthy_polls`` consecutive polls without a problem (``Cluster.problems``, ``pending`` replicas not
        counted) within ``isr_timeout_s``, for ``ids`` restarted together; each poll's progress in the log: how many
        of their partitions have them back in ISR, the streak. Each broker's detail; RepairError when not in time."""
        expected = {x.id for x in self.inventory.brokers}
        polls, streak = self.gates.healthy_polls, 0
        deadline = time.monotonic() + self.gates.isr_timeout_s
        last: list[str] = []
        back: dict[int, tuple[int, int]] = {}
        who = f"broker {ids[0]}" if len(ids) == 1 else f"brokers {', '.join(map(str, sorted(ids)))}"
        with self._progress(f"{who}: waiting for ISR", self.gates.isr_timeout_s) as progress:
            while time.monotonic() < deadline:
                if self.dry_run:
                    last, seen = [], "dry run"
                else:
                    partitions = self.cluster.partitions()
                    last = self.cluster.problems(expected, pending=pending, partitions=partitions)
                    back = {b: self.cluster.in_isr(partitions, b) for b in ids}
                    n, m = sum(v[0] for v in back.values()), sum(v[1] for v in back.values())
                    seen = f"{n}/{m} {'partitions' if len(ids) == 1 else 'replicas'} back"
                streak = streak + 1 if not last else 0
                state = f"{seen}, {streak}/{polls} healthy polls"
                if streak >= polls:
                    progress.done(state)
                    if len(ids) == 1:
                        return {ids[0]: f"{streak} consecutive healthy polls"}
                    return {
                        b: f"{streak} consecutive healthy polls, {'{}/{}'.format(*back.get(b, (0, 0)))} partitions back"
                        for b in ids
                    }
                why = f" ({len(last)} problem(s): {'; '.join(last[:3])})" if last else ""
                progress.update(state + why)
                time.sleep(self.gates.poll_interval_s)
            raise RepairError(f"{who} did not become healthy: {'; '.join(last[:10])}")

    def verify(self, b: BrokerPlan, host: BrokerHost) -> str:
        """Post-verify: a fresh look at the broker through detection; every touched file right."""
        if self.dry_run:
            return "dry run: nothing changed, nothing to verify"
        what = f"broker {b.broker_id}: post-verify of {len(b.actions)} file(s) (a fresh probe, Spark detection)"
        with heartbeat(what, self.gates.progress_every_s, log=LOG) as progress:
            found = self.post_verify(host, b, lambda s: setattr(progress, "detail", s))
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


def _recovery_line(
    b: BrokerPlan, state: Any, first: tuple[float, int] | None, now: float, predicted: float | None
) -> str:
    """``recovering: N logs, M segments left, ETA ...`` from the pace since recovery was first seen (or the plan's
    prediction until there is one)."""
    line = "recovering its logs"
    if state.remaining_logs is not None:
        line += f": {state.remaining_logs} log(s), {state.remaining_segments} segment(s) left"
    eta = None
    if first is not None and state.remaining_segments is not None and now > first[0]:
        done = first[1] - state.remaining_segments
        if done > 0:
            eta = state.remaining_segments * (now - first[0]) / done
    if eta is not None:
        line += f", ETA {eta:.0f} s"
    elif predicted:
        line += f", predicted {predicted:.0f} s in all"
    return line
