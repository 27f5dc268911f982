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


def test_a_removed_leader_epoch_checkpoint_must_be_back_after_the_restart(tmp_path: Path) -> None:
    """Kafka creates leader-epoch-checkpoint whenever it loads a log (empty when it was missing), so a removed one
    that is still missing after the restart means the broker did not load the partition; an empty one or one with
    entries (a leader's) is what a loaded log has."""
    logdir = tmp_path / "kafka-logs"
    shutil.copytree(CORPUS / "zk-3.1-single-aryan" / "kafka-logs", logdir)
    pdir = str(logdir / "quickstart-events-0")
    lec = Path(pdir) / "leader-epoch-checkpoint"
    remove = FileAction("remove", str(lec), "topic-id-mismatch", "quickstart-events", 0, "")
    assert lec.read_bytes() == b"0\n1\n0 0\n"  # the leader's entry, as Kafka wrote it
    assert problems([remove], [], _present(_output(logdir), {pdir})) == []
    lec.unlink()
    lec.write_bytes(b"")  # what CheckpointFile's constructor leaves when the file was missing at load
    assert problems([remove], [], _present(_output(logdir), {pdir})) == []
    lec.unlink()
    assert problems([remove], [], _present(_output(logdir), {pdir})) == [
        f"{lec} was not re-created by the broker's start (Kafka creates it when it loads the log: the broker did not "
        "load it)"
    ]
    # its content is detection's: a finding that names it is a problem
    lec.write_bytes(b"0\n1\nbogus\n")
    finding = {"rule": "leader-epoch-malformed", "path": str(lec), "message": "Malformed line in checkpoint file"}
    assert problems([remove], [finding], _present(_output(logdir), {pdir})) == [
        f"{lec}: leader-epoch-malformed: Malformed line in checkpoint file"
    ]
