"""The real-data corpus and an in-process probe runner, for the tests (the fixtures in conftest.py use them)."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from fleet_doctor.probe import Probe

REPO = Path(__file__).resolve().parents[2]
CORPUS = Path(os.environ.get("FLEET_DOCTOR_CORPUS", REPO.parent / "shared" / "kafka-real-data"))


def run_probe(*paths: os.PathLike | str, deep: bool = False, verify_crc: bool = False) -> list[dict[str, Any]]:
    """Run the probe in-process and return its records (every line must be valid JSON)."""
    out = io.StringIO()
    Probe(out, deep=deep, verify_crc=verify_crc).run([str(p) for p in paths])
    return [json.loads(line) for line in out.getvalue().splitlines()]


def by_kind(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r["kind"] == kind]


def partition(records: list[dict[str, Any]], dirname: str) -> dict[str, Any]:
    found = [r for r in records if r["kind"] == "partition" and r["dir"] == dirname]
    assert len(found) == 1, f"expected one partition record for {dirname}, got {len(found)}"
    return found[0]


def segments(records: list[dict[str, Any]], dirname: str) -> list[dict[str, Any]]:
    return sorted(
        (r for r in records if r["kind"] == "segment" and Path(r["path"]).name == dirname),
        key=lambda r: r["base_offset"],
    )


def copy_writable(src: Path, dst: Path) -> Path:
    """Copy a (read-only) corpus directory to dst and make the copy writable for mutation."""
    shutil.copytree(src, dst, symlinks=True)
    for root, dirs, files in os.walk(dst):
        for name in dirs + files:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | stat.S_IWUSR | stat.S_IRUSR | (stat.S_IXUSR if name in dirs else 0))
    os.chmod(dst, os.stat(dst).st_mode | stat.S_IWUSR)
    return dst
