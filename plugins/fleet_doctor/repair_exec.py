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
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import os
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet_doctor.audit import probe_records
from fleet_doctor.probe import PARTITION_METADATA, parse_partition_metadata
from fleet_doctor.repair_plan import QUARANTINE_DIR, BrokerPlan, Plan, ZkAction
from fleet_doctor.store import write_atomic

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


ORDER = [
    State.PENDING,
    State.PRECHECKED,
    State.STOPPED,
    State.BACKED_UP,
    State.CHANGED,
    State.STARTED,
    State.HEALTHY,
    State.VERIFIED,
    State.DONE,
]  # fmt: skip  (FAILED is a flag on top of the last completed step)


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
class Remote:
    """Commands on one broker over an open paramiko SSHClient; each logged with its exit status."""

    def __init__(self, broker_id: int, client: Any, log: list[dict[str, Any]]) -> None:
        self.broker_id = broker_id
        self.client = client
        self.log = log

    def run(self, command: str, timeout: float = 600.0, check: bool = True) -> tuple[int, str, str]:
        _, stdout, stderr = self.client.exec_command(command, timeout=timeout)
        out = stdout.read().decode(errors="replace")
        err = stderr.read().decode(errors="replace")
        rc = stdout.channel.recv_exit_status()
        entry = {"ts": time.time(), "broker_id": self.broker_id, "command": command, "exit_status": rc,
                 "stderr": err[-500:]}  # fmt: skip
        self.log.append(entry)
        LOG.info("broker %s: %s -> exit %s", self.broker_id, command, rc)
        if check and rc != 0:
            raise RepairError(f"broker {self.broker_id}: `{command}` exited {rc}: {err.strip()[-300:]}")
        return rc, out, err

    def fetch(self, remote: str, local: Path) -> None:
        sftp = self.client.open_sftp()
        try:
            tmp = local.with_name(local.name + ".part")
            sftp.get(remote, str(tmp))
            tmp.replace(local)
        finally:
            sftp.close()


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

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(self.data, indent=2, default=str).encode())


