"""The post-verify's judgement (repair.verify) on a real log dir's probe output: which touched files the broker has
again, and which are still named by a finding."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

from fleet_doctor.probe import Probe
from fleet_doctor.repair.plan import FileAction
from fleet_doctor.repair.verify import _present, problems
from harness.corpus import CORPUS


def _output(logdir: Path) -> bytes:
    out = io.StringIO()
    Probe(out).run([str(logdir)])
    return out.getvalue().encode()


def test_present_and_problems_on_a_real_log_dir(tmp_path: Path) -> None:
    logdir = tmp_path / "kafka-logs"
    shutil.copytree(CORPUS / "zk-3.1-single-aryan" / "kafka-logs", logdir)
    pdir = str(logdir / "quickstart-events-0")
    index, metadata = f"{pdir}/00000000000000000000.index", f"{pdir}/partition.metadata"
    present = _present(_output(logdir), {pdir})
    assert {index, metadata, f"{pdir}/00000000000000000000.log"} <= present
    assert not any("__consumer_offsets" in p for p in present)  # only the touched partition dirs are parsed
    quarantine = FileAction("quarantine", index, "index-untrimmed", "quickstart-events", 0, "")
    remove = FileAction("remove", metadata, "topic-id-mismatch", "quickstart-events", 0, "")
    assert problems([quarantine, remove], [], present) == []
    finding = {"rule": "index-size", "path": index, "message": "index file is corrupt"}
    assert problems([quarantine], [finding], present) == [f"{index}: index-size: index file is corrupt"]
    # the broker has not re-created them: the index (its log is there) and partition.metadata
    Path(index).unlink()
    Path(metadata).unlink()
    gone = _present(_output(logdir), {pdir})
    assert problems([quarantine, remove], [], gone) == [
        f"{index} was not re-created by the broker's start",
        f"{metadata} was not re-created by the broker's start",
    ]
