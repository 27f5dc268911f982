"""The probe's worker processes (``--jobs N``): the same output as one process, and counts that stay true when a
worker dies in the middle of a partition (its remaining partitions are taken over, nothing is printed twice)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor import probe as probe_mod
from fleet_doctor.probe import Probe

SAMPLE = "zk-2.8plus-producerstate-cheynee"
COUNTED = {"partitions": "partition", "segments": "segment", "files": "file"}


def probe_records(logdirs: list[str], jobs: int) -> list[dict[str, Any]]:
    out = io.StringIO()
    Probe(out, deep=True, jobs=jobs).run(logdirs)
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


def test_workers_print_what_one_process_prints(corpus: Path):
    logdirs = sample_logdirs(corpus)
    one = probe_records(logdirs, jobs=1)
    assert len([r for r in one if r["kind"] == "partition"]) > 4
    three = probe_records(logdirs, jobs=3)
    assert timeless(three) == timeless(one)
    assert_counts_true(three)


@pytest.mark.parametrize("partition_record_sent", [False, True])
def test_a_worker_dying_mid_partition(corpus: Path, monkeypatch, partition_record_sent: bool):
    """A worker prints part of a partition and dies before the partition's end: what it printed is counted, the
    partition is reported as failed unless its partition record got out (then it is not printed twice), and the
    main process probes the worker's remaining partitions itself."""
    logdirs = sample_logdirs(corpus)
    parent = os.getpid()
    real = Probe._probe_partition_safe
    victim: list[str] = []

    def dying(self, logdir, root, e, cp_values):
        name = e if isinstance(e, str) else e.name
        real(self, logdir, root, e, cp_values)
        if os.getpid() != parent and not victim and self.counts["segments"] > 0:
            victim.append(name)
            parts = self.out.parts  # this partition's records, not yet sent: the partition record is the last
            assert parts and parts[-1].startswith('{"kind":"partition",')
            if not partition_record_sent:
                parts.pop()
            self.out._send_records()
            os._exit(1)

    monkeypatch.setattr(Probe, "_probe_partition_safe", dying)
    records = probe_records(logdirs, jobs=2)
    monkeypatch.undo()
    assert_counts_true(records)
    whole = probe_records(logdirs, jobs=1)
    died = [r for r in records if r["kind"] == "partition" and "ended mid-partition" in (r.get("error") or "")]
    if partition_record_sent:
        # nothing lost, nothing twice: the same records as one process prints
        assert not died and timeless(records) == timeless(whole)
    else:
        assert len(died) == 1
        dirs = [r["dir"] for r in records if r["kind"] == "partition"]
        assert sorted(dirs) == sorted(r["dir"] for r in whole if r["kind"] == "partition")  # every one, once
        # every other record is there as one process prints it, and the failure is one error more
        assert [r for r in timeless(records[:-1]) if r not in timeless(died)] == [
            r for r in timeless(whole[:-1]) if not (r["kind"] == "partition" and r["dir"] == died[0]["dir"])
        ]
        assert records[-1]["errors"] == whole[-1]["errors"] + 1


def test_the_relay_counts_only_record_starts():
    """A record start inside a string is always escaped by the probe's JSON encoder, so it is never counted."""
    rec = {"kind": "file", "logdir": "/d", "path": '/d/{"kind":"segment",x', "error": "e"}
    line = probe_mod._JSON_ENCODE(rec).encode("ascii")
    assert line.count(probe_mod._RELAY_COUNTED["files"]) == 1
    assert line.count(probe_mod._RELAY_COUNTED["segments"]) == 0
    assert line.count(probe_mod._RELAY_COUNTED["errors"]) == 1
