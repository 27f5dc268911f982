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


def test_leftovers_on_genuine_cleaner_files_planned_and_verified(tmp_path: Path) -> None:
    """Geraldine's broker died mid-clean (a .log.swap, an .index.swap and a .timeindex.cleaned in one partition dir):
    the plan leaves all three to Kafka (its start completes or deletes the swaps from the lowest .cleaned base
    offset). HelloTopic-0's segment renamed .deleted, as retention does before the asynchronous delete, is quarantined;
    the post-verify neither asks the broker to re-create it nor judges a file of that name found again (the cleaner
    and retention write such files once the broker runs: a cleaned segment keeps its base offset)."""
    from fleet_doctor.repair.planner import FleetFacts, build_plan

    logdir = tmp_path / "kafka-logs"
    shutil.copytree(CORPUS / "zk-3.3-cleaner-swap-geraldine" / "kafka-logs", logdir)
    offsets = logdir / "__consumer_offsets-18"
    hello = logdir / "HelloTopic-0"
    for f in sorted(hello.glob("00000000000000000006.*")):
        f.rename(f.with_name(f.name + ".deleted"))

    def plan_now() -> object:
        records = [__import__("json").loads(line) for line in _output(logdir).splitlines()]
        leftovers = [r for r in records if r.get("kind") == "file" and r.get("file_type") == "segment_leftover"]
        findings = [
            {"rule": "segment-leftover", "broker_id": 0, "topic": None, "partition": None, "segment": r["base_offset"]}
            | {"path": r["path"]}
            for r in leftovers
        ]
        return build_plan("c", "r", findings, FleetFacts({0: records}, []))

    plan = plan_now()
    (b,) = [b for b in plan.brokers if b.restart]  # type: ignore[attr-defined]
    moved = sorted(a.path for a in b.actions)
    assert moved and all(p.startswith(f"{hello}/00000000000000000006.") and p.endswith(".deleted") for p in moved)
    assert {s["path"] for s in plan.skipped} == {  # type: ignore[attr-defined]
        f"{offsets}/00000000000000000000.log.swap",
        f"{offsets}/00000000000000000000.index.swap",
        f"{offsets}/00000000000000000000.timeindex.cleaned",
    }
    # after the restart the files are gone (quarantined, or deleted by Kafka): nothing to re-create
    for p in moved:
        Path(p).unlink()
    present = _present(_output(logdir), {str(hello)})
    assert problems(list(b.actions), [], present) == []
    again = {"rule": "segment-leftover", "path": moved[0], "message": "leftover .deleted file"}
    assert problems(list(b.actions), [again], present) == []