# --------------------------------------------------------------------------------------------
class Cluster:
    """What the health gates read from ZooKeeper (kazoo client, chroot in its hosts string)."""

    def __init__(self, zk: Any) -> None:
        self.zk = zk

    def registered(self) -> set[int]:
        return {int(i) for i in self.zk.get_children("/brokers/ids")}

    def controller(self) -> int | None:
        try:
            return json.loads(self.zk.get("/controller")[0])["brokerid"]
        except Exception:  # no controller elected right now
            return None

    def topic_id(self, topic: str) -> str | None:
        return json.loads(self.zk.get(f"/brokers/topics/{topic}")[0]).get("topic_id")

    def partitions(self) -> list[dict[str, Any]]:
        out = []
        for topic in self.zk.get_children("/brokers/topics"):
            znode = json.loads(self.zk.get(f"/brokers/topics/{topic}")[0])
            min_isr = 1
            if self.zk.exists(f"/config/topics/{topic}"):
                cfg = json.loads(self.zk.get(f"/config/topics/{topic}")[0]).get("config", {})
                min_isr = int(cfg.get("min.insync.replicas", 1))
            for p, replicas in znode["partitions"].items():
                st = json.loads(self.zk.get(f"/brokers/topics/{topic}/partitions/{p}/state")[0])
                out.append({"topic": topic, "partition": int(p), "replicas": replicas, "isr": st["isr"],
                            "leader": st["leader"], "min_isr": min_isr})  # fmt: skip
        return out

    def problems(
        self,
        expected: set[int],
        tolerate: frozenset[int] = frozenset(),
        pending: frozenset[tuple[str, int, int]] = frozenset(),
    ) -> list[str]:
        """Unregistered brokers, under-replicated and offline partitions. Not counted: a replica missing from ISR
        when its broker is in ``tolerate`` (the broker about to be repaired: its restart is what brings it back;
        it may be down already, as in seed-000 where the broker refusing to start is the one to repair), or when
        it is in ``pending`` as (topic, partition, broker): a replica this plan repairs later (seed-004: every
        broker whose ``partition.metadata`` is wrong is out of ISR for that partition until its turn)."""
        live = self.registered()
        out = [f"broker {b} not registered" for b in sorted(expected - live - tolerate)]
        for p in self.partitions():
            missing = {
                r for r in set(p["replicas"]) - set(p["isr"])
                if r not in tolerate and (p["topic"], p["partition"], r) not in pending
            }  # fmt: skip
            if p["leader"] not in live:
                out.append(f"{p['topic']}-{p['partition']} offline")
            elif missing:
                out.append(f"{p['topic']}-{p['partition']} under-replicated (ISR {p['isr']})")
        return out

    def below_min_isr_if_stopped(self, broker_id: int) -> list[str]:
        """Strimzi's rule: stopping the broker must not take any partition below min.insync.replicas."""
        return [
            f"{p['topic']}-{p['partition']} (ISR {p['isr']}, min.insync.replicas {p['min_isr']})"
            for p in self.partitions()
            if broker_id in p["isr"] and len(p["isr"]) - 1 < p["min_isr"]
        ]


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
        except RepairError as e:
            self.journal.data["status"] = "halted"
            self.journal.data["error"] = str(e)
            raise
        finally:
            self.journal.save()
        return self.journal.data

    def _next(self, pending: list[BrokerPlan]) -> BrokerPlan:
        """Plan order, except that the current controller is deferred while other brokers are pending."""
        controller = self.cluster.controller()
        for b in pending:
            if b.broker_id != controller or len(pending) == 1:
                return b
        return pending[0]

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
        client = self.connect(b.broker_id)
        remote = Remote(b.broker_id, client, self.journal.data["commands"])
        try:
            for target, step in steps:
                if ORDER.index(self.journal.completed(b.broker_id)) >= ORDER.index(target):
                    continue  # finished before a crash: never repeated
                try:
                    detail = step(b, remote)
                except RepairError as e:
                    self.journal.advance(b.broker_id, State.FAILED, str(e))
                    raise
                self.journal.advance(b.broker_id, target, detail)
        finally:
            client.close()

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
        self._wait(lambda: self.dry_run or (
            b.broker_id not in self.cluster.registered()
            and remote.run(self._service(b, "status"), check=False)[0] != 0
        ), self.gates.stop_timeout_s, f"broker {b.broker_id} did not stop")  # fmt: skip
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
        _, sums, _ = remote.run(f"sha256sum -- {quoted}")  # fails (and halts) if a planned file is missing
        manifest.write_text(sums)
        remote.run(f"tar -czf {shlex.quote(remote_tar)} --absolute-names -- {quoted}")
        _, tar_sum, _ = remote.run(f"sha256sum -- {shlex.quote(remote_tar)}")
        remote.fetch(remote_tar, tarball)
        if _sha256(tarball) != tar_sum.split()[0]:
            raise RepairError(f"broker {b.broker_id}: the fetched backup does not match its checksum on the broker")
        (local_dir / "backup.sha256").write_text(tar_sum)
        (local_dir / "remote_path").write_text(remote_tar + "\n")
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
        self._wait(lambda: self.dry_run or b.broker_id in self.cluster.registered(), self.gates.start_timeout_s,
                   f"broker {b.broker_id} did not register after its start")  # fmt: skip
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
        """Post-verify: probe the broker again (metadata mode) and check every file the plan touched."""
        if self.dry_run:
            return "dry run: nothing changed, nothing to verify"
        records = probe_records(remote.client, self.inventory.broker(b.broker_id).log_dirs)
        parts = {r["path"]: r for r in records if r.get("kind") == "partition"}
        segs = {(r["path"], r["base_offset"]): r for r in records if r.get("kind") == "segment"}
        problems = []
        for a in b.actions:
            pdir, name = a.path.rsplit("/", 1)
            if name == PARTITION_METADATA and a.topic:
                want, got = self.cluster.topic_id(a.topic), parts.get(pdir, {}).get("topic_id")
                if got != want:
                    problems.append(f"{a.path} holds topic ID {got}, ZooKeeper has {want}")
            elif a.action == "quarantine":
                base, ext = name.split(".", 1)
                seg = segs.get((pdir, int(base)))
                if seg is not None and (
                    not seg.get(f"has_{ext}") or seg.get(f"{ext}_remainder") or seg.get(f"{ext}_monotonic") is False
                ):
                    problems.append(f"{a.path} was not rebuilt sane: {ext} present {seg.get(f'has_{ext}')}")
        if problems:
            raise RepairError(f"post-verify of broker {b.broker_id}: " + "; ".join(problems[:10]))
        return f"post-verify: {len(b.actions)} file(s) checked by a fresh probe"

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


