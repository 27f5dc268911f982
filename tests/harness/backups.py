"""What the fault matrices check after a fault: is every planned file's content, as the plan found it, still somewhere
(on disk, or in a backup of the attempt whose tarball matches its recorded checksum)?"""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def backed_up(attempt_dir: Path) -> dict[str, set[str]]:
    """path -> sha256 of every copy of it in the attempt's backups whose tarball matches its recorded checksum."""
    out: dict[str, set[str]] = {}
    for tarball in sorted(attempt_dir.glob("broker-*/backup-*.tar.gz")):
        recorded = tarball.with_name(tarball.name.replace(".tar.gz", ".sha256"))
        if not recorded.is_file() or recorded.read_text().split()[0] != sha(tarball.read_bytes()):
            continue  # not a verified backup
        with tarfile.open(tarball) as tar:
            for m in tar:
                f = tar.extractfile(m)
                assert f is not None
                out.setdefault("/" + m.name.lstrip("/"), set()).add(sha(f.read()))
    return out


def lost_files(originals: dict[str, bytes], attempt_dir: Path, *elsewhere: dict[str, set[str]]) -> list[str]:
    """Planned files (path -> the bytes the plan found) whose bytes are neither on disk nor in a verified backup of
    the attempt (nor in ``elsewhere``: path -> sha256s, e.g. the quarantined copies)."""
    held = backed_up(attempt_dir)
    lost = []
    for path, data in originals.items():
        p = Path(path)
        on_disk = sha(p.read_bytes()) if p.exists() else None
        kept = held.get(path, set()).union(*(e.get(path, set()) for e in elsewhere))
        if on_disk != sha(data) and sha(data) not in kept:
            lost.append(path)
    return lost
