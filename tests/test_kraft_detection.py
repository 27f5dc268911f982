"""KRaft detection on the real KRaft samples and on copies of them mutated here (issue 18).

Each run stages the log dirs exactly as ``fleet-doctor scan`` does (``stage_probe``), decodes their
``__cluster_metadata-0`` as scan does (``metadata_dirs`` + ``decode_kraft``: the cluster facts from the node whose
log goes furthest, every node's header and problems as the controllers input), and runs the detection rules
in-process on the shared Spark session.

- **the samples**: every finding must be one MANIFEST.md explains, computed here from the sample's files, MANIFEST.md
  (Appendix A: omitted dirs, absent files) and the decoded metadata (tests/test_cluster_metadata.py checks the decoder
  against MANIFEST.md); greenlemon's divergent quorum-state is info (kafka2 missed the election of epoch 190).
- **the whole greenlemon sample**: its ``kafka/`` dir is another deployment with the same cluster.id and node.id 1,
  so its replicas hold other topic IDs: the genuine topic-id-mismatch / stray-replica case.
- **mutated copies** of nurlan: a torn metadata log tail, a flipped byte, quorum-state files naming two leaders for
  one epoch or rolled back, a log that starts after offset 0 with no snapshot, records the decoder does not know, and
  stray replica dirs of every kind: each new rule fires exactly where the mutation is, with its severity.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor.cli.scan import KraftMetadata, ScanError, decode_kraft, metadata_dirs, scan, stage_probe
from fleet_doctor.detect import LIVENESS_RULES, detect, load_frames
from fleet_doctor.rules import RULES, Needs
from harness import kraft_encode as enc
from harness.corpus import copy_writable
from harness.corpus_manifest import SampleAppendix, appendix

REPO = Path(__file__).resolve().parents[1]
NURLAN = "kraft-3.2-3broker-replicated-nurlan"
GREENLEMON = "kraft-3.5-3broker-greenlemon"
KSCAN = "kraft-4.0-multiseg-kscan"
LDIPOC = "kraft-3.7-ldipoc"
# the runs over the samples: (sample, its log dirs, the Kafka version MANIFEST.md gives)
SAMPLES = {
    "nurlan": (NURLAN, ("kafka1", "kafka2", "kafka3"), "3.2.0"),
    "greenlemon": (GREENLEMON, ("kafka1", "kafka2", "kafka3"), "3.5.1"),
    "greenlemon-kafka": (GREENLEMON, ("kafka",), "3.5.1"),
    "kscan": (KSCAN, ("kafka-1",), "4.0.0"),
    "ldipoc": (LDIPOC, ("kraft-combined-logs",), "3.7.0"),
}
KRAFT_RULES = {r.id for r in RULES if r.needs is Needs.METADATA_LOG}
METADATA_LOG = "__cluster_metadata-0/00000000000000000000.log"
CHECKPOINTS = (
    "recovery-point-offset-checkpoint",
    "replication-offset-checkpoint",
    "log-start-offset-checkpoint",
    "cleaner-offset-checkpoint",
)


# ------------------------------------------------------------------------------------------- runs
@dataclass
class Run:
    root: Path  # the sample (or the mutated copy) the log dirs are in
    dirs: list[Path]
    rows: list[dict[str, Any]]
    skipped: dict[str, str]
    kraft: KraftMetadata
    nodes: dict[Path, int] = field(default_factory=dict)  # log dir -> node id

    def rel(self, path: str | None) -> str | None:
        if path and path.startswith(str(self.root) + "/"):
            return path[len(str(self.root)) + 1 :]
        return path

    def key(self, r: dict[str, Any]) -> tuple:
        return (r["rule"], r["broker_id"], r["topic"], r["partition"], self.rel(r["path"]))

    def keys(self, rule: str | None = None) -> set[tuple]:
        return {self.key(r) for r in self.rows if rule is None or r["rule"] == rule}

    def of(self, rule: str) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["rule"] == rule]

    def facts(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.kraft.cluster or [] if r["kind"] == kind]


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def kraft_run(
    spark,
    work: Path,
    root: Path,
    dirs: list[Path],
    version: str | dict[int, str],
    *,
    deep: bool = False,
    audit: bool = False,
) -> Run:
    """Stage, decode and detect as ``fleet-doctor scan`` does, in-process (``version``: every broker's, or each
    one's by id; ``deep``: the probe's --deep --verify-crc; ``audit``: the controllers' records as the audit reads
    them from the running controllers, each with its ``controller_id``)."""
    work.mkdir(parents=True, exist_ok=True)
    paths = [str(d) for d in dirs]
    brokers = stage_probe(paths, work, deep=deep, verify_crc=deep, broker_id=None)
    kraft = decode_kraft(metadata_dirs(paths, None))
    versions = version if isinstance(version, dict) else dict.fromkeys(brokers, version)
    facts = [{"broker_id": b, "kafka_version": versions[b], "running": False} for b in sorted(brokers)]
    controllers = kraft.controllers
    if audit:
        controllers = [{**r, "controller_id": r["node_id"]} for r in controllers]
    frames = load_frames(
        spark,
        str(work / "probe"),
        _jsonl(work / "brokers.jsonl", facts),
        _jsonl(work / "zk.jsonl", kraft.cluster or []),
        _jsonl(work / "controllers.jsonl", controllers),
        metadata_mode="kraft",
    )
    df, skipped = detect(frames)
    nodes = {Path(p): b for b, ps in brokers.items() for p in ps}
    return Run(root, list(dirs), [r.asDict() for r in df.collect()], skipped, kraft, nodes)


@pytest.fixture(scope="module")
def manifest(corpus) -> dict[str, SampleAppendix]:
    return appendix(corpus)


@pytest.fixture(scope="module")
def sample_runs(spark, corpus, tmp_path_factory) -> dict[str, Run]:
    out = {}
    for name, (sample, dirs, version) in SAMPLES.items():
        root = corpus / sample
        out[name] = kraft_run(spark, tmp_path_factory.mktemp(name), root, [root / d for d in dirs], version)
    return out


# ------------------------------------------------------------------------------------------- what MANIFEST explains
def _checkpoint_entries(path: Path) -> list[tuple[str, int]]:
    lines = path.read_text().splitlines() if path.is_file() else []
    return [(ln.split()[0], int(ln.split()[1])) for ln in lines[2:] if ln.strip()]


def _leader_epochs(path: Path) -> list[tuple[int, int]]:
    lines = path.read_text().splitlines() if path.is_file() else []
    return [(int(a), int(b)) for a, b in (ln.split() for ln in lines[2:] if ln.strip())]


def _genuinely_missing(sample: str, logdir: Path, pdir: str, manifest: dict[str, SampleAppendix]) -> bool:
    """MANIFEST.md: a dir omitted from the corpus (Appendix A), or ldipoc's __consumer_offsets-14, listed by its
    checkpoints but never committed."""
    if f"{logdir.name}/{pdir}" in manifest[sample].omitted:
        return True
    return sample == LDIPOC and pdir == "__consumer_offsets-14"


def explained(name: str, run: Run, manifest: dict[str, SampleAppendix]) -> set[tuple]:
    """Every finding a sample's run must show, each a fact MANIFEST.md explains, computed from the files and the
    decoded metadata, never from detection's output."""
    sample = SAMPLES[name][0]
    out: set[tuple] = set()
    topics = {t["topic"]: t for t in run.facts("topic")}
    states = {(s["topic"], s["partition"]): s for s in run.facts("partition_state")}
    by_node: dict[int, set[str]] = {}
    for d in run.dirs:
        node = run.nodes[d]
        dirs = {p.name for p in d.iterdir() if p.is_dir()}
        by_node.setdefault(node, set()).update(dirs)
        # Appendix A: omitted dirs stay in the checkpoints (ldipoc: __consumer_offsets-14, never committed)
        for cp in CHECKPOINTS:
            for topic, part in _checkpoint_entries(d / cp):
                if f"{topic}-{part}" not in dirs:
                    assert _genuinely_missing(sample, d, f"{topic}-{part}", manifest), (d, cp, topic, part)
                    out.add(("checkpoint-dangling", node, topic, part, f"{d.name}/{cp}"))
        # MANIFEST: kscan was not cleanly shut down; ldipoc's log dir holds no .kafka_cleanshutdown as committed
        if not (d / ".kafka_cleanshutdown").exists():
            assert sample in (KSCAN, LDIPOC), d
            out.add(("unclean-shutdown", node, None, None, d.name))
        for pdir in sorted(dirs):
            topic, _, part = pdir.rpartition("-")
            files = set(os.listdir(d / pdir))
            bases = {f[:20] for f in files if f[:20].isdigit() and f[20:] in (".log", ".index", ".timeindex")}
            for base in sorted(bases):
                rel = f"{d.name}/{pdir}"
                # Appendix A: the active segment's preallocated indexes are absent (>= 4 MiB)
                if f"{base}.log" in files and f"{base}.index" not in files:
                    assert rel in manifest[sample].absent_index_dirs, rel
                    out.add(("index-missing", node, topic, int(part), f"{rel}/{base}.log"))
                # MANIFEST: kscan's __cluster_metadata .log segments are ABSENT, their trimmed indexes present
                if f"{base}.log" not in files:
                    assert f"{rel}/{base}.log" in manifest[sample].absent_files, rel
                    leaf = f"{base}.index" if f"{base}.index" in files else f"{base}.timeindex"
                    out.add(("index-orphan", node, topic, int(part), f"{rel}/{leaf}"))
            # MANIFEST: kscan's metadata log is ABSENT, so the image is its newest snapshot's: the replicas' leader
            # epochs moved on after it
            epochs = _leader_epochs(d / pdir / "leader-epoch-checkpoint")
            state = states.get((topic, int(part))) if part.isdigit() else None
            if epochs and state and epochs[-1][0] > state["leader_epoch"]:
                assert sample == KSCAN and run.kraft.cluster[0]["log_segments"] == 0, (d, pdir)
                out.add(("leader-epoch-ahead", node, topic, int(part), f"{d.name}/{pdir}/leader-epoch-checkpoint"))
    for topic, t in topics.items():
        # the replicas the metadata places on a node with no dir there: Appendix A's omitted ones
        for part, replicas in t["partitions"].items():
            for node in replicas:
                if node in by_node and f"{topic}-{part}" not in by_node[node]:
                    d = next(d for d in run.dirs if run.nodes[d] == node)
                    assert _genuinely_missing(sample, d, f"{topic}-{part}", manifest), (topic, part, node)
                    out.add(("replica-dir-missing", node, topic, int(part), f"{topic}-{part}"))
        # the metadata's replication factor 1 (single-broker samples, and nurlan's __consumer_offsets)
        rf, min_isr = t["replication_factor"], t["min_insync_replicas"]
        if rf is not None and (rf <= 1 or (min_isr is not None and min_isr >= rf)):
            out.add(("unsafe-replication", None, topic, None, f"kraft:/topics/{topic}"))
    # MANIFEST: greenlemon's quorum-state diverges: kafka2 says leader 3 epoch 189, kafka1/kafka3 leader 1 epoch 190;
    # kafka2's log holds no batch of epoch 190 (its leader-epoch-checkpoint ends at 189): it missed that election
    quorum = {d: json.loads((d / "__cluster_metadata-0" / "quorum-state").read_text()) for d in run.dirs}
    top = max(q["leaderEpoch"] for q in quorum.values())
    for d, q in quorum.items():
        log_epochs = [e for e, _ in _leader_epochs(d / "__cluster_metadata-0" / "leader-epoch-checkpoint")]
        if q["leaderEpoch"] < top and max(log_epochs, default=-1) < top:
            assert name == "greenlemon" and d.name == "kafka2", d
            out.add(
                (
                    "quorum-state-divergent",
                    run.nodes[d],
                    "__cluster_metadata",
                    0,
                    f"{d.name}/__cluster_metadata-0/quorum-state",
                )
            )
    return out