def restore(workdir: Path, plan_hash: str, broker_id: int, remote: Remote) -> str:
    """Put a broker's backup back (the broker must be stopped): the tarball holds absolute paths."""
    local = workdir / plan_hash / f"broker-{broker_id}" / "backup.tar.gz"
    if not local.is_file():
        raise RepairError(f"no backup for broker {broker_id} in {local.parent}")
    remote_tar = f"/tmp/fleet-doctor-restore-{plan_hash[:16]}-{broker_id}.tar.gz"
    sftp = remote.client.open_sftp()
    try:
        sftp.put(str(local), remote_tar)
    finally:
        sftp.close()
    remote.run(f"tar -xzf {shlex.quote(remote_tar)} --absolute-names")
    manifest = (local.parent / "manifest.sha256").read_text()
    paths = " ".join(shlex.quote(line.split(None, 1)[1]) for line in manifest.splitlines() if line.strip())
    _, sums, _ = remote.run(f"sha256sum -- {paths}")
    if sorted(sums.split("\n")) != sorted(manifest.split("\n")):
        raise RepairError(f"broker {broker_id}: restored files do not match the backup manifest")
    journal = workdir / plan_hash / "journal.json"
    if journal.is_file():  # the broker is back where the plan found it: a rerun starts it over, re-verified
        data = json.loads(journal.read_text())
        b = data["brokers"].get(str(broker_id))
        if b is not None:
            b["state"] = State.PENDING
            b.pop("failed", None)
            b["history"].append({"state": "restored", "ts": time.time(), "detail": "backup put back"})
        data["status"] = "restored"
        write_atomic(journal, json.dumps(data, indent=2, default=str).encode())
    return f"restored {len(manifest.splitlines())} file(s) from {os.path.basename(local)}"


# --------------------------------------------------------------------------------------------
LOCK_ROOT = "/fleet-doctor/repair-lock"
ACTIVE_ROOT = "/fleet-doctor/repair-active"


