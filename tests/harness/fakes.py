"""Small fakes of the two things the repair's executor acts through, for the unit tier: a broker's host
(``repair.broker.BrokerHost``: its service, its files, its log dirs' lock) and the cluster's health gates
(``zookeeper.cluster.Cluster``: who is registered, the controller, each partition's ISR). Both act on one
``FakeFleet`` in memory, so a stop drops the broker from every ISR and a start brings it back, as on the lab.

``FakeCluster`` replaces only ``Cluster``'s reads (registered, controller, partitions): the gates themselves
(``problems``, ``below_min_isr_if_stopped``, ``in_isr``) are the real ones. ``FakeHost`` answers each call
``BrokerHost`` makes with what the real one returns for the same files. ``tests/test_fakes_contract.py`` runs the
same calls on both, on the lab, and compares them.

Faults: ``FakeFleet.faults`` maps ``(broker id, operation)`` to what happens when the executor calls it next: an
exception to raise (a ``RemoteError``, an ``IdentityError``...), or ``"crash"``: the worker dies there (``Crash``, a
``BaseException`` the executor cannot handle, as a SIGKILL leaves no handler run; ``crash_journal`` then puts the
journal back as it was on disk at that moment). Operations: ``identity``, ``stop``, ``start``, ``status``,
``sums``, ``backup``, ``fetched`` (after the backup, before the fetch is checked), ``remove``, ``quarantine``,
``verify``, the ``*:after`` of each, raised once the operation has been done, ``connect`` (reaching the host),
``fence`` (broker 0: the lock's fence, before each step) and ``partitions`` (broker 0: a health poll). Two faults
change the fleet rather than raise: ``"disk-full"`` (from then on no file of the attempt can be written:
``disk_full``, which a test makes the journal's writes honour) and ``"slow-stop"`` (the broker's controlled shutdown
never ends while the test runs: it stays running and registered; ``"slow-stop-blocks"``: the same, and the stop
command blocks until the process is gone, so it does not return in time: RemoteError from a TimeoutError).
``"session-expired"`` raises kazoo's ``SessionExpiredError`` and the lock's fence falls from then on
(``session_lost``).

After a ``Crash`` the worker is dead: every later call raises ``Crash`` again and does nothing (a SIGKILL'd process
runs no handler), until ``revive`` (the task run again).
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_doctor.remote import Completed, RemoteError
from fleet_doctor.repair.broker import Backup, BrokerState, quarantine_dir
from fleet_doctor.repair.on_broker import LOCK_HELD
from fleet_doctor.zookeeper.cluster import KAFKA_DEFAULT_MIN_ISR, Cluster


class Crash(BaseException):
    """The worker died here (SIGKILL, OOM): nothing after this runs in that process."""


@dataclass
class FakePartition:
    topic: str
    partition: int
    replicas: list[int]
    isr: list[int]
    leader: int | None
    min_isr: int = KAFKA_DEFAULT_MIN_ISR


@dataclass
class FakeFleet:
    """Brokers, their files (path -> bytes) and the partitions' ISR, in memory. ``rejoins``: whether a started
    broker comes back in ISR (a broker whose ``partition.metadata`` is wrong does not, as on Kafka)."""

    brokers: dict[int, dict[str, bytes]]
    partitions: list[FakePartition]
    controller: int | None = None
    running: set[int] = field(default_factory=set)
    faults: dict[tuple[int, str], Any] = field(default_factory=dict)
    calls: list[tuple[int, str]] = field(default_factory=list)
    rejoins: bool = True
    journal: Path | None = None  # the journal file whose on-disk content a crash freezes
    frozen_journal: bytes | None = None
    dead: bool = False  # the worker crashed: nothing it calls happens any more
    disk_full: bool = False  # the repairs volume is full: no write of the attempt succeeds
    stopping: set[int] = field(default_factory=set)  # a stop was sent and the broker is still shutting down
    session_lost: bool = False  # the lock's ZooKeeper session expired: the fence falls from now on
    # a roll's: broker -> how many reads of its state it recovers its logs for after its next start (RECOVERY, not
    # registered); its rack; whether it has an inventory broker_state command
    recovery_polls: dict[int, int] = field(default_factory=dict)
    recovering: dict[int, int] = field(default_factory=dict)
    racks: dict[int, str] = field(default_factory=dict)
    broker_states: bool = True
    elections: list[list[tuple[str, int]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.running:
            self.running = set(self.brokers)

    def fault(self, broker_id: int, op: str) -> None:
        """Record the call; raise what ``faults`` holds for it (once): for ``(broker, op)``, the first call, or for
        ``(broker, "op#n")``, the n-th."""
        if self.dead:
            raise Crash(f"the worker is dead: {op} of broker {broker_id} never happens")
        self.calls.append((broker_id, op))
        nth = self.calls.count((broker_id, op))
        what = self.faults.pop((broker_id, f"{op}#{nth}"), None) or self.faults.pop((broker_id, op), None)
        if what is None:
            return
        if what == "crash":
            if self.journal is not None and self.journal.is_file():
                self.frozen_journal = self.journal.read_bytes()
            self.dead = True
            raise Crash(f"worker died at {op} of broker {broker_id}")
        if what == "disk-full":
            self.disk_full = True
            return
        if what == "slow-stop":
            self.stopping.add(broker_id)
            return
        if what == "slow-stop-blocks":  # the same, with a stop command that blocks until the process is gone
            self.stopping.add(broker_id)
            raise RemoteError(f"broker {broker_id}: `{op}` could not run: TimeoutError: ") from TimeoutError()
        if what == "session-expired":
            from kazoo.exceptions import SessionExpiredError

            self.session_lost = True
            raise SessionExpiredError()
        raise what

    def revive(self) -> None:
        """The task runs again on a live worker, the volume has room, and a slow shutdown has finished by now."""
        self.dead = self.disk_full = self.session_lost = False
        for broker_id in sorted(self.stopping):
            self.stop(broker_id)
        self.stopping.clear()

    def write(self, path: Path) -> bool:
        """Before a write of the attempt's files (the journal's): ENOSPC while ``disk_full``."""
        if self.disk_full:
            raise OSError(28, "No space left on device", str(path))
        return True

    def crash_journal(self) -> None:
        """After a ``Crash``: the journal as it was on disk when the worker died (its handlers never ran)."""
        if self.frozen_journal is not None and self.journal is not None:
            self.journal.write_bytes(self.frozen_journal)

    def stop(self, broker_id: int) -> None:
        if broker_id in self.stopping:
            return  # a controlled shutdown that takes its time: still running, still registered
        self.running.discard(broker_id)
        for p in self.partitions:
            if broker_id in p.isr and len(p.isr) > 1:
                p.isr = [r for r in p.isr if r != broker_id]
            if p.leader == broker_id:
                p.leader = next((r for r in p.isr if r in self.running), None)
        if self.controller == broker_id:
            self.controller = min(self.running) if self.running else None

    def catch_up(self) -> None:
        """Running replicas that fell behind are back in ISR (when ``rejoins``), as followers catch up."""
        if self.rejoins:
            for p in self.partitions:
                p.isr = sorted(set(p.isr) | (set(p.replicas) & self.registered()))

    def registered(self) -> set[int]:
        """Running and done recovering its logs."""
        return self.running - set(self.recovering)

    def recovered_a_bit(self, broker_id: int) -> int:
        """One read of a recovering broker's state: a poll of its recovery gone by; what is left."""
        left = self.recovering.get(broker_id, 0) - 1
        if left <= 0:
            self.recovering.pop(broker_id, None)
            return 0
        self.recovering[broker_id] = left
        return left

    def elect_preferred(self, wanted: Iterable[tuple[str, int]]) -> dict[str, str | None]:
        """The controller's preferred election: each partition led by its first replica where it is in ISR and
        registered."""
        wanted = sorted(set(wanted))
        self.elections.append(wanted)
        out: dict[str, str | None] = {}
        for p in self.partitions:
            if (p.topic, p.partition) not in wanted:
                continue
            name = f"{p.topic}-{p.partition}"
            if p.leader == p.replicas[0]:
                out[name] = "noop"
            elif p.replicas[0] in p.isr and p.replicas[0] in self.registered():
                p.leader, out[name] = p.replicas[0], None
            else:
                out[name] = f"PreferredLeaderNotAvailableException: {name}"
        return out

    def start(self, broker_id: int) -> None:
        if self.recovery_polls.get(broker_id):
            self.recovering[broker_id] = self.recovery_polls.pop(broker_id)
        self.running.add(broker_id)
        if broker_id in self.recovering:
            return  # it joins ISR once it has recovered (catch_up)
        for p in self.partitions:
            if broker_id in p.replicas and broker_id not in p.isr and self.rejoins:
                p.isr = sorted([*p.isr, broker_id])
            if p.leader is None and broker_id in p.isr:
                p.leader = broker_id
        if self.controller is None:
            self.controller = broker_id