def test_every_kraft_sample_was_decoded_from_its_own_metadata(sample_runs):
    for name, run in sample_runs.items():
        assert run.kraft.cluster is not None, name
        head = run.kraft.cluster[0]
        assert head["kind"] == "cluster_metadata" and head["error"] is None, (name, head)
        assert [r["kind"] for r in run.kraft.controllers].count("cluster_metadata") == len(run.dirs)
    # greenlemon: the facts come from the node whose log goes furthest (kafka1: epoch 190, offset 30638)
    assert sample_runs["greenlemon"].kraft.source["dir"].endswith("kafka1/__cluster_metadata-0")
    assert sample_runs["greenlemon"].kraft.source["quorum_leader_epoch"] == 190
    # the cluster's controller is the quorum's (two of three quorum-states name 1 at 190), as the audit names it
    green = sample_runs["greenlemon"].kraft
    assert (green.source["active_controller"], green.source["active_controller_epoch"]) == (1, 190)
    assert [(r["controller_id"], r["controller_epoch"]) for r in green.cluster if r["kind"] == "cluster"] == [(1, 190)]


@pytest.mark.parametrize("name", list(SAMPLES))
def test_a_kraft_sample_shows_nothing_beyond_what_manifest_explains(sample_runs, manifest, name):
    run = sample_runs[name]
    assert run.keys() == explained(name, run, manifest)