def _same_owner(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.get("plan_hash") == b.get("plan_hash") and a.get("step", "brokers") == b.get("step", "brokers")


def acquire_lock(zk: Any, cluster: str, owner: dict[str, Any], wait_s: float = 0.0, live_wait_s: float = 60.0) -> None:
    """One repair per cluster: a persistent znode (it survives a crashed worker, so a second repair stays blocked
    until this one is resumed or the lock is released by hand). The same plan and step re-acquire it: that is a
    resume. With ``wait_s`` a holder that is another step of the same plan is waited for (the ZooKeeper action
    waits for the broker chain of its plan), never another plan.

    A resume is only allowed once the previous worker is gone: the holder also keeps an **ephemeral** znode
    (``/fleet-doctor/repair-active/<cluster>``) that lives as long as its ZooKeeper session. A crashed worker's
    session expires within its session timeout; a worker that still runs (Airflow started a second attempt while
    the first is alive) keeps it, and the second one stops after ``live_wait_s`` instead of running alongside."""
    from kazoo.exceptions import NodeExistsError, NoNodeError

    path = f"{LOCK_ROOT}/{cluster}"
    zk.ensure_path(LOCK_ROOT)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            zk.create(path, json.dumps(owner).encode())
            break
        except NodeExistsError:
            try:
                held = json.loads(zk.get(path)[0])
            except NoNodeError:
                continue  # released in between
            if _same_owner(held, owner):
                break
            if held.get("plan_hash") != owner.get("plan_hash") or time.monotonic() > deadline:
                raise RepairError(f"cluster {cluster} is locked by another repair: {held}") from None
            time.sleep(2)
    active = f"{ACTIVE_ROOT}/{cluster}"
    zk.ensure_path(ACTIVE_ROOT)
    live_deadline = time.monotonic() + live_wait_s
    while True:
        try:
            zk.create(active, json.dumps(owner).encode(), ephemeral=True)
            return
        except NodeExistsError:
            if time.monotonic() > live_deadline:
                try:
                    other = zk.get(active)[0].decode(errors="replace")
                except NoNodeError:
                    continue
                raise RepairError(f"another worker is executing a repair of {cluster} right now: {other}") from None
            time.sleep(1)


def release_lock(zk: Any, cluster: str, owner: dict[str, Any]) -> None:
    from kazoo.exceptions import NoNodeError

    path = f"{LOCK_ROOT}/{cluster}"
    try:
        if _same_owner(json.loads(zk.get(path)[0]), owner):
            zk.delete(path)
    except NoNodeError:
        pass
    try:
        if _same_owner(json.loads(zk.get(f"{ACTIVE_ROOT}/{cluster}")[0]), owner):
            zk.delete(f"{ACTIVE_ROOT}/{cluster}")
    except NoNodeError:
        pass


def lock_holder(zk: Any, cluster: str) -> dict[str, Any] | None:
    from kazoo.exceptions import NoNodeError

    try:
        return dict(json.loads(zk.get(f"{LOCK_ROOT}/{cluster}")[0]))
    except NoNodeError:
        return None


# --------------------------------------------------------------------------------------------
def replica_topic_ids(
    connect: Callable[[int], Any], inventory: Any, topic: str, assignment: dict[str, list[int]]
) -> dict[str, str | None]:
    """``partition.metadata`` topic ID of every assigned replica of ``topic``, read over SSH from the brokers
    (``<broker>:<partition>`` -> ID, None when the file is missing or unreadable)."""
    out: dict[str, str | None] = {}
    by_broker: dict[int, list[str]] = {}
    for p, replicas in assignment.items():
        for bid in replicas:
            by_broker.setdefault(int(bid), []).append(p)
    for bid, parts in sorted(by_broker.items()):
        files = [f"{d}/{topic}-{p}/{PARTITION_METADATA}" for p in parts for d in inventory.broker(bid).log_dirs]
        script = (
            "for f in "
            + " ".join(shlex.quote(f) for f in files)
            + '; do [ -f "$f" ] && printf \'\\0%s\\0\' "$f" && cat -- "$f"; done; true'
        )
        client = connect(bid)
        try:
            _, stdout, _ = client.exec_command(script, timeout=60)
            raw = stdout.read()
        finally:
            client.close()
        found: dict[str, str | None] = {}
        chunks = raw.split(b"\0")[1:]
        for name, body in zip(chunks[0::2], chunks[1::2], strict=False):
            path = name.decode()
            try:
                found[path.rsplit("/", 2)[-2]] = parse_partition_metadata(body, path)["topic_id"]
            except ValueError:
                found[path.rsplit("/", 2)[-2]] = None
        for p in parts:
            out[f"{bid}:{p}"] = found.get(f"{topic}-{p}")
    return out


def restore_topic_ids(
    zk: Any, actions: list[ZkAction], connect: Callable[[int], Any], inventory: Any, dry_run: bool = False
) -> list[str]:
    """The preventive repair of ``topic-id-missing-in-zk``: write back the topic ID every replica agrees on,
    before a controller failover mints a new one (kafka-reference.md §5, §6 KAFKA-14190). Re-checked right before
    the write (the znode still lacks it, every replica still holds it) and written with a version-checked
    ``set``: a concurrent change (a controller minting, an admin tool) makes it stop, not overwrite."""
    from kazoo.exceptions import BadVersionError

    done = []
    for a in actions:
        path = f"/brokers/topics/{a.topic}"
        raw, stat = zk.get(path)
        znode = json.loads(raw)
        if znode.get("topic_id") == a.topic_id:
            done.append(f"{a.topic}: already {a.topic_id}")
            continue
        if znode.get("topic_id"):
            raise RepairError(f"{path} now holds topic_id {znode['topic_id']}, not the planned {a.topic_id}: stale")
        # replicas without partition.metadata (partitions added since the ID was lost) take the ID from ZooKeeper
        # once it is back; a replica holding another ID would be made inconsistent: stop
        ids = replica_topic_ids(connect, inventory, a.topic, znode["partitions"])
        disagree = {k: v for k, v in ids.items() if v is not None and v != a.topic_id}
        if disagree or a.topic_id not in ids.values():
            raise RepairError(f"{a.topic}: replicas no longer agree on {a.topic_id}: {disagree or ids}")
        znode.update(topic_id=a.topic_id, version=max(3, int(znode.get("version", 1))))
        znode.setdefault("adding_replicas", {})
        znode.setdefault("removing_replicas", {})
        if dry_run:
            LOG.info("dry run: would set %s (zkVersion %d) to %s", path, stat.version, json.dumps(znode))
            done.append(f"{a.topic}: would write {a.topic_id}")
            continue
        try:
            zk.set(path, json.dumps(znode, separators=(",", ":")).encode(), version=stat.version)
        except BadVersionError:
            raise RepairError(f"{path} changed while its topic ID was restored: nothing written") from None
        LOG.info("wrote topic_id %s into %s (was zkVersion %d)", a.topic_id, path, stat.version)
        holding = sum(v == a.topic_id for v in ids.values())
        done.append(f"{a.topic}: wrote {a.topic_id} ({holding} of {len(ids)} replicas hold it, none another)")
    return done
