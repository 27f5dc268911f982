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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from fleet_doctor.remote import Remote, RemoteError
from fleet_doctor.repair.plan import QUARANTINE_DIR, BrokerPlan, Plan, controller_last
from fleet_doctor.repair.verify import post_verify
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


@dataclass(frozen=True)
class Gates:
    stop_timeout_s: float = 300.0
    start_timeout_s: float = 600.0
    healthy_polls: int = 3  # consecutive polls with zero under-replicated partitions
    poll_interval_s: float = 5.0
    isr_timeout_s: float = 900.0
    pause_between_brokers_s: float = 0.0


# --------------------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
class Journal:
    def __init__(self, path: Path, plan: Plan) -> None:
        self.path = path
        if path.is_file():
            self.data = json.loads(path.read_text())
            if self.data["plan_hash"] != plan.hash:
                raise RepairError(f"{path} belongs to plan {self.data['plan_hash'][:12]}, not {plan.hash[:12]}")
        else:
            self.data = {
                "plan_hash": plan.hash,
                "status": "running",
                "brokers": {
                    str(b.broker_id): {"state": State.PENDING, "history": []} for b in plan.brokers if b.restart
                },
                "commands": [],
            }
            self.save()

    def state(self, broker_id: int) -> State:
        """The broker's state as reported: FAILED while its last attempt failed."""
        b = self.data["brokers"][str(broker_id)]
        return State.FAILED if b.get("failed") else State(b["state"])

    def completed(self, broker_id: int) -> State:
        """The last step finished for this broker: a rerun resumes after it (a failure does not erase it)."""
        return State(self.data["brokers"][str(broker_id)]["state"])

    def touched(self) -> bool:
        """Whether any broker got past its pre-check (stopped, and maybe changed) under this plan."""
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

    def restored(self, broker_id: int) -> None:
        """The broker's backup was put back: it is where the plan found it, so a rerun starts it over (re-verified)."""
        b = self.data["brokers"].get(str(broker_id))
        if b is not None:
            b["state"] = State.PENDING
            b.pop("failed", None)
            b["history"].append({"state": "restored", "ts": time.time(), "detail": "backup put back"})
        self.data["status"] = "restored"
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(self.data, indent=2, default=str).encode())