@pytest.mark.parametrize("name", list(SAMPLES))
def test_liveness_is_not_judged_on_a_stopped_cluster(sample_runs, name):
    """A cleanly stopped KRaft cluster's image has every broker fenced and every partition leaderless (its ISR the
    last replica to stop): under-replicated and offline-partition are skipped with why, not 54 false alarms. kscan
    was killed (its broker still unfenced, leaders in place): they run."""
    run = sample_runs[name]
    brokers = run.facts("broker")
    if all(b["fenced"] for b in brokers):
        assert set(run.skipped) == LIVENESS_RULES
        assert "every broker fenced" in run.skipped["offline-partition"]
    else:
        assert name == "kscan" and run.skipped == {}


def test_greenlemons_divergent_quorum_state_is_info(sample_runs):
    (hit,) = sample_runs["greenlemon"].of("quorum-state-divergent")
    assert hit["severity"] == "info" and hit["broker_id"] == 2
    for text in ("epoch 189 (leader 3)", "controller(s) 1, 3 are at epoch 190 (leader 1)", "no batch of epoch 190"):
        assert text in hit["message"], hit["message"]


def test_kraft_wording_and_paths(sample_runs):
    """Cross-source findings on KRaft name the metadata log, never ZooKeeper; cluster-level paths are kraft:/."""
    for run in sample_runs.values():
        for r in run.rows:
            assert "ZooKeeper" not in r["message"] and not (r["path"] or "").startswith("zk:"), r
    (hit,) = [r for r in sample_runs["kscan"].of("leader-epoch-ahead") if r["topic"] == "scan-topic"]
    assert "the leader epoch in the metadata log of controller 1" in hit["message"]


# ------------------------------------------------------------------------------------------- whole greenlemon
@pytest.fixture(scope="module")
def greenlemon_whole(spark, corpus, tmp_path_factory) -> Run:
    root = corpus / GREENLEMON
    dirs = [root / d for d in ("kafka", "kafka1", "kafka2", "kafka3")]
    return kraft_run(spark, tmp_path_factory.mktemp("greenlemon-whole"), root, dirs, "3.5.1")


def _topic_id(pdir: Path) -> str | None:
    pm = pdir / "partition.metadata"
    if not pm.is_file():
        return None
    return dict(ln.split(": ", 1) for ln in pm.read_text().splitlines() if ": " in ln).get("topic_id")


def test_greenlemons_other_deployment_is_stray_and_mismatched(greenlemon_whole):
    """MANIFEST: kafka/ is an earlier single-node deployment with node.id 1 and the same cluster.id, so its topic IDs
    differ from kafka1..3's (e.g. __consumer_offsets 8kxbPVz3SZmX1PRku-RYPQ vs crCKTd0wTl6bQClKBtax4Q). Scanned with
    them, each of its replicas of such a topic holds an ID the metadata (from kafka1, epoch 190) does not know: a
    topic-id-mismatch and, on Kafka 3.5, a stray replica deleted at the next start."""
    run = greenlemon_whole
    ids = {t["topic"]: t["topic_id"] for t in run.facts("topic")}
    kafka = run.root / "kafka"
    differing = {
        (1, p.name.rpartition("-")[0], int(p.name.rpartition("-")[2]), f"kafka/{p.name}")
        for p in kafka.iterdir()
        if p.is_dir()
        and p.name != "__cluster_metadata-0"
        and _topic_id(p) not in (None, ids.get(p.name.rpartition("-")[0]))
    }
    assert {t for _, t, _, _ in differing} == {
        "__consumer_offsets",
        "delivery-create-request",
        "payment-create-request",
    }
    assert {k[1:] for k in run.keys("stray-replica")} == differing
    assert {(b, t, p, f"{rel}/partition.metadata") for b, t, p, rel in differing} == {
        k[1:] for k in run.keys("topic-id-mismatch")
    }
    for r in run.of("stray-replica"):
        assert r["severity"] == "critical" and "Kafka deletes it at the next start" in r["message"], r
        assert "which the metadata log of controller 1 does not know" in r["message"], r
    for r in run.of("topic-id-mismatch"):
        assert "TopicRecord" in r["message"] and "stray" in r["message"], r
    # kafka/'s own quorum-state (leader 1, epoch 4) is far behind epoch 190: a node of another deployment, info
    quorum = {(r["broker_id"], run.rel(r["log_dir"])): r["severity"] for r in run.of("quorum-state-divergent")}
    assert quorum == {(1, "kafka"): "info", (2, "kafka2"): "info"}


# ------------------------------------------------------------------------------------------- mutated copies
def _batches(path: Path) -> list[tuple[int, int, int]]:
    """(base offset, position, size) of each batch of a log file (kraft-ref §2: size = 12 + length)."""
    data, out, pos = path.read_bytes(), [], 0
    while pos + 12 <= len(data):
        base, length = int.from_bytes(data[pos : pos + 8], "big"), int.from_bytes(data[pos + 8 : pos + 12], "big")
        out.append((base, pos, 12 + length))
        pos += 12 + length
    return out


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _set_quorum(logdir: Path, **changes: int) -> None:
    qs = logdir / "__cluster_metadata-0" / "quorum-state"
    state = json.loads(qs.read_text())
    state.update(changes)
    qs.write_text(json.dumps(state, separators=(",", ":")))


def _set_topic_id(pdir: Path, topic_id: str) -> None:
    (pdir / "partition.metadata").write_text(f"version: 0\ntopic_id: {topic_id}\n")


FOREIGN_ID = base64.urlsafe_b64encode(bytes(range(7, 23))).decode().rstrip("=")
STRAY_UID = "5b3f6c2a9d8e4f10a1b2c3d4e5f60718"


def _nurlan_copy(corpus: Path, tmp_path_factory: pytest.TempPathFactory, name: str) -> tuple[Path, list[Path]]:
    """A writable copy of nurlan's three nodes: (its root, the log dirs kafka1..kafka3)."""
    root = tmp_path_factory.mktemp(name) / NURLAN
    return root, [copy_writable(corpus / NURLAN / d, root / d) for d in ("kafka1", "kafka2", "kafka3")]


