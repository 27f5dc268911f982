"""The repair's backups on this side (the repairs dir): checksums, what a tarball holds, what the backups taken so far
cover. A backup is a tar.gz of the files a broker's step changes, fetched before the change (``BrokerHost.backup``),
recorded in the journal with its sha256 and its manifest (path -> sha256 of each member)."""

from __future__ import annotations

import hashlib
import tarfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from fleet_doctor.repair.errors import RepairError


def sha256_stream(stream: IO[bytes]) -> str:
    h = hashlib.sha256()
    for chunk in iter(lambda: stream.read(1 << 20), b""):
        h.update(chunk)
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return sha256_stream(f)


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
            out[path] = sha256_stream(stream)
    return out


def member_names(tarball: Path) -> list[str]:
    """The members' names as the tarball stores them (what ``tar -x`` is told to unpack)."""
    with tarfile.open(tarball, "r:gz") as tar:
        return [m.name for m in tar]


def covers(backups: Iterable[Mapping[str, Any]], present: Mapping[str, str], missing: Iterable[str]) -> bool:
    """Whether the backups already taken hold every planned file as it is now: each present file with its current
    checksum in the newest backup that has it, each missing file in some backup (this attempt removed or moved it)."""
    newest: dict[str, str] = {}
    for bk in backups:
        newest.update(bk["files"])
    return all(newest.get(p) == d for p, d in present.items()) and all(p in newest for p in missing)
