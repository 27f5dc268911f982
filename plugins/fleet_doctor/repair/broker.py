"""A broker's host as a repair acts on it: its service, its files, its log dirs' ``.lock``, over one SSH connection.

Every command the repair and the restore send to a broker is built here and nowhere else, each with its paths
quoted: the executor decides what to do and when (``repair.executor``), ``BrokerHost`` knows how. A second
implementation of these calls, over files in memory, drives the executor in the unit tests
(``tests/harness/fakes.py``); a contract test runs the same calls on both (``tests/test_fakes_contract.py``).

File changes run on the broker as ``repair.on_broker`` (its source sent on the stdin of ``python3 -I -c <loader>``,
as the Kafka user when the inventory names one): no symlink followed at or below a log dir, while holding every log
dir's ``.lock`` the way Kafka does, so no broker can start on those dirs while a file changes; the lock is never
created, a broker holding it makes the change exit ``LOCK_HELD`` without running, and a path that is not a real file
or directory at its expected place exits ``REFUSED`` naming it.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet_doctor import inventory
from fleet_doctor.identity import verify_broker
from fleet_doctor.remote import Completed, Remote, as_user
from fleet_doctor.repair.errors import RepairError
from fleet_doctor.repair.plan import QUARANTINE_DIR, STRAY_QUARANTINE_DIR, stray_quarantine, stray_replica_dir

# every change to a broker's files runs there as this program (no symlink followed, under the log dirs' .lock)
ON_BROKER = (Path(__file__).resolve().parent / "on_broker.py").read_bytes()
# how it is started: ``python3 -I -c BOOT <its length> <input length>`` reads the program from the head of stdin, the
# program reads its input JSON next, then the rest of stdin (a backup to put back); isolated mode (-I): no current
# dir, PYTHON* variable or user site-packages of the Kafka user's in play; run as the Kafka user when set
BOOT = (
    "import sys;b=sys.stdin.buffer;"
    'exec(compile(b.read(int(sys.argv[1])),"on_broker.py","exec"),{"__name__":"__main__"})'
)
CHANGE_TIMEOUT_S = 600.0


def quarantine_subdirs(plan_hash: str) -> list[str]:
    """The dirs below a partition dir a planned file is quarantined in: ``fleet-doctor-quarantine/<plan hash[:16]>``."""
    return [QUARANTINE_DIR, plan_hash[:16]]


def quarantine_dir(path: str, plan_hash: str) -> tuple[str, str]:
    """Where a planned file is quarantined: ``(<partition dir>/fleet-doctor-quarantine, .../<plan hash[:16]>)``."""
    root, sub = quarantine_subdirs(plan_hash)
    root = f"{path.rsplit('/', 1)[0]}/{root}"
    return root, f"{root}/{sub}"


def _sums(text: str) -> dict[str, str]:
    """``sha256sum -z`` output (NUL-terminated ``<hex>  <path>`` entries: no escaping of odd names) as path -> hex."""
    out = {}
    for entry in text.split("\0"):
        if entry.strip():
            digest, _, path = entry.partition("  ")
            out[path] = digest
    return out


def _quoted(paths: Iterable[str]) -> str:
    return " ".join(shlex.quote(p) for p in paths)


def on_broker_command(spec: dict[str, Any], python: str = "python3") -> tuple[list[str], bytes]:
    """The command that runs ``repair.on_broker`` on ``spec``, and the head of its stdin: the program, then ``spec``
    as JSON (a backup to put back follows it)."""
    data = json.dumps(spec).encode("utf-8")
    return [python, "-I", "-c", BOOT, str(len(ON_BROKER)), str(len(data))], ON_BROKER + data


def _chunks(path: Path, size: int = 1 << 20) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(size):
            yield chunk


@dataclass(frozen=True)
class Backup:
    """A tarball made on the broker and fetched: its sha256 as the broker computed it, and where the broker keeps
    its own copy."""

    sha256: str
    remote_dir: str


class BrokerHost:
    """One broker's host over one SSH connection (``remote``), as the inventory's ``entry`` describes it."""

    def __init__(self, remote: Remote, entry: inventory.BrokerEntry) -> None:
        self.remote = remote
        self.entry = entry
        self.broker_id = entry.id

    # ---- who and whether it runs
    def identity(self) -> str:
        """The host is this broker: its pinned host key on the live transport, ``broker.id`` in meta.properties."""
        return verify_broker(self.remote, self.entry, require_meta=True)

    def service(self, name: str, timeout: float) -> None:
        """The inventory's ``stop`` or ``start`` command; RemoteError when it fails."""
        self.remote.run(self.entry.service_command(name), timeout=timeout)

    def running(self) -> bool:
        """The inventory's ``status`` command says the broker runs (exit 0)."""
        return self.remote.run(self.entry.service_command("status"), check=False).exit_status == 0

    def lock_holders(self) -> list[str]:
        """The pid of every process holding a log dir's ``.lock`` (from /proc/locks, by inode; never takes it)."""
        dirs = _quoted(self.entry.log_dirs)
        command = (
            f'for d in {dirs}; do i=$(stat -c %i -- "$d/.lock" 2>/dev/null) || continue; '
            'awk -v i="$i" \'$2 != "->" { n = split($6, a, ":"); if (n == 3 && a[3] == i) print $5 }\' /proc/locks; '
            "done"
        )
        return self.remote.run(as_user(self.entry.kafka_user, command, shell=True)).stdout.split()

    # ---- files
    def sums(self, paths: Iterable[str]) -> tuple[dict[str, str], list[str]]:
        """The sha256 of each of ``paths`` that exists on the broker right now, and the ones that do not exist."""
        out = self.remote.run(
            as_user(
                self.entry.kafka_user,
                f'set -e; for f in {_quoted(paths)}; do if [ -e "$f" ] || [ -L "$f" ]; then sha256sum -z -- "$f"; '
                "else printf 'missing  %s\\0' \"$f\"; fi; done",
                shell=True,
            )
        ).stdout
        sums = _sums(out)
        missing = sorted(p for p, d in sums.items() if d == "missing")
        return {p: d for p, d in sums.items() if d != "missing"}, missing

    def backup(self, paths: list[str], tarball: Path) -> Backup:
        """A tar.gz of ``paths`` made in a private directory on the broker (``mktemp -d``: 0700, unpredictable),
        fetched to ``tarball`` and its checksum compared with the broker's (RepairError when they differ). ``tar``
        reads the files as the Kafka user when the inventory names one; the SSH user writes the tarball."""
        from fleet_doctor.repair.backups import sha256_file

        tar = as_user(self.entry.kafka_user, f"tar -czf - -- {_quoted(paths)}")
        out = self.remote.run(
            f"d=$(mktemp -d {shlex.quote(self.tmp_dir)}/fleet-doctor.XXXXXXXXXX) && "
            f'{{ {tar} > "$d/backup.tar.gz" && sha256sum -- "$d/backup.tar.gz"; }} '
            '|| { rc=$?; rm -rf -- "$d"; exit $rc; }'
        ).stdout
        digest, _, remote_tar = out.strip().partition("  ")
        self.remote.fetch(remote_tar, tarball)
        if sha256_file(tarball) != digest:
            raise RepairError(f"broker {self.broker_id}: the fetched backup does not match its checksum on the broker")
        return Backup(digest, remote_tar.rsplit("/", 1)[0])

    def remove(self, path: str) -> Completed:
        """Remove a planned file (exit ``LOCK_HELD`` when a broker holds a log dir's lock, ``REFUSED`` when it or a
        directory above it up to its log dir is a symlink or not what it should be)."""
        return self.change([{"op": "remove", "path": path}])

    def quarantine(self, path: str, plan_hash: str) -> Completed:
        """Move a planned file into its partition dir's quarantine (``quarantine_dir``), never over an earlier
        quarantined copy (a plan run again after a restore: ``name``, ``name.1``, ...); the quarantine dirs are made
        with plain ``mkdir`` and owned as the partition dir is (the SSH user need not be Kafka's); a quarantine dir
        that is a symlink is refused. Nothing happens when the file is gone already (an idempotent step run again)."""
        if stray_replica_dir(path):  # a -stray replica dir: moved whole beside its log dir (plan.stray_quarantine)
            log_dir, _, _name = path.rstrip("/").rpartition("/")
            into = stray_quarantine(log_dir, plan_hash)[len(log_dir.rpartition("/")[0]) + 1 :].split("/")
            return self.change([{"op": "quarantine_replica", "path": path, "into": into}])
        return self.change([{"op": "quarantine", "path": path, "into": quarantine_subdirs(plan_hash)}])

    def put_back(self, tarball: Path, sha256: str, members: list[str]) -> None:
        """Send a backup to the broker on the change's stdin (``on_broker``: spooled into an unnamed private file in
        ``tmp_dir``, its checksum checked before anything changes) and install each of ``members`` at its place
        under ``/`` without following a symlink (a new file beside it, owned as the partition dir, renamed over it),
        under the log dirs' lock; only those members are read, never extracted by their own names. RepairError when
        any of it fails."""
        ops = [{"op": "install", "member": m, "path": "/" + m.lstrip("/")} for m in members]
        ran = self.change(ops, tarball=(tarball, sha256))
        if ran.exit_status != 0:
            raise RepairError(f"broker {self.broker_id}: putting back {tarball.name} failed: {ran.stderr[-300:]}")

    def can_change(self, paths: Iterable[str], spool_bytes: int = 0) -> None:
        """Before the stop: the change's user (the Kafka user when the inventory names one, else the SSH user) can
        make a file owned as each planned file's directory is, there, and open every log dir's ``.lock`` read-write
        (``on_broker``'s ``can_change``, the lock not taken), and (a restore) spool a backup of ``spool_bytes`` in
        ``tmp_dir``. RepairError naming the dir and the user otherwise: a change that could not run would fail with
        the broker already down."""
        dirs = sorted({p.rsplit("/", 1)[0] for p in paths})
        ran = self.change([{"op": "can_change", "path": d} for d in dirs], check=True, spool_bytes=spool_bytes)
        if ran.exit_status != 0:
            how = f"as {self.entry.kafka_user}" if self.entry.kafka_user else f"as the SSH user {self.entry.ssh_user}"
            raise RepairError(
                f"broker {self.broker_id}: the change cannot run {how}: {ran.stderr.strip()[-300:]} "
                "(docs/inventory.md: kafka_user and its sudoers rule)"
            )

    def own_as_parent(self, paths: Iterable[str]) -> None:
        """Each file owned as its partition dir is (the SSH user need not be Kafka's), no symlink followed."""
        ran = self.change([{"op": "own", "path": p} for p in sorted(paths)])
        if ran.exit_status != 0:
            raise RepairError(f"broker {self.broker_id}: owning the restored files failed: {ran.stderr[-300:]}")

    def quarantined(self, plan_hash: str) -> list[dict[str, Any]]:
        """What the plan ``plan_hash`` quarantined on this broker (``on_broker``'s ``quarantined``): its index files
        in the partition dirs' quarantine, its stray replicas beside the log dirs, each with its bytes and when it
        was moved there. Read beside a running broker (Kafka's files are not touched); RepairError when it fails."""
        ops = [
            {"op": "quarantined", "path": d, "hash16": plan_hash[:16], "names": [QUARANTINE_DIR, STRAY_QUARANTINE_DIR]}
            for d in self.entry.log_dirs
        ]
        ran = self.change(ops, unlocked=True)
        if ran.exit_status != 0:
            raise RepairError(f"broker {self.broker_id}: listing the quarantine failed: {ran.stderr.strip()[-300:]}")
        return [e for line in ran.stdout.splitlines() if line.strip() for e in json.loads(line)["done"]]

    def purge(self, entries: Iterable[dict[str, Any]], plan_hash: str) -> list[str]:
        """Delete quarantined ``entries`` (``quarantined``'s) of the plan ``plan_hash``, each only while it is still
        that many bytes in that quarantine; what was done per entry. RepairError when any is refused or fails."""
        names = [QUARANTINE_DIR, STRAY_QUARANTINE_DIR]
        ops = [
            {"op": "purge", "path": e["path"], "bytes": e["bytes"], "hash16": plan_hash[:16], "names": names}
            for e in entries
        ]
        ran = self.change(ops, unlocked=True)
        done = [f"{json.loads(line)['path']}: {json.loads(line)['done']}" for line in ran.stdout.splitlines() if line]
        if ran.exit_status != 0:
            raise RepairError(
                f"broker {self.broker_id}: deleting the quarantine failed after {len(done)} of {len(ops)}: "
                f"{ran.stderr.strip()[-300:]}"
            )
        return done

    def owners(self, paths: Iterable[str]) -> dict[str, str]:
        """``uid:gid`` of each path."""
        stat = self.remote.run(as_user(self.entry.kafka_user, f"stat -c '%u:%g %n' -- {_quoted(paths)}")).stdout
        return dict(reversed(line.split(" ", 1)) for line in stat.splitlines() if line)  # type: ignore[misc]

    # ---- a roll's
    def broker_state(self) -> BrokerState | None:
        """Kafka's BrokerState through the inventory's ``broker_state`` command; None when the inventory has none or
        it could not be read (the caller then goes by the service status and the registration alone)."""
        command = self.entry.service.get("broker_state")
        if not command:
            return None
        ran = self.remote.run(command, timeout=60, check=False)
        if ran.exit_status != 0 or not ran.stdout.strip():  # not read (the lab's exits 3 when the broker is down)
            return None
        return parse_broker_state(ran.stdout)

    def elect_preferred(self, partitions: Iterable[tuple[str, int]], timeout: float) -> dict[str, str | None]:
        """A preferred-leader election of exactly ``partitions``, by the inventory's ``leader_election`` command
        (``kafka-leader-election.sh`` with its connection options) with ``--election-type PREFERRED
        --path-to-json-file`` a file written in a fresh dir of ``tmp_dir`` (``mktemp -d``; readable, as the command may
        run as the Kafka user, writable by the SSH user alone); each partition's outcome
        (``parse_election``). RepairError when the command names none of them (it could not run)."""
        command = self.entry.service.get("leader_election")
        if not command:
            raise RepairError(f"broker {self.broker_id}: the inventory has no service.leader_election command")
        wanted = sorted(set(partitions))
        body = json.dumps({"partitions": [{"topic": t, "partition": p} for t, p in wanted]}).encode()
        tmp = shlex.quote(self.tmp_dir)
        out = bytearray()
        ran = self.remote.stream(
            # the dir private to the SSH user but readable (the command may run as the Kafka user through sudo):
            # nothing else can write there, and the file holds topic names only
            f'd=$(mktemp -d {tmp}/fleet-doctor-elect.XXXXXXXXXX) && chmod 755 "$d" && '
            f'(umask 022 && cat > "$d/partitions.json") && '
            f'{{ {command} --election-type PREFERRED --path-to-json-file "$d/partitions.json"; rc=$?; '
            'rm -rf -- "$d"; exit $rc; }',
            body,
            out.extend,
            timeout,
        )
        results = parse_election(out.decode(errors="replace"))
        if not results and wanted:
            raise RepairError(
                f"broker {self.broker_id}: the preferred election did not run (exit {ran.exit_status}): "
                f"{(ran.stderr or out.decode(errors='replace')).strip()[-300:]}"
            )
        return results

    @property
    def tmp_dir(self) -> str:
        return str(self.entry.tmp_dir)

    def close(self) -> None:
        self.remote.close()

    def change(
        self,
        ops: list[dict[str, Any]],
        tarball: tuple[Path, str] | None = None,
        check: bool = False,
        spool_bytes: int = 0,
        unlocked: bool = False,
    ) -> Completed:
        """``ops`` run on the broker by ``repair.on_broker`` (as the Kafka user when the inventory names one), under
        the log dirs' lock, no symlink followed, with ``tarball`` (its path here and sha256) sent after the program
        for ``install`` ops (``check``: the log dirs' ``.lock`` opened, not taken, and room to spool a backup of
        ``spool_bytes`` checked); its exit status and output (a JSON line per op done) as they came."""
        spec: dict[str, Any] = {"log_dirs": list(self.entry.log_dirs), "ops": ops, "check": check}
        if unlocked:  # a quarantine listed or deleted: never Kafka's files, beside a running broker
            spec["unlocked"] = True
        if tarball is not None:
            spec["tarball"] = {"sha256": tarball[1], "tmp_dir": self.tmp_dir}
        if check and spool_bytes:
            spec["spool"] = {"tmp_dir": self.tmp_dir, "bytes": spool_bytes}
        argv, head = on_broker_command(spec)
        stdin: list[bytes] | Iterator[bytes] = [head]
        if tarball is not None:
            stdin = itertools.chain(stdin, _chunks(tarball[0]))
        out = bytearray()
        ran = self.remote.stream(as_user(self.entry.kafka_user, shlex.join(argv)), stdin, out.extend, CHANGE_TIMEOUT_S)
        return Completed(ran.exit_status, out.decode(errors="replace"), ran.stderr)