class FakeCluster(Cluster):
    """The health gates over a ``FakeFleet``: ``Cluster`` with its three reads replaced."""

    def __init__(self, fleet: FakeFleet, default_min_isr: int | None = None) -> None:
        super().__init__(zk=None, default_min_isr=default_min_isr)
        self.fleet = fleet

    def registered(self) -> set[int]:
        return self.fleet.registered()

    def racks(self) -> dict[int, str | None]:
        return {b: self.fleet.racks.get(b) for b in self.fleet.registered()}

    def elect_preferred(self, partitions: list[tuple[str, int]], timeout: float) -> dict[str, str | None]:
        self.fleet.fault(0, "elect")
        return self.fleet.elect_preferred(partitions)

    def controller(self) -> int | None:
        return self.fleet.controller

    def partitions(self) -> list[dict[str, Any]]:
        self.fleet.fault(0, "partitions")
        self.fleet.catch_up()
        return [
            {
                "topic": p.topic,
                "partition": p.partition,
                "replicas": list(p.replicas),
                "isr": list(p.isr),
                "leader": p.leader,
                "min_isr": p.min_isr,
                "min_isr_source": "the fake fleet",
            }
            for p in self.fleet.partitions
        ]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FakeHost:
    """One broker's host over a ``FakeFleet``: what ``BrokerHost`` answers, without SSH."""

    def __init__(self, fleet: FakeFleet, broker_id: int, log: list[dict[str, Any]] | None = None) -> None:
        self.fleet = fleet
        self.broker_id = broker_id
        self.log = log if log is not None else []
        self.remote = None  # no SSH connection: the post-verify of the unit tier is given explicitly

    @property
    def files(self) -> dict[str, bytes]:
        return self.fleet.brokers[self.broker_id]

    def _op(self, op: str, command: str, status: int = 0) -> None:
        self.fleet.fault(self.broker_id, op)
        self.log.append({"broker_id": self.broker_id, "command": command, "exit_status": status})

    def _done(self, op: str) -> None:
        self.fleet.fault(self.broker_id, f"{op}:after")

    def identity(self) -> str:
        self._op("identity", "identity")
        return f"broker {self.broker_id}: the fake host"

    def service(self, name: str, timeout: float) -> None:
        self._op(name, f"service {name}")
        if name == "start":
            self.fleet.stopping.discard(self.broker_id)  # a start waits for a stop still in progress
        (self.fleet.stop if name == "stop" else self.fleet.start)(self.broker_id)
        self._done(name)

    def running(self) -> bool:
        self._op("status", "service status")
        return self.broker_id in self.fleet.running

    def broker_state(self) -> BrokerState | None:
        self._op("broker_state", "broker_state")
        if not self.fleet.broker_states:
            return None
        if self.broker_id not in self.fleet.running:
            return None  # as the real host: the command exits non-zero (the lab's: 3, BrokerState=NOT_RUNNING)
        if self.broker_id in self.fleet.recovering:
            left = self.fleet.recovered_a_bit(self.broker_id)
            if left:
                return BrokerState("RECOVERY", 1, left, f"BrokerState=RECOVERY remainingSegmentsToRecover={left}")
        return BrokerState("RUNNING")

    def elect_preferred(self, partitions: Iterable[tuple[str, int]], timeout: float) -> dict[str, str | None]:
        self._op("elect", "kafka-leader-election.sh --election-type PREFERRED")
        return self.fleet.elect_preferred(partitions)

    def lock_holders(self) -> list[str]:
        self._op("lock_holders", "lock holders")
        return ["4242"] if self.broker_id in self.fleet.running else []

    def sums(self, paths: Iterable[str]) -> tuple[dict[str, str], list[str]]:
        self._op("sums", "sha256sum")
        present = {p: sha256(self.files[p]) for p in paths if p in self.files}
        return present, sorted(p for p in paths if p not in self.files)

    def backup(self, paths: list[str], tarball: Path) -> Backup:
        self._op("backup", "tar -czf")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for p in paths:  # in the order given, as tar stores them
                data = self.files[p]
                info = tarfile.TarInfo(p.lstrip("/"))  # as GNU tar stores an absolute path
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        self.fleet.fault(self.broker_id, "fetched")
        tarball.parent.mkdir(parents=True, exist_ok=True)
        tarball.write_bytes(buf.getvalue())
        self._done("backup")
        return Backup(sha256(buf.getvalue()), f"/tmp/fleet-doctor.fake{self.broker_id:05d}")

    def can_change(self, paths: Iterable[str], spool_bytes: int = 0) -> None:
        self._op("can_change", "can_change")

    def _locked(self, op: str, path: str) -> Completed | None:
        if self.broker_id in self.fleet.running:
            self._op(op, f"{op} {path}", LOCK_HELD)
            return Completed(LOCK_HELD, "", "a broker runs on this log dir")
        self._op(op, f"{op} {path}")
        return None

    def remove(self, path: str) -> Completed:
        refused = self._locked("remove", path)
        if refused:
            return refused
        self.files.pop(path, None)
        self._done("remove")
        return Completed(0, "", "")

    def quarantine(self, path: str, plan_hash: str) -> Completed:
        refused = self._locked("quarantine", path)
        if refused:
            return refused
        if path in self.files:
            _, qdir = quarantine_dir(path, plan_hash)
            dest, n = f"{qdir}/{path.rsplit('/', 1)[1]}", 0
            while (dest if n == 0 else f"{dest}.{n}") in self.files:
                n += 1
            self.files[dest if n == 0 else f"{dest}.{n}"] = self.files.pop(path)
        self._done("quarantine")
        return Completed(0, "", "")

    def put_back(self, tarball: Path, sha: str, members: list[str]) -> None:
        self._op("put_back", "tar -xzf")
        if self.broker_id in self.fleet.running:
            raise RemoteError(f"broker {self.broker_id}: a broker runs on this log dir")
        with tarfile.open(tarball, "r:gz") as tar:
            for m in tar:
                if m.name in members:
                    stream = tar.extractfile(m)
                    assert stream is not None
                    self.files["/" + m.name] = stream.read()

    def own_as_parent(self, paths: Iterable[str]) -> None:
        self._op("chown", "chown --reference")

    def owners(self, paths: Iterable[str]) -> dict[str, str]:
        return {p: "0:0" for p in paths}

    def close(self) -> None:
        pass


def fake_hosts(fleet: FakeFleet) -> Any:
    """``Executor``'s ``hosts`` over a ``FakeFleet``."""

    def host(broker_id: int, log: list[dict[str, Any]]) -> FakeHost:
        fleet.fault(broker_id, "connect")
        return FakeHost(fleet, broker_id, log)

    return host
