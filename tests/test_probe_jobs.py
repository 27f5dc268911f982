"""The probe's worker processes (``--jobs N``): the same output as one process, and counts that stay true when a
worker dies (the main process probes the partitions the worker did not finish, or reports the one it died in as
failed when some of its records are out already; nothing is printed twice, nothing is skipped).

The probe forks only when its process has no other thread (``probe._fork_ok``), and a test process that started
Spark has some, so the probe runs in a fresh interpreter here, with the worker's death injected there."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor.probe import Probe
from harness.corpus import REPO

SAMPLE = "zk-2.8plus-producerstate-cheynee"
COUNTED = {"partitions": "partition", "segments": "segment", "files": "file"}
# argv: where the worker dies (none | before: before its first record of a partition | cut: after some records of
# it, before its partition record | after: after its partition record, before the end of its last frame), jobs,
# the marker file the dying worker creates (naming the partition), log dirs. With a death, every record goes in a
# frame of its own (_FRAME_BYTES = 1), so a partition's records reach the main process one by one.
RUN_WITH_WORKERS = r"""
import io, json, os, sys
sys.path.insert(0, sys.argv[1])
from fleet_doctor import probe
from fleet_doctor.probe import Probe

mode, jobs, marker = sys.argv[2], int(sys.argv[3]), sys.argv[4]
logdirs = sys.argv[5:]
forks = []
real_fork = os.fork
def counting_fork():
    pid = real_fork()
    if pid:
        forks.append(pid)
    return pid
os.fork = counting_fork
parent = os.getpid()

def dies_here(name):
    # the first partition with segments that a worker probes: its worker dies there, once
    if os.getpid() == parent or os.path.exists(marker) or not any(n.endswith(".log") for n in os.listdir(name)):
        return False
    with open(marker, "x") as f:
        f.write(os.path.basename(name))
    return True

real_safe, real_emit = Probe._probe_partition_safe, Probe._emit_partition
def safe(self, logdir, root, name, cp_values):
    path = os.path.join(logdir, name)
    if mode == "before" and dies_here(path):
        os._exit(1)
    real_safe(self, logdir, root, name, cp_values)
    if mode == "after" and dies_here(path):
        os._exit(1)
def emit_partition(self, rec):
    if mode == "cut" and dies_here(rec["path"]):
        os._exit(1)
    real_emit(self, rec)
if mode != "none":
    probe._FRAME_BYTES = 1
    Probe._probe_partition_safe, Probe._emit_partition = safe, emit_partition
out = io.StringIO()
Probe(out, deep=True, jobs=jobs).run(logdirs)
sys.stdout.write(json.dumps({"forks": len(forks), "fork_ok": probe._fork_ok()}) + "\n" + out.getvalue())
"""


def with_workers(logdirs: list[str], jobs: int, mode: str, marker: Path) -> tuple[dict[str, Any], list[dict]]:
    argv = [str(REPO / "plugins"), mode, str(jobs), str(marker), *logdirs]
    r = subprocess.run(
        [sys.executable, "-c", RUN_WITH_WORKERS, *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    head, *lines = r.stdout.splitlines()
    run = json.loads(head)
    assert run["fork_ok"] and run["forks"] >= 1, run  # the workers did run
    return run, [json.loads(line) for line in lines]


def one_process(logdirs: list[str]) -> list[dict[str, Any]]:
    out = io.StringIO()
    Probe(out, deep=True, jobs=1).run(logdirs)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def sample_logdirs(corpus: Path) -> list[str]:
    logdirs = sorted(str(p.parent) for p in (corpus / SAMPLE).rglob("meta.properties"))
    assert logdirs
    return logdirs


def assert_counts_true(records: list[dict[str, Any]]) -> None:
    end = records[-1]
    assert end["kind"] == "probe_end" and end["complete"] is True
    assert {k: end[k] for k in COUNTED} == {k: sum(r["kind"] == v for r in records) for k, v in COUNTED.items()}
    assert end["errors"] == sum(1 for r in records if r.get("error"))


def timeless(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    drop = {"started_at_ms", "elapsed_ms"}
    return [{k: v for k, v in r.items() if k not in drop} for r in records]


def test_workers_print_what_one_process_prints(corpus: Path, tmp_path: Path):
    logdirs = sample_logdirs(corpus)
    one = one_process(logdirs)
    assert len([r for r in one if r["kind"] == "partition"]) > 4
    run, three = with_workers(logdirs, 3, "none", tmp_path / "marker")
    assert run["forks"] == 2 * len(logdirs)
    assert timeless(three) == timeless(one)
    assert_counts_true(three)


@pytest.mark.parametrize("mode", ["before", "after"])
def test_a_worker_dying_between_records_of_its_own(corpus: Path, tmp_path: Path, mode: str):
    """A worker dies before it sent anything of a partition (the main process probes it, and the worker's other
    partitions, itself), or after the partition's last record went out: the same records as one process."""
    logdirs = sample_logdirs(corpus)
    marker = tmp_path / "died"
    _, records = with_workers(logdirs, 2, mode, marker)
    assert marker.read_text()  # the worker did die where the test meant it to
    assert_counts_true(records)
    assert timeless(records) == timeless(one_process(logdirs))


def test_a_worker_dying_mid_partition(corpus: Path, tmp_path: Path):
    """A worker dies after some records of a partition went out, before its partition record: what it sent is
    counted, the partition is reported as failed (once), and the main process probes the worker's remaining
    partitions itself."""
    logdirs = sample_logdirs(corpus)
    marker = tmp_path / "died"
    _, records = with_workers(logdirs, 2, "cut", marker)
    victim = marker.read_text()
    assert_counts_true(records)
    whole = one_process(logdirs)
    died = [r for r in records if r["kind"] == "partition" and "ended mid-partition" in (r.get("error") or "")]
    assert [r["dir"] for r in died] == [victim]
    dirs = [r["dir"] for r in records if r["kind"] == "partition"]
    assert sorted(dirs) == sorted(r["dir"] for r in whole if r["kind"] == "partition")  # every one, once
    # every other record is there as one process prints it, and the failure is one error more
    assert [r for r in timeless(records[:-1]) if r not in timeless(died)] == [
        r for r in timeless(whole[:-1]) if not (r["kind"] == "partition" and r["dir"] == victim)
    ]
    assert records[-1]["errors"] == whole[-1]["errors"] + 1