# Kafka's BrokerState gauge (metadata/BrokerState.java): its values as a JMX read gives them, by name
BROKER_STATES = {
    0: "NOT_RUNNING",
    1: "STARTING",
    2: "RECOVERY",
    3: "RUNNING",
    6: "PENDING_CONTROLLED_SHUTDOWN",
    7: "SHUTTING_DOWN",
    127: "UNKNOWN",
}
ELECTED, NOT_NEEDED = None, "noop"  # a preferred election's outcome for a partition, besides its error text
_ELECTION_LINES = (
    (re.compile(r"Successfully completed leader election \(PREFERRED\) for partitions (.+)$"), ELECTED),
    (re.compile(r"Valid replica already elected for partitions (.+)$"), NOT_NEEDED),
)
_ELECTION_ERROR = re.compile(r"Error completing leader election \(PREFERRED\) for partition: (\S+): (.+)$")


@dataclass(frozen=True)
class BrokerState:
    """What the inventory's ``broker_state`` command printed: Kafka's BrokerState, and in RECOVERY what is left."""

    name: str  # BROKER_STATES' names; "UNKNOWN" when the output named none
    remaining_logs: int | None = None  # LogManager's remainingLogsToRecover (3.3+, KIP-831)
    remaining_segments: int | None = None  # ... remainingSegmentsToRecover
    text: str = ""

    @property
    def recovering(self) -> bool:
        return self.name == "RECOVERY"


