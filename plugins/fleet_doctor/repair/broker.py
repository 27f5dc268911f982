"""A broker's host as a repair acts on it: its service, its files, its log dirs' ``.lock``, over one SSH connection.

Every command the repair and the restore send to a broker is built here and nowhere else, each with its paths
quoted: the executor decides what to do and when (``repair.executor``), ``BrokerHost`` knows how. A second
implementation of these calls, over files in memory, drives the executor in the unit tests
(``tests/harness/fakes.py``); a contract test runs the same calls on both (``tests/test_fakes_contract.py``).

File changes run on the broker as ``repair.on_broker`` (sent to ``python3 -``): no symlink followed at or below a log
dir, while holding every log dir's ``.lock`` the way Kafka does, so no broker can start on those dirs while a file
changes; the lock is never created, a broker holding it makes the change exit ``LOCK_HELD`` without running, and a
path that is not a real file or directory at its expected place exits ``REFUSED`` naming it.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet_doctor import inventory
from fleet_doctor.identity import verify_broker
from fleet_doctor.remote import Completed, Remote
from fleet_doctor.repair.errors import RepairError
from fleet_doctor.repair.plan import QUARANTINE_DIR

# every change to a broker's files runs there as this program (no symlink followed, under the log dirs' .lock)
ON_BROKER = (Path(__file__).resolve().parent / "on_broker.py").read_bytes()
CHANGE_TIMEOUT_S = 600.0
_TMP = re.compile(r"fleet-doctor\.[A-Za-z0-9]{10}")


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
        return self.remote.run(command).stdout.split()

    # ---- files
    def sums(self, paths: Iterable[str]) -> tuple[dict[str, str], list[str]]:
        """The sha256 of each of ``paths`` that exists on the broker right now, and the ones that do not exist."""
        out = self.remote.run(
            f'set -e; for f in {_quoted(paths)}; do if [ -e "$f" ] || [ -L "$f" ]; then sha256sum -z -- "$f"; '
            "else printf 'missing  %s\\0' \"$f\"; fi; done"
        ).stdout
        sums = _sums(out)
        missing = sorted(p for p, d in sums.items() if d == "missing")
        return {p: d for p, d in sums.items() if d != "missing"}, missing

    def backup(self, paths: list[str], tarball: Path) -> Backup:
        """A tar.gz of ``paths`` made in a private directory on the broker (``mktemp -d``: 0700, unpredictable),
        fetched to ``tarball`` and its checksum compared with the broker's (RepairError when they differ)."""
        from fleet_doctor.repair.backups import sha256_file

        out = self.remote.run(
            f"d=$(mktemp -d {shlex.quote(self.tmp_dir)}/fleet-doctor.XXXXXXXXXX) && "
            f'{{ tar -czf "$d/backup.tar.gz" -- {_quoted(paths)} && sha256sum -- "$d/backup.tar.gz"; }} '
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
        return self.change([{"op": "quarantine", "path": path, "into": quarantine_subdirs(plan_hash)}])

    def put_back(self, tarball: Path, sha256: str, members: list[str]) -> None:
        """Upload a backup into a private dir (``mktemp -d``), check its checksum there, unpack only ``members``
        into that dir (GNU tar refuses ``..`` and strips a leading ``/``), then install each at its place under
        ``/`` without following a symlink (``on_broker``: a new file beside it, owned as the partition dir, renamed
        over it), under the log dirs' lock. RemoteError when any of it fails."""
        base = self.tmp_dir
        tmp = self.remote.run(f"mktemp -d {shlex.quote(base)}/fleet-doctor.XXXXXXXXXX").stdout.strip()
        if tmp.rsplit("/", 1)[0] != base.rstrip("/") or not _TMP.fullmatch(tmp.rsplit("/", 1)[-1]):
            raise RepairError(f"broker {self.broker_id}: mktemp gave {tmp!r}")
        target = f"{tmp}/backup.tar.gz"
        try:
            self.remote.put(tarball, target)
            unpack = (
                f'[ "$(sha256sum < {target} | cut -c1-64)" = {sha256} ] || '
                f'{{ echo "checksum mismatch after upload" >&2; exit 1; }}; '
                f"mkdir -- {tmp}/files && tar -xzf {target} -C {tmp}/files --no-recursion -- {_quoted(members)}"
            )
            ran = self.remote.run(unpack, check=False)
            if ran.exit_status != 0:
                raise RepairError(f"broker {self.broker_id}: unpacking {tarball.name} failed: {ran.stderr[-300:]}")
            names = [m.lstrip("/") for m in members]
            ops = [{"op": "install", "from": f"{tmp}/files/{m}", "path": f"/{m}"} for m in names]
            ran = self.change(ops)
            if ran.exit_status != 0:
                raise RepairError(f"broker {self.broker_id}: putting back {tarball.name} failed: {ran.stderr[-300:]}")
        finally:
            self.remote.run(f"rm -rf -- {tmp}", check=False)

    def own_as_parent(self, paths: Iterable[str]) -> None:
        """Each file owned as its partition dir is (the SSH user need not be Kafka's), no symlink followed."""
        ran = self.change([{"op": "own", "path": p} for p in sorted(paths)])
        if ran.exit_status != 0:
            raise RepairError(f"broker {self.broker_id}: owning the restored files failed: {ran.stderr[-300:]}")

    def owners(self, paths: Iterable[str]) -> dict[str, str]:
        """``uid:gid`` of each path."""
        stat = self.remote.run(f"stat -c '%u:%g %n' -- {_quoted(paths)}").stdout
        return dict(reversed(line.split(" ", 1)) for line in stat.splitlines() if line)  # type: ignore[misc]

    @property
    def tmp_dir(self) -> str:
        return str(self.entry.tmp_dir)

    def close(self) -> None:
        self.remote.close()

    def change(self, ops: list[dict[str, Any]]) -> Completed:
        """``ops`` run on the broker by ``repair.on_broker`` (its source on stdin), under the log dirs' lock, no
        symlink followed; its exit status and output (a JSON line per op done) as they came."""
        spec = json.dumps({"log_dirs": list(self.entry.log_dirs), "ops": ops})
        out = bytearray()
        ran = self.remote.stream(f"python3 - {shlex.quote(spec)}", ON_BROKER, out.extend, CHANGE_TIMEOUT_S)
        return Completed(ran.exit_status, out.decode(errors="replace"), ran.stderr)


# How the executor reaches a broker: (broker id, the journal's command log) -> its host, connected.
Hosts = Callable[[int, list[dict[str, Any]]], BrokerHost]


def ssh_hosts(inv: inventory.Inventory, connect: Callable[[int], Any]) -> Hosts:
    """Hosts over ``connect(broker_id) -> paramiko.SSHClient`` (the DAG's: the broker's Airflow SSH connection),
    every command logged to the journal."""

    def host(broker_id: int, log: list[dict[str, Any]]) -> BrokerHost:
        return BrokerHost(Remote(connect(broker_id), broker_id, log), inv.broker(broker_id))

    return host