def _tear_last_batch(log: Path) -> None:
    """Half the log's last batch appended again: a torn tail."""
    _, pos, size = _batches(log)[-1]
    _write(log, log.read_bytes() + log.read_bytes()[pos : pos + size // 2])


@pytest.fixture(scope="module")
def mutated(spark, corpus, tmp_path_factory) -> Run:
    """A copy of nurlan (3.2.0): kafka1's metadata log torn (half its last batch appended again), kafka2's with a
    flipped byte in a middle batch, kafka3's quorum-state naming leader 2 for epoch 3 (kafka1/kafka2: leader 1); and
    stray replica dirs of every kind, a topic ID rewritten, a -stray dir."""
    root, dirs = _nurlan_copy(corpus, tmp_path_factory, "mutated")
    k1, k2, k3 = dirs
    _tear_last_batch(k1 / METADATA_LOG)
    log2 = k2 / METADATA_LOG
    batches = _batches(log2)
    _, pos, size = batches[len(batches) // 2]
    data = bytearray(log2.read_bytes())
    data[pos + size - 3] ^= 0xFF  # inside the batch's records: its CRC-32C no longer matches
    _write(log2, bytes(data))
    _set_quorum(k3, leaderId=2)
    # stray replicas: a partition the image does not have, a topic ID it does not know, a replica it places
    # elsewhere, a log without a topic ID, and a topic ID rewritten
    shutil.copytree(k1 / "iot-sensors-0", k1 / "iot-sensors-7")
    shutil.copytree(k2 / "_schemas-0", k2 / "ghost-0")
    _set_topic_id(k2 / "ghost-0", FOREIGN_ID)
    shutil.copytree(k1 / "__consumer_offsets-29", k3 / "__consumer_offsets-29")
    (k2 / "iot-sensors-1" / "partition.metadata").unlink()
    _set_topic_id(k1 / "_schemas-0", FOREIGN_ID)
    shutil.copytree(k3 / "iot-sensors-2", k3 / f"iot-sensors-2.{STRAY_UID}-stray")
    return kraft_run(spark, tmp_path_factory.mktemp("mutated-work"), root, dirs, "3.2.0")


def test_stray_replicas_by_kafka_version(spark, mutated, tmp_path):
    """The same stray dirs on brokers of other versions: 3.7.1+ renames every stray log -stray (warning); 3.7.0
    renames, but a log without a topic ID still fails its start (critical); 3.6 deletes (critical)."""
    versions = {1: "3.7.1", 2: "3.7.0", 3: "3.6.2"}
    run = kraft_run(spark, tmp_path, mutated.root, mutated.dirs, versions)
    got = {(r["broker_id"], r["topic"], r["partition"]): r for r in run.of("stray-replica")}
    renamed, deleted = "renames it <topic>-<p>.<uuid>-stray at the next start", "Kafka deletes it at the next start"
    expected = {
        (1, "iot-sensors", 7): ("warning", renamed),
        (1, "_schemas", 0): ("warning", renamed),
        (2, "ghost", 0): ("warning", renamed),
        (2, "iot-sensors", 1): ("critical", "the broker's start fails"),
        (3, "__consumer_offsets", 29): ("critical", deleted),
    }
    assert set(got) == set(expected)
    for k, (severity, text) in expected.items():
        assert got[k]["severity"] == severity and text in got[k]["message"], got[k]
        assert got[k]["kafka_version"] == versions[k[0]]


@pytest.fixture(scope="module")
def mutated_nurlan_pristine(sample_runs) -> Run:
    return sample_runs["nurlan"]


def test_the_cluster_facts_of_the_mutated_copy(mutated):
    # every log at epoch 3, offset 188; kafka2's fails a CRC (its image misses records): the first whole one
    assert mutated.kraft.source["dir"] == str(mutated.root / "kafka1" / "__cluster_metadata-0")
    ids = {t["topic"]: t["topic_id"] for t in mutated.facts("topic")}
    assert ids == {
        "__consumer_offsets": "GvlhOvYeRNGJQgNm7jrSTQ",
        "_schemas": "63PU6i9-Tb6YLAtiOJydAQ",
        "iot-sensors": "6-tydMKdQbO5RazHt_Y8-Q",
    }
    assert mutated.facts("topic")[0]["partitions"]["29"] == [1]  # __consumer_offsets-29 lives on kafka1 only


def test_a_torn_tail_and_a_crc_failure_of_the_metadata_log(mutated):
    got = {(r["broker_id"], mutated.rel(r["path"])): r for r in mutated.of("metadata-log-torn")}
    assert set(got) == {(1, f"kafka1/{METADATA_LOG}"), (2, f"kafka2/{METADATA_LOG}")}
    torn, crc = got[(1, f"kafka1/{METADATA_LOG}")], got[(2, f"kafka2/{METADATA_LOG}")]
    assert torn["severity"] == "warning" and "offset 188" in torn["message"], torn
    assert crc["severity"] == "critical" and "crc" in crc["message"].lower(), crc
    for r in (torn, crc):
        assert r["topic"] == "__cluster_metadata" and r["partition"] == 0
        assert mutated.rel(r["log_dir"]) in ("kafka1", "kafka2") and r["kafka_version"] == "3.2.0"


def test_two_leaders_for_one_epoch_is_critical(mutated):
    got = {(r["broker_id"], r["severity"]) for r in mutated.of("quorum-state-divergent")}
    assert got == {(1, "critical"), (2, "critical"), (3, "critical")}
    (k3,) = [r for r in mutated.of("quorum-state-divergent") if r["broker_id"] == 3]
    assert "names leader 2 for epoch 3" in k3["message"]
    assert "controller 1: leader 1, controller 2: leader 1, controller 3: leader 2" in k3["message"]
    assert mutated.rel(k3["path"]) == "kafka3/__cluster_metadata-0/quorum-state"


def test_stray_replicas_of_every_kind(mutated):
    got = {k[1:]: r for r in mutated.of("stray-replica") for k in [mutated.key(r)]}
    assert set(got) == {
        (1, "iot-sensors", 7, "kafka1/iot-sensors-7"),
        (2, "ghost", 0, "kafka2/ghost-0"),
        (3, "__consumer_offsets", 29, "kafka3/__consumer_offsets-29"),
        (2, "iot-sensors", 1, "kafka2/iot-sensors-1"),
        (1, "_schemas", 0, "kafka1/_schemas-0"),
    }
    why = {
        (1, "iot-sensors", 7, "kafka1/iot-sensors-7"): "has no partition 7 in the metadata log",
        (2, "ghost", 0, "kafka2/ghost-0"): "does not know (it has no topic ghost)",
        (3, "__consumer_offsets", 29, "kafka3/__consumer_offsets-29"): "places __consumer_offsets-29 on brokers [1]",
        (2, "iot-sensors", 1, "kafka2/iot-sensors-1"): "has no topic ID",
        (1, "_schemas", 0, "kafka1/_schemas-0"): "its TopicRecord _schemas has ID 63PU6i9-Tb6YLAtiOJydAQ",
    }
    for k, r in got.items():
        assert why[k] in r["message"], r["message"]
        assert r["severity"] == "critical", r
        if k[1:3] == ("iot-sensors", 1):
            # before 3.7.1 a log without a topic ID fails the broker's start (findStrayPartitions throws)
            assert "the broker's start fails" in r["message"], r["message"]
        else:
            # Kafka 3.2 deletes a stray log at startup (3.7+ would rename it -stray)
            assert "Kafka deletes it at the next start" in r["message"], r["message"]


def test_the_existing_rules_on_the_mutated_kraft_copy(mutated):
    """topic-id-mismatch, replica-not-assigned, topic-id-split and stray-dir run unchanged on the KRaft facts,
    worded for the metadata log."""
    (mm,) = mutated.of("topic-id-mismatch")
    assert mutated.key(mm)[1:] == (1, "_schemas", 0, "kafka1/_schemas-0/partition.metadata")
    assert "TopicRecord _schemas with ID 63PU6i9-Tb6YLAtiOJydAQ" in mm["message"]
    assert {k[1:] for k in mutated.keys("replica-not-assigned")} == {
        (1, "iot-sensors", 7, "kafka1/iot-sensors-7"),
        (2, "ghost", 0, "kafka2/ghost-0"),
        (3, "__consumer_offsets", 29, "kafka3/__consumer_offsets-29"),
    }
    (ghost,) = [r for r in mutated.of("replica-not-assigned") if r["topic"] == "ghost"]
    assert "topic ghost is not in the metadata log of controller 1" in ghost["message"]
    # one finding for the topic, not one per replica: the metadata log has an ID, so the split is info (the odd
    # replica is the mismatch above) and the replicas holding the TopicRecord's ID are named, never flagged
    (split,) = mutated.of("topic-id-split")
    assert mutated.key(split)[1:] == (None, "_schemas", None, "kraft:/topics/_schemas")
    assert split["severity"] == "info" and split["log_dir"] is None, split
    ids = {_topic_id(d / "_schemas-0"): d for d in mutated.dirs if (d / "_schemas-0").is_dir()}
    assert set(ids) == {FOREIGN_ID, "63PU6i9-Tb6YLAtiOJydAQ"}
    holders = sorted(mutated.nodes[d] for d in mutated.dirs if _topic_id(d / "_schemas-0") == "63PU6i9-Tb6YLAtiOJydAQ")
    assert holders == [2, 3], holders
    assert split["message"] == (
        "topic _schemas: its replicas hold 2 topic IDs: 63PU6i9-Tb6YLAtiOJydAQ (2 replicas, the metadata log's) on "
        f"broker 2 partition 0, broker 3 partition 0; {FOREIGN_ID} (1 replica) on broker 1 partition 0. "
        "The metadata log of controller 1 has TopicRecord _schemas with ID 63PU6i9-Tb6YLAtiOJydAQ: the replicas "
        "holding another ID are its topic-id-mismatch findings"
    ), split["message"]
    (stray,) = mutated.of("stray-dir")
    assert mutated.rel(stray["path"]) == f"kafka3/iot-sensors-2.{STRAY_UID}-stray"
    assert "KRaft (3.7+) found this replica stray" in stray["message"]


def test_a_split_the_metadata_log_has_no_id_for_is_critical(spark, corpus, tmp_path_factory):
    """Two replicas of a topic the metadata log does not have, each with its own topic ID: no side can be called right,
    so the split is the critical finding, naming both groups, worded for the metadata log."""
    root, (k1, k2, _) = _nurlan_copy(corpus, tmp_path_factory, "split-no-id")
    other = base64.urlsafe_b64encode(bytes(range(40, 56))).decode().rstrip("=")
    for d, topic_id in ((k1, FOREIGN_ID), (k2, other)):
        shutil.copytree(d / "_schemas-0", d / "ghost-0")
        _set_topic_id(d / "ghost-0", topic_id)
    run = kraft_run(
        spark,
        tmp_path_factory.mktemp("split-no-id-work"),
        root,
        [root / d for d in ("kafka1", "kafka2", "kafka3")],
        "3.2.0",
    )
    assert "ghost" not in {t["topic"] for t in run.facts("topic")}
    (hit,) = run.of("topic-id-split")
    assert run.key(hit)[1:] == (None, "ghost", None, "kraft:/topics/ghost")
    assert hit["severity"] == "critical", hit
    first, second = sorted([(FOREIGN_ID, run.nodes[k1]), (other, run.nodes[k2])])
    assert hit["message"] == (
        f"topic ghost: its replicas hold 2 topic IDs: {first[0]} (1 replica) on broker {first[1]} partition 0; "
        f"{second[0]} (1 replica) on broker {second[1]} partition 0. The metadata log of controller 1 has no topic "
        "ghost: no side can be called right, which ID to keep is a decision for a human"
    ), hit["message"]


def test_the_mutations_cause_nothing_else(mutated, mutated_nurlan_pristine):
    pristine = {(k[0], k[1], k[2], k[3], k[4]) for k in mutated_nurlan_pristine.keys()}
    new = mutated.keys() - pristine
    assert {k[0] for k in new} == {
        "metadata-log-torn",
        "quorum-state-divergent",
        "stray-replica",
        "topic-id-mismatch",
        "replica-not-assigned",
        "topic-id-split",
        "stray-dir",
    }
    assert mutated.skipped == mutated_nurlan_pristine.skipped


@pytest.fixture(scope="module")
def mutated2(spark, corpus, tmp_path_factory) -> Run:
    """Another copy of nurlan: kafka1's metadata log gets a batch of records the decoder does not know (an apiKey
    and a TopicRecord version), kafka2's quorum-state is rolled back to epoch 2 while its log holds epoch 3, and
    kafka3's metadata log loses its first 50 records (no snapshot covers them); and a fourth node, kafka4, whose
    __cluster_metadata-0 holds nothing to decode."""
    root, dirs = _nurlan_copy(corpus, tmp_path_factory, "mutated2")
    k1, k2, k3 = dirs
    log1 = k1 / METADATA_LOG
    extra = enc.data_batch(188, [enc.raw_metadata_value(99, 0), enc.raw_metadata_value(2, 9, b"\x00\x00")], epoch=3)
    _write(log1, log1.read_bytes() + extra)
    _set_quorum(k2, leaderEpoch=2)
    log3 = k3 / METADATA_LOG
    first = next((b, p) for b, p, _ in _batches(log3) if b >= 50)
    cut = log3.parent / f"{first[0]:020d}.log"
    _write(cut, log3.read_bytes()[first[1] :])
    for leaf in (".log", ".index", ".timeindex"):
        (log3.parent / f"{0:020d}{leaf}").unlink()
    k4 = root / "kafka4"
    (k4 / "__cluster_metadata-0").mkdir(parents=True)
    (k4 / "meta.properties").write_text((k1 / "meta.properties").read_text().replace("node.id=1", "node.id=4"))
    return kraft_run(spark, tmp_path_factory.mktemp("mutated2-work"), root, [*dirs, k4], "3.2.0")


def test_records_the_decoder_does_not_know(mutated2):
    assert mutated2.kraft.source["dir"] == str(mutated2.root / "kafka1" / "__cluster_metadata-0")
    hits = mutated2.of("metadata-record-unknown")
    got = sorted((r["broker_id"], r["severity"], mutated2.rel(r["path"])) for r in hits)
    assert got == [(1, "warning", f"kafka1/{METADATA_LOG}")] * 2 + [(4, "warning", "kafka4/__cluster_metadata-0")]
    messages = " ".join(r["message"] for r in hits if r["broker_id"] == 1)
    assert "offset 188" in messages and "unknown metadata record type (apiKey 99" in messages
    assert "offset 189" in messages and "TopicRecord version 9" in messages
    # kafka3's records after its gap that could not be applied are the gap's finding, not these
    (k4,) = [r for r in hits if r["broker_id"] == 4]
    assert "could not be decoded" in k4["message"] and "neither a metadata snapshot" in k4["message"]


def test_a_quorum_state_behind_its_own_log_is_a_warning(mutated2):
    (r,) = mutated2.of("quorum-state-divergent")
    assert (r["broker_id"], r["severity"]) == (2, "warning")
    assert "holds batches of epoch 3" in r["message"] and "is at epoch 2" in r["message"]


def test_a_log_that_starts_after_its_newest_snapshot(mutated2):
    (r,) = mutated2.of("metadata-snapshot-gap")
    assert (r["broker_id"], r["severity"], mutated2.rel(r["path"])) == (3, "critical", "kafka3/__cluster_metadata-0")
    (log,) = (mutated2.root / "kafka3" / "__cluster_metadata-0").glob("*.log")
    start = _batches(log)[0][0]
    assert start == int(log.name[:20]) > 0
    assert f"starts at offset {start}" in r["message"] and "no snapshot" in r["message"]


def test_kraft_rules_are_not_run_on_zookeeper_facts(spark, tmp_path, corpus):
    """A ZooKeeper cluster's facts: KRaft's own rules neither run nor show as skipped."""
    from fleet_doctor.zookeeper import snapshot as zk_snapshot

    sample = corpus / "zk-3.1-single-aryan"
    staged = stage_probe([str(sample / "kafka-logs")], tmp_path, deep=False, verify_crc=False, broker_id=None)
    facts = [{"broker_id": b, "kafka_version": "3.1.0", "running": False} for b in staged]
    records = zk_snapshot.read_snapshot_file(str(sample / "zookeeper" / "version-2" / "snapshot.32f"))
    frames = load_frames(
        spark,
        str(tmp_path / "probe"),
        _jsonl(tmp_path / "brokers.jsonl", facts),
        _jsonl(tmp_path / "zk.jsonl", records),
    )
    assert frames.metadata_source == "zookeeper" and not frames.kraft
    df, skipped = detect(frames)
    assert skipped == {}
    assert not {r.rule for r in df.select("rule").distinct().collect()} & KRAFT_RULES


# ------------------------------------------------------------------------------------------- the CLI
def test_fleet_doctor_scan_on_a_real_kraft_sample(corpus, sample_runs):
    """`bin/fleet-doctor scan` on nurlan's three log dirs decodes their metadata by itself and reports what the
    in-process run does (nothing beyond MANIFEST.md)."""
    dirs = [str(corpus / NURLAN / d) for d in ("kafka1", "kafka2", "kafka3")]
    proc = subprocess.run(
        [str(REPO / "bin" / "fleet-doctor"), "scan", *dirs, "--kafka-version", "3.2.0", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stderr  # replica-dir-missing (Appendix A's omitted dirs) are warnings
    report = json.loads(proc.stdout)
    run = sample_runs["nurlan"]
    assert {run.key(r) for r in report["findings"]} == run.keys()
    assert set(report["summary"]["rules_skipped"]) == LIVENESS_RULES


# ------------------------------------------------------------------------------------------- scan's decoding
def test_scan_decodes_each_kraft_log_dir_once(corpus):
    nurlan = corpus / NURLAN
    zk_dir = corpus / "zk-3.1-single-aryan" / "kafka-logs"
    explicit = [str(nurlan / "kafka3" / "__cluster_metadata-0")]
    dirs = metadata_dirs([str(zk_dir), str(nurlan / "kafka1"), str(nurlan / "kafka3")], explicit)
    # the ZooKeeper log dir has no metadata; kafka3 is the explicit dir already
    assert dirs == [explicit[0], str(nurlan / "kafka1")]


def test_an_unreadable_metadata_dir_of_a_scanned_log_dir_is_a_finding_not_an_exit(corpus, tmp_path):
    """A log dir's own __cluster_metadata-0 that cannot be decoded becomes a controller header with the error (the
    metadata-record-unknown finding names it); the cluster facts come from a node that could be read, or are absent
    when none could. A --cluster-metadata dir that cannot be read is a usage error naming it."""
    broken = copy_writable(corpus / NURLAN / "kafka2", tmp_path / "kafka2")
    for f in (broken / "__cluster_metadata-0").iterdir():
        if f.suffix in (".log", ".index", ".timeindex"):
            f.unlink()
    good = corpus / NURLAN / "kafka1"
    kraft = decode_kraft([str(broken), str(good)])
    assert kraft.cluster is not None and kraft.source["dir"] == str(good / "__cluster_metadata-0")
    bad = [r for r in kraft.controllers if r["kind"] == "cluster_metadata" and r["error"]]
    assert [(r["node_id"], r["dir"]) for r in bad] == [(2, str(broken / "__cluster_metadata-0"))]
    assert "neither a metadata snapshot" in bad[0]["error"]
    assert decode_kraft([str(broken)]).cluster is None
    with pytest.raises(ScanError, match=str(broken)):
        decode_kraft([str(broken)], [str(broken)])
    with pytest.raises(ScanError, match="not both"):
        scan([str(good)], zk_snapshot_file="x", cluster_metadata=[str(good)])


def test_scan_takes_its_cluster_facts_from_a_node_whose_image_is_whole(corpus, tmp_path):
    """All nurlan nodes are at epoch 3 with the same log: a node whose log lost its head (no snapshot covers it) or
    fails a CRC comes first but is passed over for the cluster facts; its header still goes to the controllers."""
    gapped = copy_writable(corpus / NURLAN / "kafka1", tmp_path / "kafka1")
    log = gapped / METADATA_LOG
    base, pos = next((b, p) for b, p, _ in _batches(log) if b >= 50)
    _write(log.parent / f"{base:020d}.log", log.read_bytes()[pos:])
    log.unlink()
    crc = copy_writable(corpus / NURLAN / "kafka2", tmp_path / "kafka2")
    log = crc / METADATA_LOG
    data = bytearray(log.read_bytes())
    data[len(data) // 2] ^= 0xFF
    _write(log, bytes(data))
    whole = corpus / NURLAN / "kafka3"
    kraft = decode_kraft([str(gapped), str(crc), str(whole)])
    assert kraft.source["dir"] == str(whole / "__cluster_metadata-0")
    heads = [r for r in kraft.controllers if r["kind"] == "cluster_metadata"]
    assert [(h["node_id"], h["snapshot_gap"], h["log_crc_errors"] > 0) for h in heads] == [
        (1, True, False),
        (2, False, True),
        (3, False, False),
    ]
    # none whole: the highest epoch, then the most records applied
    assert decode_kraft([str(gapped), str(crc)]).cluster is not None


def test_fleet_doctor_scan_with_cluster_metadata_of_other_nodes(corpus, sample_runs):
    """`scan kafka1 --cluster-metadata kafka2/__cluster_metadata-0`: the metadata of a node not scanned is decoded
    too (its header is a controller's); findings are those of the three-node run that belong to broker 1 or the
    cluster."""
    nurlan = corpus / NURLAN
    proc = subprocess.run(
        [
            str(REPO / "bin" / "fleet-doctor"),
            "scan",
            str(nurlan / "kafka1"),
            "--cluster-metadata",
            str(nurlan / "kafka2" / "__cluster_metadata-0"),
            "--kafka-version",
            "3.2.0",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    run = sample_runs["nurlan"]
    assert {run.key(r) for r in report["findings"]} == {k for k in run.keys() if k[1] in (1, None)}
    assert set(report["summary"]["rules_skipped"]) == LIVENESS_RULES


def test_fleet_doctor_scan_with_an_unreadable_cluster_metadata_dir(corpus, tmp_path):
    proc = subprocess.run(
        [
            str(REPO / "bin" / "fleet-doctor"),
            "scan",
            str(corpus / NURLAN / "kafka1"),
            "--cluster-metadata",
            str(tmp_path),
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert str(tmp_path) in proc.stderr and "fleet-doctor scan: error: cluster metadata:" in proc.stderr


# ------------------------------------------------------------------------------------------- review fixes
@pytest.fixture(scope="module")
def mutated3(spark, corpus, tmp_path_factory) -> Run:
    """A third copy of nurlan, probed in deep mode with CRCs: kafka1's metadata log torn (half its last batch
    appended again); kafka2's __cluster_metadata-0/leader-epoch-checkpoint names epoch 5 (as the probe would read
    it a moment after the decoder, the node having moved on): its quorum-state and log, as the decoder read them,
    agree at epoch 3; kafka3's quorum-state is a candidate looping in elections (leaderId -1, epoch 7, as a voter
    cut off from the quorum without pre-vote leaves it)."""
    root, dirs = _nurlan_copy(corpus, tmp_path_factory, "mutated3")
    k1, k2, k3 = dirs
    _tear_last_batch(k1 / METADATA_LOG)
    lec = k2 / "__cluster_metadata-0" / "leader-epoch-checkpoint"
    lines = lec.read_text().splitlines()
    entries = [ln for ln in lines[2:] if ln.strip()] + ["5 188"]
    lec.write_text("\n".join([lines[0], str(len(entries)), *entries]) + "\n")
    _set_quorum(k3, leaderId=-1, leaderEpoch=7, votedId=-1)
    return kraft_run(spark, tmp_path_factory.mktemp("mutated3-work"), root, dirs, "3.2.0", deep=True)


def test_the_log_epoch_is_the_decoders_own_read(mutated3):
    """A leader-epoch-checkpoint the probe read later than the decoder's read of the node is no rolled-back
    quorum-state: only the decoder's header of that node (log_max_epoch, snapshot_epoch) counts."""
    assert [r for r in mutated3.of("quorum-state-divergent") if r["broker_id"] == 2] == []


def test_a_voter_stuck_in_elections_is_its_own_warning(mutated3):
    """kafka3 at epoch 7 with no leader, above every log (epoch 3): kafka1 and kafka2 (leader 1, epoch 3) are not
    "behind" it; kafka3 is the finding, a warning."""
    got = [(r["broker_id"], r["severity"]) for r in mutated3.of("quorum-state-divergent")]
    assert got == [(3, "warning")]
    (r,) = mutated3.of("quorum-state-divergent")
    assert "epoch 7 with no leader" in r["message"] and "stuck in elections" in r["message"], r["message"]
    assert mutated3.rel(r["path"]) == "kafka3/__cluster_metadata-0/quorum-state"


def test_deep_mode_leaves_the_metadata_log_to_metadata_log_torn(mutated3):
    """A combined node's __cluster_metadata-0 walked in deep mode: its torn tail is metadata-log-torn's finding, not
    also log-torn-tail's (nor log-crc's)."""
    (torn,) = mutated3.of("metadata-log-torn")
    assert (torn["broker_id"], mutated3.rel(torn["path"])) == (1, f"kafka1/{METADATA_LOG}")
    on_metadata = [r for r in mutated3.rows if r["rule"] in ("log-torn-tail", "log-crc")]
    assert on_metadata == []


def test_deep_mode_still_reports_a_metadata_log_nothing_decoded(spark, mutated3, tmp_path):
    """Without the controllers input (no node decoded: a broker-only node's copy of the metadata log, in an audit
    that reads only the controllers), log-torn-tail keeps the torn metadata log."""
    paths = [str(d) for d in mutated3.dirs]
    brokers = stage_probe(paths, tmp_path, deep=True, verify_crc=True, broker_id=None)
    facts = [{"broker_id": b, "kafka_version": "3.2.0", "running": False} for b in sorted(brokers)]
    frames = load_frames(
        spark,
        str(tmp_path / "probe"),
        _jsonl(tmp_path / "brokers.jsonl", facts),
        _jsonl(tmp_path / "zk.jsonl", mutated3.kraft.cluster or []),
    )
    assert frames.metadata_logdirs == ()
    df, _ = detect(frames)
    # collected whole: a filter on the union of every rule's plan costs the optimizer more than the rows
    hits = [(r.broker_id, r.topic) for r in df.collect() if r.rule == "log-torn-tail"]
    assert hits == [(1, "__cluster_metadata")]


def test_every_broker_crashed_under_live_controllers_is_offline(spark, corpus, tmp_path):
    """nurlan's image (Kafka 3.2: every broker fenced, none in controlled shutdown) read by the audit from its
    running controllers: the brokers crashed (or catch up), the controllers live: offline-partition is judged and
    critical, not skipped as a stopped cluster."""
    root = corpus / NURLAN
    run = kraft_run(spark, tmp_path, root, [root / d for d in ("kafka1", "kafka2", "kafka3")], "3.2.0", audit=True)
    assert not set(run.skipped) & LIVENESS_RULES, run.skipped
    offline = run.of("offline-partition")
    states = run.facts("partition_state")
    assert len(offline) == len(states) > 0
    assert {r["severity"] for r in offline} == {"critical"}


def test_a_controlled_shutdown_of_every_broker_is_a_stopped_cluster(spark, corpus, tmp_path):
    """greenlemon (3.5): every broker fenced after a controlled shutdown: skipped even when read from live
    controllers."""
    root = corpus / GREENLEMON
    run = kraft_run(spark, tmp_path, root, [root / d for d in ("kafka1", "kafka2", "kafka3")], "3.5.1", audit=True)
    assert set(run.skipped) == LIVENESS_RULES
    assert "controlled shutdown" in run.skipped["offline-partition"]


def test_a_kraft_run_without_any_controller_read_says_so(spark, corpus, tmp_path):
    """The audit could read no controller: no cluster facts, no controllers input, but the metadata mode is told:
    KRaft's rules and the cross-source ones are skipped in KRaft words, not dropped or blamed on ZooKeeper."""
    root = corpus / NURLAN
    paths = [str(root / d) for d in ("kafka1", "kafka2", "kafka3")]
    brokers = stage_probe(paths, tmp_path, deep=False, verify_crc=False, broker_id=None)
    facts = [{"broker_id": b, "kafka_version": "3.2.0", "running": True} for b in sorted(brokers)]
    bfile = _jsonl(tmp_path / "brokers.jsonl", facts)
    frames = load_frames(spark, str(tmp_path / "probe"), bfile, metadata_mode="kraft")
    _, skipped = detect(frames)
    needs_metadata = {r.id for r in RULES if r.needs in (Needs.ZOOKEEPER, Needs.METADATA_LOG)}
    assert needs_metadata <= set(skipped)
    for rule in needs_metadata:
        assert skipped[rule] == "no controller's metadata log could be read", (rule, skipped[rule])
    # a ZooKeeper run without a snapshot keeps its words, and no KRaft rule
    _, zk_skipped = detect(load_frames(spark, str(tmp_path / "probe"), bfile, metadata_mode="zookeeper"))
    assert not set(zk_skipped) & KRAFT_RULES
    assert {zk_skipped[r.id] for r in RULES if r.needs is Needs.ZOOKEEPER} == {"no ZooKeeper snapshot given"}


def test_the_metadata_mode_reaches_the_detection_app():
    import importlib.util

    from fleet_doctor import spark as spark_submit

    args = spark_submit.detect_args("p", "b", "o", "r", "s", "f", None, metadata_mode="kraft")
    assert args[args.index("--metadata-mode") + 1] == "kraft"
    assert "--metadata-mode" not in spark_submit.detect_args("p", "b", "o", "r", "s", "f")
    with pytest.raises(ValueError):
        spark_submit.detect_args("p", "b", "o", "r", "s", "f", metadata_mode="zk")
    spec = importlib.util.spec_from_file_location("detect_app", REPO / "spark_apps" / "detect.py")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    assert app.parse_args([*args]).metadata_mode == "kraft"


def test_a_corrupt_snapshot_is_not_a_truncated_log(spark, corpus, tmp_path):
    """A flipped byte in kafka2's only snapshot (greenlemon, 3.5.1): the finding names the .checkpoint and says Kafka
    cannot load it, not that recovery truncates a log, and kafka2's image is not taken for the cluster's facts."""
    root = tmp_path / GREENLEMON
    dirs = [copy_writable(corpus / GREENLEMON / d, root / d) for d in ("kafka1", "kafka2", "kafka3")]
    (snap,) = (dirs[1] / "__cluster_metadata-0").glob("*.checkpoint")
    data = bytearray(snap.read_bytes())
    data[len(data) // 2] ^= 0xFF
    _write(snap, bytes(data))
    run = kraft_run(spark, tmp_path / "work", root, dirs, "3.5.1")
    hits = [r for r in run.of("metadata-log-torn") if r["broker_id"] == 2]
    assert hits, run.rows
    assert all(r["path"].endswith(".checkpoint") and r["severity"] == "critical" for r in hits), hits
    assert all("cannot start with it" in r["message"] and "truncates" not in r["message"] for r in hits), hits
    assert run.kraft.source["node_id"] != 2


# ------------------------------------------------------------------------------- plans change, findings do not
# Every KRaft run's findings (and skipped rules) as the plans of 95943f0 gave them, before issue 19 reshaped the
# controller rules (tagged and grouped on the driver, quorum-state-divergent as windows): every column, paths made
# relative. Re-record only for a change meant to change findings (FLEET_DOCTOR_RECORD_FINDINGS=1 pytest
# tests/test_kraft_detection.py -k recorded), and say why in the commit and in data/detection-findings/README.md
# (issue 16 re-recorded topic-id-split's rows, only those).
RECORDED = Path(__file__).parent / "data" / "detection-findings" / "kraft.jsonl.gz"


def test_kraft_findings_equal_those_recorded_before_issue_19(
    corpus, sample_runs, greenlemon_whole, mutated, mutated2, mutated3
):
    import gzip

    runs = {
        **{f"sample {name}": run for name, run in sample_runs.items()},
        "greenlemon whole": greenlemon_whole,
        "mutated": mutated,
        "mutated2": mutated2,
        "mutated3": mutated3,
    }
    now = []
    for name, run in runs.items():

        def text(v: Any, run: Run = run) -> Any:
            return v.replace(str(run.root), "$ROOT").replace(str(corpus), "$CORPUS") if isinstance(v, str) else v

        now += sorted(json.dumps({"run": name, **{k: text(v) for k, v in r.items()}}, sort_keys=True) for r in run.rows)
        now.append(json.dumps({"run": name, "skipped": run.skipped}, sort_keys=True))
    assert any('"rule": "quorum-state-divergent"' in line for line in now)
    assert any('"rule": "metadata-log-torn"' in line for line in now)
    if os.environ.get("FLEET_DOCTOR_RECORD_FINDINGS") == "1":
        RECORDED.parent.mkdir(parents=True, exist_ok=True)
        RECORDED.write_bytes(gzip.compress("".join(line + "\n" for line in now).encode(), mtime=0))
    before = gzip.decompress(RECORDED.read_bytes()).decode().splitlines()
    assert [line for line in now if line not in set(before)] == []
    assert now == before
