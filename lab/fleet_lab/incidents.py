"""Incidents the fleet lab injects on demand, and the seed reports replayed end to end.

Each incident reproduces a Kafka mechanism (kafka-reference.md is cited per incident) and returns what it
did as a record: ``incident``, ``broker_id``, ``log_dir``, ``topic``, ``partition``, ``segment``,
``paths`` (absolute), ``rule`` (the detection rule that must report it) and ``mechanism``. Tests check
the claimed state by reading files and znodes, never by trusting this record.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_doctor.probe import (
    CLEAN_SHUTDOWN_FILE,
    LEADER_EPOCH_CHECKPOINT,
    PARTITION_METADATA,
    ZERO_UUID,
    segment_file_name,
)
from fleet_lab.broker import BrokerConfig, running_pid
from fleet_lab.fleet import LabError, LabState, live_replica_dirs, partition_topic_ids, run_service, wait_healthy
from fleet_lab.kafka_files import log_batches, segment_bases


@dataclass
class Target:
    broker_id: int
    log_dir: Path
    topic: str
    partition: int
    path: Path  # the partition dir

    def segments(self) -> list[int]:
        return segment_bases(self.path)

    def file(self, base: int, ext: str) -> Path:
        return self.path / segment_file_name(base, ext)


@dataclass
class Injected:
    incident: str
    rule: str | None
    mechanism: str
    broker_id: int | None = None
    log_dir: str | None = None
    topic: str | None = None
    partition: int | None = None
    segment: int | None = None
    paths: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def find_target(state: LabState, broker: int | None, topic: str | None, partition: int | None) -> Target:
    """A replica of ``topic`` (default ``orders``) on ``broker`` (default: the first broker hosting it)."""
    topic = topic or "orders"
    brokers = [state.broker(broker)] if broker is not None else state.brokers
    for b in brokers:
        for d in map(Path, b.log_dirs):
            for t, p, pdir in sorted(live_replica_dirs(d), key=lambda r: r[1]):
                if t == topic and (partition is None or p == partition):
                    return Target(b.id, d, topic, p, pdir)
    raise LabError(
        f"no replica of {topic}"
        + (f"-{partition}" if partition is not None else "")
        + (f" on broker {broker}" if broker is not None else "")
        + " in the lab"
    )


def _older_segment(t: Target) -> int:
    segs = t.segments()
    if len(segs) < 2:
        raise LabError(f"{t.path} has a single segment; pick a partition with an inactive segment")
    return segs[0]


def _base(t: Target, incident: str, rule: str | None, mechanism: str, segment: int | None, *paths: Path) -> Injected:
    return Injected(
        incident, rule, mechanism, t.broker_id, str(t.log_dir), t.topic, t.partition, segment, [str(p) for p in paths]
    )


# --------------------------------------------------------------------------------------------
# file damage
def index_bad_size(state: LabState, t: Target) -> Injected:
    base = _older_segment(t)
    idx = t.file(base, "index")
    with open(idx, "ab") as f:
        f.write(b"\0\0\0")
    return _base(
        t,
        "index-bad-size",
        "index-size",
        "an .index whose length is not a multiple of 8 (a torn resize or a copy cut short): OffsetIndex.sanityCheck "
        "'Index file ... is corrupt, found N bytes which is neither positive nor a multiple of 8' (reference §1.3)",
        base,
        idx,
    )


def index_orphan(state: LabState, t: Target) -> Injected:
    base = _older_segment(t)
    log = t.file(base, "log")
    log.unlink()
    left = [p for p in (t.file(base, "index"), t.file(base, "timeindex")) if p.exists()]
    return _base(
        t,
        "index-orphan",
        "index-orphan",
        "segment deletion interrupted between the .log and its indexes (LogSegment.delete removes the .log first); "
        "Kafka deletes the orphans at the next start: 'Found an orphaned index file ...' (reference §2.1 step 3)",
        base,
        *left,
    )


def index_missing(state: LabState, t: Target) -> Injected:
    base = _older_segment(t)
    idx = t.file(base, "index")
    idx.unlink()
    return _base(
        t,
        "index-missing",
        "index-missing",
        "the .index of a segment is gone (deleted by hand, as the seed-000 workaround does, or lost): Kafka rebuilds "
        "it by recovering the segment at the next start, which costs restart time (reference §1.4)",
        base,
        idx,
    )


def segment_leftover(state: LabState, t: Target) -> Injected:
    base = _older_segment(t)
    moved = []
    for ext in ("log", "index", "timeindex"):
        src = t.file(base, ext)
        if src.exists():
            dst = src.with_name(src.name + ".deleted")
            os.replace(src, dst)
            moved.append(dst)
    return _base(
        t,
        "segment-leftover",
        "segment-leftover",
        "retention renamed the oldest segment to *.deleted for asynchronous deletion (file.delete.delay.ms) and the "
        "broker died before the delete ran; Kafka removes them at the next start (reference §2.1 step 1)",
        base,
        *moved,
    )


def log_torn_tail(state: LabState, t: Target) -> Injected:
    active = t.segments()[-1]
    log = t.file(active, "log")
    batches = log_batches(log, active)
    if not batches:
        raise LabError(f"{log} holds no batch to tear; pick a partition with records")
    pos, _, _, size = batches[-1]
    with open(log, "rb") as f:
        f.seek(pos)
        last = f.read(size)
    with open(log, "ab") as f:
        f.write(last[: size // 2])  # half of a batch: its header promises more bytes than the file holds
    return _base(
        t,
        "log-torn-tail",
        "log-torn-tail",
        "a crash in the middle of an append left half a batch at the end of the active segment; recovery truncates "
        "it: 'Found invalid messages in log segment ... at byte offset N' (reference §2.5)",
        active,
        log,
    )


def log_crc(state: LabState, t: Target) -> Injected:
    base = _older_segment(t)
    log = t.file(base, "log")
    batches = log_batches(log, base)
    pos, _, _, size = batches[len(batches) // 2]
    flip_at = pos + size - 2  # inside the last record's value: covered by the CRC, not the header
    with open(log, "r+b") as f:
        f.seek(flip_at)
        b = f.read(1)
        f.seek(flip_at)
        f.write(bytes([b[0] ^ 0xFF]))
    inj = _base(
        t,
        "log-crc",
        "log-crc",
        "bit rot in a closed segment: the batch's CRC (CRC-32C for v2, CRC-32 for v0/v1) no longer matches; a "
        "fetch or recovery of it fails with CorruptRecordException (reference §3)",
        base,
        log,
    )
    inj.details = {"batch_position": pos, "byte_flipped_at": flip_at}
    return inj


def partition_metadata_malformed(state: LabState, t: Target) -> Injected:
    pm = t.path / PARTITION_METADATA
    pm.write_bytes(f"version: 0\ntopic_id: {ZERO_UUID}".encode())
    return _base(
        t,
        "partition-metadata-malformed",
        "partition-metadata-malformed",
        "partition.metadata holding the zero UUID (a hand edit or a broken tool): 'Invalid topic ID in partition "
        "metadata file'; the read error takes the whole log dir offline at the next start (reference §4.1)",
        None,
        pm,
    )


def leader_epoch_malformed(state: LabState, t: Target) -> Injected:
    lec = t.path / LEADER_EPOCH_CHECKPOINT
    lec.write_bytes(b"0\n2\n0 0\n")
    return _base(
        t,
        "leader-epoch-malformed",
        "leader-epoch-malformed",
        "a leader-epoch-checkpoint cut short (2 entries announced, 1 present): 'Expected [2] entries in checkpoint "
        "file ..., but found only [1]'; the log dir goes offline at the next start (reference §4.2, §2.3)",
        None,
        lec,
    )


def checkpoint_malformed(state: LabState, t: Target) -> Injected:
    cp = t.log_dir / "recovery-point-offset-checkpoint"
    lines = cp.read_text().splitlines()
    if len(lines) < 3:
        raise LabError(f"{cp} has no entry to damage")
    lines[2] = lines[2].rsplit(" ", 1)[0]  # "topic partition" without its offset
    cp.write_text("\n".join(lines) + "\n")
    inj = _base(
        t,
        "checkpoint-malformed",
        "checkpoint-malformed",
        "a torn recovery-point-offset-checkpoint line: 'Malformed line in checkpoint file [...]'; LogManager marks "
        "the dir offline (reference §2.3). A running broker rewrites the file at its next checkpoint or clean stop: "
        "inject on a stopped broker to keep the damage",
        None,
        cp,
    )
    inj.partition = None
    inj.topic = None
    return inj


def stray_dir(state: LabState, t: Target) -> Injected:
    dst = t.log_dir / f"{t.topic}-{t.partition}.{uuid.uuid4().hex}-delete"
    shutil.copytree(t.path, dst)
    return _base(
        t,
        "stray-dir",
        "stray-dir",
        "topic deletion renamed the replica to <topic>-<partition>.<uuid>-delete and the broker died before the "
        "asynchronous delete: a lingering -delete directory (reference §2.1)",
        None,
        dst,
    )


# --------------------------------------------------------------------------------------------
# process and ZooKeeper incidents
def kill9_untrimmed_index(state: LabState, broker: int | None) -> Injected:
    b = state.broker(broker if broker is not None else state.brokers[0].id)
    cfg = b.config()
    if not running_pid(cfg):
        raise LabError(f"broker {b.id} is not running: nothing to kill")
    r = run_service(b, "kill")
    if r.returncode != 0:
        raise LabError(f"kill of broker {b.id} failed: {r.stdout}{r.stderr}")
    untrimmed = []
    for d in map(Path, b.log_dirs):
        for part in sorted(os.listdir(d)):
            pdir = d / part
            if not pdir.is_dir():
                continue
            logs = segment_bases(pdir)
            if logs:
                for ext in ("index", "timeindex"):
                    f = pdir / segment_file_name(logs[-1], ext)
                    if f.exists() and f.stat().st_size >= cfg.segment_index_bytes - 12:
                        untrimmed.append(str(f))
    return Injected(
        "kill9-untrimmed-index",
        "index-untrimmed",
        "kill -9 of a running broker: the active segments' indexes stay preallocated to segment.index.bytes "
        "(10 MiB of zeros after the real entries) and no .kafka_cleanshutdown is written (reference §1.2, §2.2)",
        b.id,
        None,
        None,
        None,
        None,
        untrimmed,
        {"clean_shutdown_markers": [str(Path(d) / CLEAN_SHUTDOWN_FILE) for d in b.log_dirs]},
    )


def old_client_add_partitions(state: LabState, topic: str | None, partitions: int | None) -> Injected:
    topic = topic or "orders"
    zk = state.zk_client()
    try:
        raw, stat = zk.get(f"/brokers/topics/{topic}")
        znode = json.loads(raw)
        assignment = {int(p): r for p, r in znode["partitions"].items()}
        old_count = len(assignment)
        new_count = partitions or old_count * 2
        if new_count <= old_count:
            raise LabError(f"{topic} already has {old_count} partitions")
        rf = len(next(iter(assignment.values())))
        live = sorted(int(i) for i in zk.get_children("/brokers/ids"))
        for p in range(old_count, new_count):
            assignment[p] = [live[(p + k) % len(live)] for k in range(min(rf, len(live)))]
        # what a pre-2.8 AdminUtils.writeTopicPartitionAssignment writes: version 1, no topic_id
        new = {"version": 1, "partitions": {str(p): r for p, r in sorted(assignment.items())}}
        zk.set(f"/brokers/topics/{topic}", json.dumps(new).encode(), version=stat.version)
        added = list(range(old_count, new_count))
        _wait(
            lambda: all(zk.exists(f"/brokers/topics/{topic}/partitions/{p}/state") for p in added),
            20,
            f"the controller did not create state znodes for {topic} {added}",
        )
    finally:
        zk.stop()
        zk.close()
    inj = Injected(
        "old-client-add-partitions",
        "topic-id-missing-in-zk",
        "a pre-2.8 `kafka-topics --zookeeper --alter --partitions` (or CMAK via Curator) rewrites "
        "/brokers/topics/<t> as {version:1, partitions} and drops topic_id; the controller's partition-modification "
        "handler never restores it (KAFKA-14190, reference §5, §6)",
        topic=topic,
    )
    inj.details = {"old_topic_id": znode.get("topic_id"), "partitions_before": old_count, "partitions_after": new_count}
    return inj


def controller_failover(state: LabState) -> Injected:
    zk = state.zk_client()
    try:
        raw, _ = zk.get("/controller")
        old = json.loads(raw)["brokerid"]
        epoch_before = int(zk.get("/controller_epoch")[0])
        zk.delete("/controller")
        _wait(
            lambda: zk.exists("/controller") and int(zk.get("/controller_epoch")[0]) > epoch_before,
            20,
            "no new controller was elected",
        )
        new = json.loads(zk.get("/controller")[0])["brokerid"]
        epoch = int(zk.get("/controller_epoch")[0])
        # the new controller processes every topic (processTopicIds): wait until it is done
        _wait(
            lambda: (
                all(
                    json.loads(zk.get(f"/brokers/topics/{t}")[0]).get("topic_id")
                    for t in zk.get_children("/brokers/topics")
                )
                or not state.features.uses_topic_ids
            ),
            20,
            "the new controller did not assign topic IDs",
        )
    finally:
        zk.stop()
        zk.close()
    inj = Injected(
        "controller-failover",
        None,
        "the /controller znode deleted (as the seed-004 report does by hand): every broker races to recreate it, the "
        "winner bumps /controller_epoch and, with IBP >= 2.8, mints a new random topic ID for every topic znode "
        "without one (KafkaController.processTopicIds, reference §5)",
    )
    inj.details = {"controller_before": old, "controller_after": new, "controller_epoch": epoch}
    return inj


def _wait(check: Callable[[], Any], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.1)
    raise LabError(f"{message} within {timeout:.0f} s")


FILE_INCIDENTS: dict[str, Callable[[LabState, Target], Injected]] = {
    "index-bad-size": index_bad_size,
    "index-orphan": index_orphan,
    "index-missing": index_missing,
    "segment-leftover": segment_leftover,
    "log-torn-tail": log_torn_tail,
    "log-crc": log_crc,
    "partition-metadata-malformed": partition_metadata_malformed,
    "leader-epoch-malformed": leader_epoch_malformed,
    "checkpoint-malformed": checkpoint_malformed,
    "stray-dir": stray_dir,
}
INCIDENTS = ("kill9-untrimmed-index", "old-client-add-partitions", "controller-failover", *FILE_INCIDENTS)


def inject(
    state: LabState,
    incident: str,
    *,
    broker: int | None = None,
    topic: str | None = None,
    partition: int | None = None,
    partitions: int | None = None,
) -> Injected:
    if incident == "kill9-untrimmed-index":
        return kill9_untrimmed_index(state, broker)
    if incident == "old-client-add-partitions":
        return old_client_add_partitions(state, topic, partitions)
    if incident == "controller-failover":
        return controller_failover(state)
    if incident not in FILE_INCIDENTS:
        raise LabError(f"unknown incident {incident!r}; known: {', '.join(INCIDENTS)}")
    return FILE_INCIDENTS[incident](state, find_target(state, broker, topic, partition))


# --------------------------------------------------------------------------------------------
# scenarios: the seed reports, step by step
@dataclass
class Step:
    step: str
    ok: bool
    details: dict[str, Any] = field(default_factory=dict)


def _isr(zk: Any, topic: str, p: int) -> list[int]:
    return json.loads(zk.get(f"/brokers/topics/{topic}/partitions/{p}/state")[0])["isr"]


def scenario_seed_004(state: LabState, broker: int | None = None, topic: str = "seed-004") -> list[Step]:
    """seed-004 steps 1-8: topic created by an old client, partitions added by an old client, controller
    failover, broker restart -> the restarted broker stays out of ISR for the old partitions."""
    if not state.features.uses_topic_ids:
        raise LabError(f"seed-004 needs a lab at Kafka >= 2.8 (this one runs {state.kafka_version})")
    steps: list[Step] = []
    n = len(state.brokers)
    rf = min(3, n)
    ids = [b.id for b in state.brokers]
    zk = state.zk_client()
    try:
        # 1. a pre-2.8 client creates the topic: a version-1 znode without topic_id; the controller mints one
        assignment = {str(p): [ids[(p + k) % n] for k in range(rf)] for p in range(3)}
        zk.create(f"/config/topics/{topic}", json.dumps({"version": 1, "config": {}}).encode(), makepath=True)
        zk.create(f"/brokers/topics/{topic}", json.dumps({"version": 1, "partitions": assignment}).encode())
        _wait(lambda: json.loads(zk.get(f"/brokers/topics/{topic}")[0]).get("topic_id"), 20, "no topic ID minted")
        first_id = json.loads(zk.get(f"/brokers/topics/{topic}")[0])["topic_id"]
        _wait(
            lambda: all(
                partition_topic_ids(state).get((b, topic, p)) == first_id
                for p, rs in assignment.items()
                for b in rs
                for p in [int(p)]
            ),
            20,
            "replicas did not write partition.metadata",
        )
        steps.append(
            Step(
                "1 old client creates the topic; the controller mints its topic ID",
                True,
                {"topic_id": first_id, "assignment": assignment},
            )
        )
        steps.append(Step("2-3 produce and consume work (the lab writes no records while running)", True))
        # 4. the old client adds partitions: topic_id dropped from the znode
        inj = old_client_add_partitions(state, topic, 6)
        znode = json.loads(zk.get(f"/brokers/topics/{topic}")[0])
        steps.append(
            Step("4 old client adds partitions 3-5; the znode loses topic_id", "topic_id" not in znode, inj.details)
        )
        _wait(
            lambda: all(
                (b, topic, p) in partition_topic_ids(state)
                for p, rs in znode["partitions"].items()
                for b in rs
                for p in [int(p)]
            ),
            20,
            "new partitions were not created",
        )
        ids_now = partition_topic_ids(state)
        new_without_id = all(
            ids_now[(b, topic, int(p))] is None for p, rs in znode["partitions"].items() if int(p) >= 3 for b in rs
        )
        steps.append(Step("5 new partitions serve; their replicas have no partition.metadata yet", new_without_id))
        # 6. controller failover: a new random topic ID
        fo = controller_failover(state)
        second_id = json.loads(zk.get(f"/brokers/topics/{topic}")[0])["topic_id"]
        _wait(
            lambda: all(
                partition_topic_ids(state).get((b, topic, int(p))) == second_id
                for p, rs in znode["partitions"].items()
                if int(p) >= 3
                for b in rs
            ),
            20,
            "new partitions did not get the new topic ID",
        )
        ids_now = partition_topic_ids(state)
        old_keep = all(
            ids_now[(b, topic, int(p))] == first_id for p, rs in znode["partitions"].items() if int(p) < 3 for b in rs
        )
        steps.append(
            Step(
                "6 controller failover mints a new topic ID; new partitions take it, old keep the old one",
                second_id != first_id and old_keep,
                {**fo.details, "old_topic_id": first_id, "new_topic_id": second_id},
            )
        )
        all_in_isr = all(set(rs) <= set(_isr(zk, topic, int(p))) for p, rs in znode["partitions"].items())
        steps.append(Step("7 running brokers stay in ISR", all_in_isr))
        # 8. restart one broker
        victim = state.broker(broker if broker is not None else ids[0])
        for cmd in ("stop", "start"):
            r = run_service(victim, cmd)
            if r.returncode != 0:
                raise LabError(f"{cmd} of broker {victim.id} failed: {r.stdout}{r.stderr}")
        hosted = sorted(int(p) for p, rs in znode["partitions"].items() if victim.id in rs)
        expect_out = [p for p in hosted if p < 3]
        expect_in = [p for p in hosted if p >= 3]

        def settled() -> bool:
            return all(victim.id not in _isr(zk, topic, p) for p in expect_out) and all(
                victim.id in _isr(zk, topic, p) for p in expect_in
            )

        ok = True
        try:
            _wait(settled, 20, "ISR did not settle")
        except LabError:
            ok = False
        out_of_isr = [p for p in hosted if victim.id not in _isr(zk, topic, p)]
        log_lines = [
            ln
            for ln in (Path(victim.run_dir) / "server.log").read_text().splitlines()
            if "does not match the topic Id" in ln and topic in ln
        ]
        steps.append(
            Step(
                f"8 broker {victim.id} restarted: out of ISR for the partitions whose partition.metadata "
                "holds the old topic ID",
                ok and out_of_isr == expect_out and bool(log_lines),
                {
                    "broker_id": victim.id,
                    "out_of_isr": out_of_isr,
                    "expected_out_of_isr": expect_out,
                    "kafka_error": log_lines[-1] if log_lines else None,
                },
            )
        )
    finally:
        zk.stop()
        zk.close()
    return steps


def scenario_seed_000(state: LabState, broker: int | None = None) -> list[Step]:
    """seed-000: a 0.8 broker killed with kill -9 while it loads its logs after a clean stop keeps the
    clean-shutdown marker (0.8.2-2.7 delete it only after every log loaded) and the active segments'
    indexes it had already preallocated; at the next start recovery is skipped, the sanity check reads
    the 10 MiB zero tail as entries and the broker refuses to start: "Corrupt index found ... last offset
    is B and the base offset is B" (reference §1.4, §2.2)."""
    if state.features.index_sanity_at_load != "fatal":
        raise LabError(
            f"seed-000 needs a lab at Kafka 0.8.x (this one runs {state.kafka_version}): "
            "fleet-lab up --kafka-version 0.8.2.2"
        )
    b = state.broker(broker if broker is not None else state.brokers[0].id)
    steps: list[Step] = []
    r = run_service(b, "stop")
    steps.append(
        Step(
            f"1 broker {b.id} stopped cleanly (indexes trimmed, .kafka_cleanshutdown written)",
            r.returncode == 0 and all((Path(d) / CLEAN_SHUTDOWN_FILE).exists() for d in b.log_dirs),
        )
    )
    cfg = b.config()
    slow = BrokerConfig(**{**cfg.__dict__, "log_load_delay_ms": 300})
    slow.save(b.config_path)
    log = Path(b.run_dir) / "server.log"
    mark = log.stat().st_size if log.exists() else 0
    starter = subprocess.Popen(
        [str(b.service_script), "start"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:

        def loaded() -> list[str]:
            with open(log, encoding="utf-8", errors="replace") as f:
                f.seek(mark)
                return [ln for ln in f if "Completed load of log" in ln]

        # kill it once a couple of logs have loaded: their active indexes are preallocated, the marker is kept
        _wait(lambda: len(loaded()) >= 2, 60, "the broker did not load its logs")
        killed = run_service(b, "kill")
    finally:
        starter.communicate(timeout=60)
        cfg.save(b.config_path)
    loaded_logs = [ln.split("Completed load of log ")[1].split(" with")[0] for ln in loaded()]
    untrimmed = []
    for d in map(Path, b.log_dirs):
        for name in loaded_logs:
            pdir = d / name
            if pdir.is_dir():
                bases = segment_bases(pdir)
                idx = pdir / segment_file_name(bases[-1], "index")
                if idx.exists() and idx.stat().st_size >= cfg.segment_index_bytes - 8:
                    untrimmed.append(str(idx))
    markers = all((Path(d) / CLEAN_SHUTDOWN_FILE).exists() for d in b.log_dirs)
    steps.append(
        Step(
            f"2 kill -9 of broker {b.id} while it loads its logs: marker kept, preallocated indexes left",
            killed.returncode == 0 and markers and bool(untrimmed),
            {"loaded_before_kill": loaded_logs, "untrimmed_indexes": untrimmed, "clean_shutdown_marker_kept": markers},
        )
    )
    r = run_service(b, "start")
    fatal = [ln for ln in log.read_text().splitlines() if "Corrupt index found" in ln]
    steps.append(
        Step(
            f"3 broker {b.id} refuses to start: Corrupt index found",
            r.returncode != 0 and bool(fatal) and running_pid(b.config()) is None,
            {"exit_status": r.returncode, "kafka_error": fatal[-1] if fatal else None},
        )
    )
    return steps


SCENARIOS: dict[str, tuple[str, Callable[..., list[Step]]]] = {
    "seed-000": ("0.8.2.2", scenario_seed_000),
    "seed-004": ("2.8.2", scenario_seed_004),
}


def run_scenario(state: LabState, name: str, broker: int | None = None) -> list[Step]:
    if name not in SCENARIOS:
        raise LabError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    wait_healthy(state, timeout=30)
    return SCENARIOS[name][1](state, broker=broker)