def parse_broker_state(text: str) -> BrokerState:
    """The BrokerState ``text`` names: ``BrokerState=RECOVERY`` (or ``=2``), a Jolokia read's ``"value":2``, or the
    whole output a name or a number (``RECOVERY``, ``2``); ``remainingLogsToRecover=N`` and
    ``remainingSegmentsToRecover=M`` when present. Anything else is UNKNOWN: a number elsewhere in the output (an
    address, an error message) is never taken for a state."""
    names = set(BROKER_STATES.values())
    m = (
        re.search(r"BrokerState\s*[=:]\s*([A-Z_]+|\d+)\b", text)
        or re.search(r'"value"\s*:\s*(\d+)\b', text)
        or re.fullmatch(r"\s*([A-Z_]+|\d+)\s*", text)
    )
    token = m.group(1) if m else ""
    name = token if token in names else BROKER_STATES.get(int(token), "UNKNOWN") if token.isdigit() else "UNKNOWN"

    def gauge(key: str) -> int | None:
        m = re.search(rf"{key}\D{{0,3}}(\d+)", text)
        return int(m.group(1)) if m else None

    return BrokerState(name, gauge("remainingLogsToRecover"), gauge("remainingSegmentsToRecover"), text.strip()[:300])


def parse_election(stdout: str) -> dict[str, str | None]:
    """``kafka-leader-election.sh``'s output: each partition named, with ``ELECTED``, ``NOT_NEEDED`` or its error."""
    out: dict[str, str | None] = {}
    for line in stdout.splitlines():
        line = line.strip()
        for pattern, outcome in _ELECTION_LINES:
            m = pattern.match(line)
            if m:
                out.update(dict.fromkeys((p.strip() for p in m.group(1).split(",")), outcome))
        m = _ELECTION_ERROR.match(line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


# How the executor reaches a broker: (broker id, the journal's command log) -> its host, connected.
Hosts = Callable[[int, list[dict[str, Any]]], BrokerHost]


def ssh_hosts(inv: inventory.Inventory, connect: Callable[[int], Any]) -> Hosts:
    """Hosts over ``connect(broker_id) -> paramiko.SSHClient`` (the DAG's: the broker's Airflow SSH connection),
    every command logged to the journal."""

    def host(broker_id: int, log: list[dict[str, Any]]) -> BrokerHost:
        return BrokerHost(Remote(connect(broker_id), broker_id, log), inv.broker(broker_id))

    return host