# --------------------------------------------------------------------------------------------
class Executor:
    def __init__(
        self,
        plan: Plan,
        workdir: Path,
        inventory: Any,
        connect: Callable[[int], Any],
        cluster: Cluster,
        gates: Gates = Gates(),
        dry_run: bool = False,
    ) -> None:
        self.plan = plan
        self.workdir = workdir / plan.hash
        self.inventory = inventory
        self.connect = connect
        self.cluster = cluster
        self.gates = gates
        self.dry_run = dry_run
        self.journal = Journal(self.workdir / "journal.json", plan)

    # ---- the chain
    def run(self) -> dict[str, Any]:
        pending = [b for b in self.plan.brokers if b.restart]
        self.journal.data["status"] = "running"  # a rerun of a halted or restored plan runs again
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
                    time.sleep(self.gates.pause_between_brokers_s)
            self.journal.data["status"] = "done"
        except Exception as e:
            self.journal.data["status"] = "halted"
            self.journal.data["error"] = str(e)
            raise
        finally:
            self.journal.save()
        return self.journal.data

    def _next(self, pending: list[BrokerPlan]) -> BrokerPlan:
        """Plan order, the controller of this moment last."""
        return controller_last(pending, self.cluster.controller())[0]

    def _repair(self, b: BrokerPlan) -> None:
        steps: list[tuple[State, Callable[[BrokerPlan, Remote], str]]] = [
            (State.PRECHECKED, self.precheck),
            (State.STOPPED, self.stop),
            (State.BACKED_UP, self.backup),
            (State.CHANGED, self.change),
            (State.STARTED, self.start),
            (State.HEALTHY, self.healthy),
            (State.VERIFIED, self.verify),
            (State.DONE, lambda b, r: "done"),
        ]
        try:
            remote = Remote(self.connect(b.broker_id), b.broker_id, self.journal.data["commands"])
        except Exception as e:
            self._failed(b, e, "connecting over SSH")
        try:
            for target, step in steps:
                if ORDER.index(self.journal.completed(b.broker_id)) >= ORDER.index(target):
                    continue  # finished before a crash: never repeated
                try:
                    detail = step(b, remote)
                except Exception as e:  # any failure halts the chain, and the journal says where and why
                    self._failed(b, e, f"step {target}")
                self.journal.advance(b.broker_id, target, detail)
        finally:
            remote.close()

    def _failed(self, b: BrokerPlan, e: Exception, where: str) -> NoReturn:
        """Record the broker as failed (its last completed step stays) and halt the chain with a RepairError."""
        known = isinstance(e, (RepairError, RemoteError))
        detail = str(e) if known else f"{where}: {type(e).__name__}: {e}"
        self.journal.advance(b.broker_id, State.FAILED, detail)
        if isinstance(e, RepairError):
            raise e
        raise RepairError(detail if known else f"broker {b.broker_id}, {detail}") from e

    # ---- steps
    def precheck(self, b: BrokerPlan, remote: Remote) -> str:
        expected = {x.id for x in self.inventory.brokers}
        problems = self.cluster.problems(expected, frozenset({b.broker_id}), self._pending_replicas(b))
        if problems:
            raise RepairError(f"pre-check before broker {b.broker_id}: " + "; ".join(problems[:10]))
        below = self.cluster.below_min_isr_if_stopped(b.broker_id)
        if below:
            raise RepairError(f"stopping broker {b.broker_id} would take below min ISR: " + "; ".join(below[:10]))
        return "all brokers registered, no under-replicated partition, min ISR kept"

    def _pending_replicas(self, current: BrokerPlan) -> frozenset[tuple[str, int, int]]:
        """(topic, partition, broker) replicas that later brokers of this plan repair (not ``current``)."""
        return frozenset(
            (a.topic, a.partition, o.broker_id)
            for o in self.plan.brokers
            if o.restart and o.broker_id != current.broker_id and self.journal.completed(o.broker_id) != State.DONE
            for a in o.actions
            if a.topic is not None and a.partition is not None
        )

    def _service(self, b: BrokerPlan, name: str) -> str:
        return self.inventory.broker(b.broker_id).service_command(name)

    def stop(self, b: BrokerPlan, remote: Remote) -> str:
        if not self.dry_run:
            remote.run(self._service(b, "stop"), timeout=self.gates.stop_timeout_s)

        def stopped() -> bool:
            return self.dry_run or (
                b.broker_id not in self.cluster.registered()
                and remote.run(self._service(b, "status"), check=False).exit_status != 0
            )

        self._wait(stopped, self.gates.stop_timeout_s, f"broker {b.broker_id} did not stop")
        return "process gone and /brokers/ids entry removed"

    def backup(self, b: BrokerPlan, remote: Remote) -> str:
        local_dir = self.workdir / f"broker-{b.broker_id}"
        local_dir.mkdir(parents=True, exist_ok=True)
        tarball = local_dir / "backup.tar.gz"
        manifest = local_dir / "manifest.sha256"
        if tarball.is_file() and (local_dir / "backup.sha256").is_file():
            if _sha256(tarball) == (local_dir / "backup.sha256").read_text().split()[0]:
                return "verified backup already present"
        paths = b.backup_paths
        remote_tar = f"/tmp/fleet-doctor-{self.plan.hash[:16]}-broker-{b.broker_id}.tar.gz"
        quoted = " ".join(shlex.quote(p) for p in paths)
        sums = remote.run(f"sha256sum -- {quoted}").stdout  # fails (and halts) if a planned file is missing
        write_atomic(manifest, sums.encode(), mode=0o600)
        remote.run(f"tar -czf {shlex.quote(remote_tar)} --absolute-names -- {quoted}")
        tar_sum = remote.run(f"sha256sum -- {shlex.quote(remote_tar)}").stdout
        remote.fetch(remote_tar, tarball)
        if _sha256(tarball) != tar_sum.split()[0]:
            raise RepairError(f"broker {b.broker_id}: the fetched backup does not match its checksum on the broker")
        write_atomic(local_dir / "backup.sha256", tar_sum.encode())
        write_atomic(local_dir / "remote_path", (remote_tar + "\n").encode())
        return (
            f"{len(paths)} file(s) in {tarball} (sha256 {tar_sum.split()[0][:16]}), kept on the broker at {remote_tar}"
        )

    def change(self, b: BrokerPlan, remote: Remote) -> str:
        done = []
        for a in b.actions:
            path = shlex.quote(a.path)
            if a.action == "remove":
                cmd = f"rm -f -- {path}"
            else:
                pdir, name = a.path.rsplit("/", 1)
                qdir = f"{pdir}/{QUARANTINE_DIR}/{self.plan.hash[:16]}"  # see QUARANTINE_DIR: never in the log dir
                dest = shlex.quote(f"{qdir}/{name}")
                # never overwrite an earlier quarantined copy (a plan run again after a restore): dest, dest.1, ...
                cmd = (
                    f"if [ -e {path} ]; then mkdir -p -- {shlex.quote(qdir)} && d={dest} && n=0 && "
                    f'while [ -e "$d" ]; do n=$((n+1)); d={dest}.$n; done && mv -n -- {path} "$d"; fi'
                )
            if self.dry_run:
                LOG.info("dry run: would run on broker %s: %s", b.broker_id, cmd)
            else:
                remote.run(cmd)
            done.append(f"{a.action} {a.path}")
        return "; ".join(done)

    def start(self, b: BrokerPlan, remote: Remote) -> str:
        if not self.dry_run:
            remote.run(self._service(b, "start"), timeout=self.gates.start_timeout_s)
        self._wait(
            lambda: self.dry_run or b.broker_id in self.cluster.registered(),
            self.gates.start_timeout_s,
            f"broker {b.broker_id} did not register after its start",
        )
        return "registered again"

    def healthy(self, b: BrokerPlan, remote: Remote) -> str:
        expected = {x.id for x in self.inventory.brokers}
        streak = 0
        deadline = time.monotonic() + self.gates.isr_timeout_s
        last: list[str] = []
        while time.monotonic() < deadline:
            last = [] if self.dry_run else self.cluster.problems(expected, pending=self._pending_replicas(b))
            streak = streak + 1 if not last else 0
            if streak >= self.gates.healthy_polls:
                return f"{streak} consecutive healthy polls"
            time.sleep(self.gates.poll_interval_s)
        raise RepairError(f"broker {b.broker_id} did not become healthy: {'; '.join(last[:10])}")

    def verify(self, b: BrokerPlan, remote: Remote) -> str:
        """Post-verify (repair.verify): a fresh probe of the broker through detection; every touched file right."""
        if self.dry_run:
            return "dry run: nothing changed, nothing to verify"
        entry = self.inventory.broker(b.broker_id)
        found = post_verify(
            remote, b.broker_id, b.actions, entry.log_dirs, entry.kafka_version, self.inventory.zookeeper
        )
        if found:
            raise RepairError(f"post-verify of broker {b.broker_id}: " + "; ".join(found[:10]))
        return f"post-verify: {len(b.actions)} file(s) right by a fresh probe and detection"

    def _wait(self, check: Callable[[], bool], timeout: float, message: str) -> None:
        wait_until(check, timeout, message, min(self.gates.poll_interval_s, 1.0))


def wait_until(check: Callable[[], bool], timeout: float, message: str, interval: float = 0.5) -> None:
    """Poll ``check`` until it holds; RepairError("<message> within N s") when it does not in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise RepairError(f"{message} within {timeout:.0f} s")


# --------------------------------------------------------------------------------------------
