"""The probe's worker processes (``--jobs N``): the same output as one process, and counts that stay true when a
worker dies in the middle of a partition (its remaining partitions are taken over, nothing is printed twice).

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

from fleet_doctor import probe as probe_mod
from fleet_doctor.probe import Probe
from harness.corpus import REPO

SAMPLE = "zk-2.8plus-producerstate-cheynee"
COUNTED = {"partitions": "partition", "segments": "segment", "files": "file"}
# argv: death mode (none | cut: before the partition record | whole: after it, before the partition's end),
# jobs, how many bytes of a partition's frames the main process keeps uncounted, the marker file a dying worker
# creates, log dirs
RUN_WITH_WORKERS = r"""
import io, json, os, sys
sys.path.insert(0, sys.argv[1])
from fleet_doctor import probe
from fleet_doctor.probe import Probe

mode, jobs, probe._RELAY_KEEP_BYTES, marker = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
logdirs = sys.argv[6:]
forks = []
real_fork = os.fork
def counting_fork():
    pid = real_fork()
    if pid:
        forks.append(pid)
    return pid
os.fork = counting_fork
parent = os.getpid()
real = Probe._probe_partition_safe
def dying(self, logdir, root, e, cp_values):
    real(self, logdir, root, e, cp_values)
    if os.getpid() == parent or os.path.exists(marker):
        return
    parts = self.out.parts  # this partition's records, not sent yet: the partition record is the last
    if not (parts and parts[-1].startswith('{"kind":"partition",')):
        return  # no marker: the test fails
    with open(marker, "x") as f:  # one worker dies, once
        f.write(e if isinstance(e, str) else e.name)
    if mode == "cut":
        parts.pop()
    self.out._send_records()
    os._exit(1)
if mode != "none":
    Probe._probe_partition_safe = dying
out = io.StringIO()
Probe(out, deep=True, jobs=jobs).run(logdirs)
sys.stdout.write(json.dumps({"forks": len(forks), "fork_ok": probe._fork_ok()}) + "\n" + out.getvalue())
"""


def with_workers(
    logdirs: list[str], jobs: int, mode: str, marker: Path, keep_bytes: int = 4 << 20
) -> tuple[dict[str, Any], list[dict]]:
    argv = [str(REPO / "plugins"), mode, str(jobs), str(keep_bytes), str(marker), *logdirs]
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


@pytest.mark.parametrize(("mode", "keep_bytes"), [("cut", 4 << 20), ("whole", 4 << 20), ("cut", 0), ("whole", 0)])
def test_a_worker_dying_mid_partition(corpus: Path, tmp_path: Path, mode: str, keep_bytes: int):
    """A worker prints part of a partition and dies before the partition's end: what it printed is counted, the
    partition is reported as failed unless its partition record got out (then it is not printed twice), and the
    main process probes the worker's remaining partitions itself. keep_bytes 0: every frame is counted as it
    comes, as a big partition's are."""
    logdirs = sample_logdirs(corpus)
    marker = tmp_path / "died"
    _, records = with_workers(logdirs, 2, mode, marker, keep_bytes)
    victim = marker.read_text()  # the worker did die where the test meant it to
    assert_counts_true(records)
    whole = one_process(logdirs)
    died = [r for r in records if r["kind"] == "partition" and "ended mid-partition" in (r.get("error") or "")]
    if mode == "whole":
        # nothing lost, nothing twice: the same records as one process prints
        assert not died and timeless(records) == timeless(whole)
        return
    assert [r["dir"] for r in died] == [victim]
    dirs = [r["dir"] for r in records if r["kind"] == "partition"]
    assert sorted(dirs) == sorted(r["dir"] for r in whole if r["kind"] == "partition")  # every one, once
    # every other record is there as one process prints it, and the failure is one error more
    assert [r for r in timeless(records[:-1]) if r not in timeless(died)] == [
        r for r in timeless(whole[:-1]) if not (r["kind"] == "partition" and r["dir"] == victim)
    ]
    assert records[-1]["errors"] == whole[-1]["errors"] + 1


def test_the_relay_counts_records_as_the_probe_counts_them():
    """Only a line's start counts as a record (an object inside a record, such as a quorum-state's content, does
    not), and an error only when the record's own error is set."""
    lines = [
        {"kind": "file", "logdir": "/d", "path": '/d/{"kind":"segment",x', "error": "cannot read"},
        {"kind": "file", "logdir": "/d", "path": "/d/q", "content": {"kind": "partition", "error": "x"}, "error": None},
        {"kind": "segment", "logdir": "/d", "path": "/d/t-0", "base_offset": 0, "error": ""},
        {"kind": "partition", "logdir": "/d", "path": "/d/t-0", "error": None},
    ]
    payload = "".join(probe_mod._JSON_ENCODE(r) + "\n" for r in lines).encode("ascii")
    counts = {"partitions": 0, "segments": 0, "files": 0, "errors": 0}
    probe_mod._count_relayed(payload, counts)
    assert counts == {"partitions": 1, "segments": 1, "files": 2, "errors": 1}
