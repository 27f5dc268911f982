"""Detection rules (plugins/fleet_doctor/detect/) on real data, in-process on one shared Spark session.

Two detect runs, each built once per module (Spark planning dominates, not data):

- **mutated**: the test fleet of ``fleet_builder`` with every mutation applied and the ZooKeeper state
  edited, *plus* every log dir of the pristine corpus staged twice (metadata mode and deep mode with CRC
  checks) under broker ids >= 1000. Every rule of RULES.md must fire where its mutation is, with the
  right broker, topic, partition, segment, path and version-banded severity; the pristine corpus log
  dirs must show no segment or index damage beyond what MANIFEST.md explains.
- **pristine**: the same fleet layout with nothing broken and the unedited ZooKeeper records. Every
  rule must stay silent, except for the genuine anomalies MANIFEST.md describes (each listed below
  with its explanation), and in particular silent at every spot where the mutated run fires it.

Expected values come from the bytes the builder wrote, the corpus files and MANIFEST.md, never from the
probe's or detection's output.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor import probe
from fleet_doctor.detect import FINDING_COLUMNS, detect, load_frames
from fleet_doctor.detect.frames import parse_probe_lines
from fleet_doctor.repair.planner import FleetFacts, build_plan
from fleet_doctor.rules import INTERNAL_TOPICS, RULES, Needs, Scope
from harness.corpus_manifest import SampleAppendix, appendix
from harness.fleet_builder import (
    ARYAN_DESIGN1_DISK_ID,
    ARYAN_DESIGN1_ZK_ID,
    BROKERS,
    DESIGN_REPLICAS,
    IDX0,
    MUTATIONS,
    OTHER_TOPIC_ID,
    THILLAI,
    VERSION_BROKERS,
    VERSIONED,
    Fleet,
    Spot,
    build_fleet,
    stage,
    write_jsonl,
)

CORPUS_METADATA_BASE, CORPUS_DEEP_BASE = 1000, 2000
# the brokers' Kafka versions per MANIFEST.md (the lowest a sample's evidence allows)
SAMPLE_VERSIONS = {
    "kraft-3.2-3broker-replicated-nurlan": "3.2.0",
    "kraft-3.5-3broker-greenlemon": "3.5.1",
    "kraft-3.7-ldipoc": "3.7.0",
    "kraft-4.0-multiseg-kscan": "4.0.0",
    "zk-0.10-v1format-3zk-xpx": "0.10.1.0",
    "zk-2.5-multinode-sagarrao": "2.5.0",
    "zk-2.6-compacted-coby": "2.6.0",
    "zk-2.8-snappy-seanorth": "2.8.0",
    "zk-2.8plus-producerstate-cheynee": "3.4.0",
    "zk-3.0-3broker-tuyen": "3.0.0",
    "zk-3.1-single-aryan": "3.1.0",
    "zk-3.3-cleaner-swap-geraldine": "3.3.1",
    "zk-3.8-3broker-nolog-matera": "3.8.0",
    "zk-3.9-3broker-thillai": "3.9.0",
    "zk-3broker-3zk-vietstock": "3.4.0",
    "zk-gzip-leaderepochs-biggerbrain": "3.9.0",
}
# KRaft's own rules stay silent on these ZooKeeper fleets: tests/test_kraft_detection.py covers them
ALL_RULE_IDS = [r.id for r in RULES if r.needs is not Needs.METADATA_LOG]
SEGMENT_RULE_IDS = [r.id for r in RULES if r.scope is Scope.SEGMENT]


# ------------------------------------------------------------------------------------------- runs
def run_detect(spark, root: Path) -> tuple[list[dict[str, Any]], dict[str, str]]:
    frames = load_frames(spark, str(root / "probe"), str(root / "brokers.jsonl"), str(root / "zk.jsonl"))
    df, skipped = detect(frames)
    assert df.columns == FINDING_COLUMNS
    return [r.asDict() for r in df.collect()], skipped


class Run:
    def __init__(self, fleet: Fleet, rows: list[dict[str, Any]], skipped: dict[str, str], corpus_dirs=None):
        self.fleet = fleet
        self.rows = rows
        self.skipped = skipped
        self.corpus_dirs: dict[int, tuple[str, Path]] = corpus_dirs or {}  # broker id -> (sample, log dir)

    def rel(self, row: dict[str, Any]) -> str | None:
        """A finding's path relative to its broker's log dir (ZooKeeper and other paths as they are)."""
        path = row["path"]
        ld = self.fleet.logdirs.get(row["broker_id"]) if row["broker_id"] is not None else None
        if path is None or ld is None:
            return path
        if path == str(ld):
            return ""
        return path[len(str(ld)) + 1 :] if path.startswith(str(ld) + "/") else path

    def key(self, row: dict[str, Any]) -> tuple:
        return (row["rule"], row["broker_id"], row["topic"], row["partition"], row["segment"], self.rel(row))

    def fleet_rows(self, rule: str | None = None) -> list[dict[str, Any]]:
        return [
            r
            for r in self.rows
            if (r["broker_id"] is None or r["broker_id"] in BROKERS) and (rule is None or r["rule"] == rule)
        ]

    def corpus_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["broker_id"] in self.corpus_dirs]

    def find(self, spot: Spot) -> list[dict[str, Any]]:
        return [
            r
            for r in self.fleet_rows(spot.rule)
            if r["broker_id"] == spot.broker_id
            and r["topic"] == spot.topic
            and r["partition"] == spot.partition
            and r["segment"] == spot.segment
            and (spot.path is None or self.rel(r) == spot.path)
        ]


def corpus_logdirs(corpus: Path) -> list[tuple[str, Path]]:
    dirs = [Path(d) for d in probe.discover_logdirs([str(corpus)])]
    out = [(d.relative_to(corpus).parts[0], d) for d in dirs]
    assert {s for s, _ in out} == set(SAMPLE_VERSIONS), "every corpus sample has at least one log dir"
    return out


@pytest.fixture(scope="module")
def mutated(spark, corpus, tmp_path_factory) -> Run:
    fleet = build_fleet(corpus, tmp_path_factory.mktemp("mutated") / "fleet", mutate=True)
    # the pristine corpus rides along (segment rules look at one partition dir at a time; the extra
    # brokers are not in the fleet's ZooKeeper state, so their cross-source findings are ignored)
    corpus_dirs: dict[int, tuple[str, Path]] = {}
    facts = [json.loads(line) for line in fleet.brokers_path.read_text().splitlines()]
    for k, (sample, d) in enumerate(corpus_logdirs(corpus)):
        for base, deep in ((CORPUS_METADATA_BASE, False), (CORPUS_DEEP_BASE, True)):
            bid = base + k
            corpus_dirs[bid] = (sample, d)
            stage(fleet.root, {bid: [d]}, deep=deep, verify_crc=deep)
            facts.append({"broker_id": bid, "kafka_version": SAMPLE_VERSIONS[sample], "running": False})
    write_jsonl(fleet.brokers_path, facts)
    rows, skipped = run_detect(spark, fleet.root)
    return Run(fleet, rows, skipped, corpus_dirs)


@pytest.fixture(scope="module")
def pristine(spark, corpus, tmp_path_factory) -> Run:
    fleet = build_fleet(corpus, tmp_path_factory.mktemp("pristine") / "fleet", mutate=False)
    rows, skipped = run_detect(spark, fleet.root)
    return Run(fleet, rows, skipped)


@pytest.fixture(scope="module")
def manifest(corpus) -> dict[str, SampleAppendix]:
    return appendix(corpus)


# ------------------------------------------------------------------------------------------- coverage
def test_every_catalogue_rule_has_a_mutation_and_nothing_was_skipped(mutated, pristine):
    covered = {s.rule for s in MUTATIONS} | {v[0] for v in VERSIONED}
    assert covered == set(ALL_RULE_IDS)
    assert mutated.skipped == {} and pristine.skipped == {}


def test_finding_shape(mutated):
    assert mutated.rows
    for r in mutated.rows:
        assert r["rule"] in ALL_RULE_IDS
        assert r["severity"] in ("info", "warning", "critical")
        assert isinstance(r["message"], str) and r["message"]
        assert r["path"], r


# ------------------------------------------------------------------------------------------- mutations fire
@pytest.mark.parametrize("spot", MUTATIONS, ids=lambda s: s.id)
def test_mutation_fires(mutated, spot):
    hits = mutated.find(spot)
    assert len(hits) == 1, f"{spot.id}: {len(hits)} findings; the rule's findings: " + repr(
        [mutated.key(r) for r in mutated.fleet_rows(spot.rule)]
    )
    hit = hits[0]
    assert hit["severity"] == spot.severity, hit
    for text in spot.message_has:
        assert text in hit["message"], hit["message"]
    if hit["broker_id"] is not None:
        assert hit["kafka_version"] == BROKERS[hit["broker_id"]]
        if spot.rule not in ("replica-dir-missing",):
            assert hit["log_dir"] == str(mutated.fleet.logdirs[hit["broker_id"]])


def test_segment_findings_name_the_file(mutated):
    """Segment rules point at the damaged file itself (what the repair planner moves aside)."""
    for spot in MUTATIONS:
        if spot.segment is None or spot.path is None:
            continue
        (hit,) = mutated.find(spot)
        assert Path(hit["path"]).name.startswith(f"{spot.segment:020d}."), hit["path"]
        assert hit["path"] in hit["message"], hit["message"]


# ------------------------------------------------------------------------------------------- versions
VERSION_CASES = [(rule, pdir, leaf, bid, sev) for rule, pdir, leaf, by in VERSIONED for bid, sev in by.items()]


@pytest.mark.parametrize(
    ("rule", "pdir", "leaf", "broker_id", "severity"),
    VERSION_CASES,
    ids=[
        f"{r}:{p}/{leaf.split('.')[-1]}:{VERSION_BROKERS[b]}{'-running' if b == 11 else ''}"
        for r, p, leaf, b, _ in VERSION_CASES
    ],
)
def test_version_banded_severity(mutated, rule, pdir, leaf, broker_id, severity):
    topic, _, part = pdir.rpartition("-")
    spot = Spot(rule, broker_id, topic, int(part), 0, f"{pdir}/{leaf}", severity or "")
    hits = mutated.find(spot)
    if severity is None:
        assert hits == [], f"{rule} must be silent on Kafka {VERSION_BROKERS[broker_id]}: {hits}"
    else:
        assert len(hits) == 1, f"{rule} must fire once on Kafka {VERSION_BROKERS[broker_id]}: {hits}"
        assert hits[0]["severity"] == severity
        assert hits[0]["kafka_version"] == VERSION_BROKERS[broker_id]


def test_same_bytes_on_every_version_broker(mutated):
    """The version cases compare like with like: the five copies are byte-identical."""
    files = [mutated.fleet.logdirs[b] / "design-0" / IDX0 for b in VERSION_BROKERS]
    assert len({f.read_bytes() for f in files}) == 1
    assert set(DESIGN_REPLICAS) == {3, *VERSION_BROKERS}


# ------------------------------------------------------------------------------------------- no false positives
# Findings in the mutated fleet that are neither a mutation's spot nor in the pristine twin: each is a
# direct consequence of a mutation made for another rule.
CO_FIRES = {
    # an offset-index entry whose offset precedes its batch is also an index-entry mismatch (deep)
    ("index-entry-mismatch", 3, "design", 0, 0, f"design-0/{IDX0}"),
    # swapped entries: the merge walk of the index against the batches loses its place
    ("index-entry-mismatch", 3, "design", 2, 0, f"design-2/{IDX0}"),
    # the single base-offset entry of design-1 points at a batch that starts after the base offset
    *{("index-entry-mismatch", b, "design", 1, 0, f"design-1/{IDX0}") for b in VERSION_BROKERS},
    # broker 1's mycart-2 was removed but its checkpoint entries stay
    ("checkpoint-dangling", 1, "mycart", 2, None, "recovery-point-offset-checkpoint"),
    # the rahul-0 copied onto broker 2 has no index, like the original (MANIFEST: active indexes absent)
    ("index-missing", 2, "rahul", 0, 0, "rahul-0/00000000000000000000.log"),
}


def test_mutations_cause_nothing_else(mutated, pristine):
    expected = {mutated.key(r) for s in MUTATIONS for r in mutated.find(s)}
    expected |= {
        mutated.key(r)
        for rule, pdir, leaf, by in VERSIONED
        for bid, sev in by.items()
        if sev
        for r in mutated.find(
            Spot(rule, bid, pdir.rpartition("-")[0], int(pdir.rpartition("-")[2]), 0, f"{pdir}/{leaf}", sev)
        )
    }
    pristine_keys = {pristine.key(r) for r in pristine.rows}
    # topic-id-split groups replicas fleet-wide, one finding per topic: the corpus brokers riding along hold other
    # clusters' __consumer_offsets, my-topic and more (each corpus topic has their replica-not-assigned findings; the
    # pristine run, without them, checks those topics)
    corpus_topics = {r["topic"] for r in mutated.corpus_rows()} | {"__consumer_offsets"}
    got = {
        mutated.key(r)
        for r in mutated.fleet_rows()
        if not (r["rule"] == "topic-id-split" and r["topic"] in corpus_topics and r["topic"] != "my-topic")
    }
    unexplained = sorted(got - expected - pristine_keys - CO_FIRES, key=repr)
    assert unexplained == []


# ------------------------------------------------------------------------------------------- pristine twin
def _leader_epochs(path: Path) -> list[tuple[int, int]]:
    lines = path.read_text().split("\n") if path.is_file() else []
    return [(int(a), int(b)) for a, b in (ln.split() for ln in lines[2:] if ln.strip())]


def _checkpoint(path: Path) -> list[tuple[str, int]]:
    lines = path.read_text().splitlines() if path.is_file() else []
    return [(ln.split()[0], int(ln.split()[1])) for ln in lines[2:] if ln.strip()]


def pristine_explained(run: Run, manifest: dict[str, SampleAppendix]) -> dict[str, set[tuple]]:
    """Every finding the pristine fleet must show, rule by rule, each one a genuine anomaly of the
    corpus that MANIFEST.md describes (computed from the staged files and ZooKeeper records)."""
    fleet, thillai = run.fleet, manifest[THILLAI]
    out: dict[str, set[tuple]] = {r: set() for r in ALL_RULE_IDS}
    cluster_topics = {r["topic"]: r for r in fleet.zk if r["kind"] == "topic"}
    cluster_states = {(r["topic"], r["partition"]): r for r in fleet.zk if r["kind"] == "partition_state"}
    for bid in (0, 1, 2):
        ld = fleet.logdirs[bid]
        # MANIFEST: "No clean shutdown" for thillai's broker dirs
        out["unclean-shutdown"].add(("unclean-shutdown", bid, None, None, None, ""))
        dirs = {p.name for p in ld.iterdir() if p.is_dir()}
        for name in dirs:
            topic, _, part = name.rpartition("-")
            files = set(os.listdir(ld / name))
            # MANIFEST Appendix A: the active segment's indexes are absent (>= 4 MiB preallocated)
            for log in sorted(f for f in files if f.endswith(".log")):
                if log.replace(".log", ".index") not in files:
                    assert f"kafka-logs-{bid}/{name}" in thillai.absent_index_dirs, name
                    out["index-missing"].add(("index-missing", bid, topic, int(part), int(log[:20]), f"{name}/{log}"))
            # MANIFEST: incoming, sendToEmail and outgoing were created after the last snapshot
            if topic not in cluster_topics:
                assert topic in ("incoming", "sendToEmail", "outgoing"), name
                out["replica-not-assigned"].add(("replica-not-assigned", bid, topic, int(part), None, name))
            # MANIFEST: the snapshot's leader epochs (my-topic 4/4/2) predate the replicas' checkpoints
            epochs = _leader_epochs(ld / name / "leader-epoch-checkpoint")
            state = cluster_states.get((topic, int(part)))
            if epochs and state and epochs[-1][0] > state["leader_epoch"]:
                path = f"{name}/leader-epoch-checkpoint"
                out["leader-epoch-ahead"].add(("leader-epoch-ahead", bid, topic, int(part), None, path))
        # MANIFEST Appendix A: omitted empty __consumer_offsets dirs are still in the checkpoints and
        # in the assignment
        for cp in ("recovery-point-offset-checkpoint", "replication-offset-checkpoint", "log-start-offset-checkpoint"):
            for topic, part in _checkpoint(ld / cp):
                if f"{topic}-{part}" not in dirs:
                    assert f"kafka-logs-{bid}/{topic}-{part}" in thillai.omitted
                    out["checkpoint-dangling"].add(("checkpoint-dangling", bid, topic, part, None, cp))
        for topic, rec in cluster_topics.items():
            for part, replicas in rec["partitions"].items():
                if bid in replicas and f"{topic}-{part}" not in dirs:
                    assert f"kafka-logs-{bid}/{topic}-{part}" in thillai.omitted
                    out["replica-dir-missing"].add(
                        ("replica-dir-missing", bid, topic, int(part), None, f"{topic}-{part}")
                    )
    # MANIFEST: design1's partition.metadata ID differs from ZooKeeper's (design1 recreated after snapshot.32f)
    for p in range(3):
        pm = (fleet.logdirs[3] / f"design1-{p}" / "partition.metadata").read_text()
        assert ARYAN_DESIGN1_DISK_ID in pm and cluster_topics["design1"]["topic_id"] == ARYAN_DESIGN1_ZK_ID
        out["topic-id-mismatch"].add(("topic-id-mismatch", 3, "design1", p, None, f"design1-{p}/partition.metadata"))
    # replication factor 1 in ZooKeeper (single-broker topics of both clusters)
    for topic, rec in cluster_topics.items():
        if rec["replication_factor"] == 1:
            out["unsafe-replication"].add(
                ("unsafe-replication", None, topic, None, None, f"zk:/brokers/topics/{topic}")
            )
    return out


def test_pristine_explanations_are_not_empty_where_manifest_says_so(pristine, manifest):
    explained = pristine_explained(pristine, manifest)
    assert len(explained["checkpoint-dangling"]) == 88  # 44 omitted dirs x 2 checkpoint files
    assert len(explained["replica-dir-missing"]) == 44
    assert {k[2] for k in explained["unsafe-replication"]} >= {"__consumer_offsets", "rahul", "test-topic"}
    assert not {k[2] for k in explained["unsafe-replication"]} & {"my-topic", "mycart", "design"}


@pytest.mark.parametrize("rule", ALL_RULE_IDS)
def test_silent_on_pristine(pristine, mutated, manifest, rule):
    got = {pristine.key(r) for r in pristine.rows if r["rule"] == rule}
    assert got == pristine_explained(pristine, manifest)[rule]
    # and in particular silent wherever the mutated fleet fires it
    fired = {mutated.key(r) for s in MUTATIONS if s.rule == rule for r in mutated.find(s)}
    assert not fired & got


# ------------------------------------------------------------------------------------------- the corpus
def _corpus_hits(run: Run, rule: str) -> list[tuple[str, str, str]]:
    """(sample, path relative to the sample, mode) of every finding of a rule on the corpus brokers."""
    out = []
    for r in run.corpus_rows():
        if r["rule"] == rule:
            sample, d = run.corpus_dirs[r["broker_id"]]
            mode = "deep" if r["broker_id"] >= CORPUS_DEEP_BASE else "metadata"
            out.append((sample, str(Path(r["path"]).relative_to(d.parent)), mode))
    return out


def _walk_segments(corpus: Path) -> Iterable[tuple[str, Path, str, set[str]]]:
    for sample, d in corpus_logdirs(corpus):
        for pdir in sorted(p for p in d.iterdir() if p.is_dir()):
            files = set(os.listdir(pdir))
            bases = {f[:20] for f in files if f[:20].isdigit() and f[20:] in (".log", ".index", ".timeindex")}
            for base in sorted(bases):
                yield sample, pdir, base, files


DAMAGE_RULES = [r for r in SEGMENT_RULE_IDS if r not in ("index-missing", "index-orphan", "segment-leftover")]


@pytest.mark.parametrize("rule", DAMAGE_RULES)
def test_corpus_has_no_index_or_log_damage(mutated, rule):
    """MANIFEST.md: every batch CRC is valid, every index entry points at a batch start, sizes are whole
    entries, entries are monotonic, no .index last offset is at or below its base: no damage rule fires
    on any corpus log dir, in metadata mode or deep mode with CRC checks."""
    assert _corpus_hits(mutated, rule) == []


def test_corpus_index_missing_exactly_where_manifest_says_absent(mutated, corpus, manifest):
    expected = set()
    for sample, pdir, base, files in _walk_segments(corpus):
        if f"{base}.log" in files and f"{base}.index" not in files:
            rel = f"{pdir.parent.name}/{pdir.name}"
            assert rel in manifest[sample].absent_index_dirs, f"{sample}/{rel}: an index missing for no reason"
            for mode in ("metadata", "deep"):
                expected.add((sample, f"{rel}/{base}.log", mode))
    assert expected, "the corpus has logs whose preallocated index is absent"
    assert set(_corpus_hits(mutated, "index-missing")) == expected


def test_corpus_index_orphan_only_where_the_log_is_absent(mutated, corpus):
    expected = set()
    for sample, pdir, base, files in _walk_segments(corpus):
        if f"{base}.log" not in files:
            # MANIFEST: matera has no .log files at all; kraft-4.0's __cluster_metadata .logs are ABSENT
            assert sample == "zk-3.8-3broker-nolog-matera" or (
                sample == "kraft-4.0-multiseg-kscan" and pdir.name == "__cluster_metadata-0"
            ), f"{sample}/{pdir.name}/{base}"
            leaf = f"{base}.index" if f"{base}.index" in files else f"{base}.timeindex"
            for mode in ("metadata", "deep"):
                expected.add((sample, f"{pdir.parent.name}/{pdir.name}/{leaf}", mode))
    assert {s for s, _, _ in expected} == {"zk-3.8-3broker-nolog-matera", "kraft-4.0-multiseg-kscan"}
    assert set(_corpus_hits(mutated, "index-orphan")) == expected


def test_corpus_segment_leftovers_are_geraldines_cleaner_files(mutated):
    base = "zk-3.3-cleaner-swap-geraldine", "kafka-logs/__consumer_offsets-18/00000000000000000000"
    expected = {
        (base[0], f"{base[1]}.{leaf}", mode)
        for leaf in ("log.swap", "index.swap", "timeindex.cleaned")
        for mode in ("metadata", "deep")
    }
    assert set(_corpus_hits(mutated, "segment-leftover")) == expected


def test_corpus_was_probed_in_both_modes(mutated):
    """Each corpus log dir is staged twice: metadata mode, and deep mode with CRC checks (what the deep
    rules, DEEP and CRC in the registry, need)."""
    assert len(mutated.corpus_dirs) == 2 * 32  # 32 log dirs in the 16 samples
    assert {r.needs for r in RULES if r.scope is Scope.SEGMENT} == {Needs.METADATA, Needs.DEEP, Needs.CRC}
    modes = {r["broker_id"] >= CORPUS_DEEP_BASE for r in mutated.corpus_rows() if r["rule"] == "index-missing"}
    assert modes == {True, False}


def test_a_partial_audit_skips_the_rules_that_compare_brokers(spark, mutated):
    """An audit of only some brokers (the audit DAG's `brokers` param) cannot tell which replica of a split topic
    is the odd one: topic-id-split is skipped with its reason; every other rule runs as in a whole-fleet audit."""
    root = mutated.fleet.root
    frames = load_frames(spark, str(root / "probe"), str(root / "brokers.jsonl"), str(root / "zk.jsonl"))
    df, skipped = detect(frames, partial_scope=True)
    rules = {r["rule"] for r in df.select("rule").distinct().collect()}
    whole = {r["rule"] for r in mutated.rows}
    assert "topic-id-split" in whole and rules == whole - {"topic-id-split"}
    assert skipped["topic-id-split"] == "only some brokers audited in this run"


def test_staged_records_columnar_or_json_give_the_same_findings(spark, mutated, tmp_path):
    """The audit stages segment, partition and file records as Parquet (fleet_doctor.staging); output
    staged before that, all JSON Lines, must give exactly the same findings. The mutated fleet (real corpus data in
    deep and metadata mode, every rule firing) is detected again from the probe's output as it printed it."""
    root = mutated.fleet.root
    brokers = len(list(root.glob("probe/broker_id=*")))
    for suffix in ("segments", "partitions", "files"):
        staged = sorted(root.glob(f"probe/broker_id=*/*.{suffix}.parquet"))
        assert len(staged) == brokers, f"every broker's {suffix} were staged as Parquet"
    copy = tmp_path / "fleet"
    shutil.copytree(root / "probe-as-printed", copy / "probe")
    for name in ("brokers.jsonl", "zk.jsonl"):
        shutil.copy(root / name, copy / name)
    assert not list(copy.glob("probe/**/*.parquet"))
    assert len(list(copy.glob("probe/broker_id=*/probe.jsonl"))) == brokers
    rows, skipped = run_detect(spark, copy)

    def keyed(rs: list[dict[str, Any]]) -> list[tuple]:
        return sorted(tuple("" if v is None else str(v).replace(str(copy), str(root)) for v in r.values()) for r in rs)

    assert skipped == mutated.skipped
    assert keyed(rows) == keyed(mutated.rows)


def test_probe_lines_are_parsed_by_their_own_kind_wherever_kind_is(spark):
    """The kind is read off the line's start as the probe prints it, with spaces as other JSON writers print it,
    and found anywhere in the line otherwise; a line that is not JSON has no kind and no facts."""
    lines = [
        '{"kind":"partition","logdir":"/d","path":"/d/t-0","topic":"t","partition":0}',
        '{"kind": "segment", "logdir": "/d", "path": "/d/t-0", "base_offset": 5}',
        '{"logdir":"/d","path":"/d/t-0/x","file_type":"unknown","kind":"file"}',
        "not json at all",
    ]
    raw = spark.createDataFrame([(7, v) for v in lines], "broker_id int, value string")
    rows = parse_probe_lines(raw).collect()
    assert [r.kind for r in rows] == ["partition", "segment", "file", None]
    assert rows[0].partition_rec.topic == "t" and rows[0].segment_rec is None and rows[0].file_rec is None
    assert rows[1].segment_rec.base_offset == 5 and rows[1].partition_rec is None
    assert rows[2].file_rec.file_type == "unknown"
    assert all(getattr(rows[3], f"{k}_rec") is None for k in ("segment", "partition", "file", "logdir"))


# ------------------------------------------------------------------------------------------- topic-id-split
# The pristine fleet with topic IDs split three ways (issue 16): mycart as in the demo (partitions 0-1 drifted on every
# broker, partition 2 still holding ZooKeeper's ID), broker 0's __consumer_offsets 0-2 and 49 drifted (ranges with a
# gap), and my-topic split while ZooKeeper lost its ID (no side can be called right). Every other topic has one ID.
NO_ZK_SPLIT_ID = "Yk3pW0cTQ5OeR7uAqL2dNg"  # a valid Uuid no corpus topic has
DRIFTED = {"mycart": (0, 1), "__consumer_offsets": (0, 1, 2, 49)}


def _set_topic_id(pdir: Path, topic_id: str) -> None:
    (pdir / "partition.metadata").write_text(f"version: 0\ntopic_id: {topic_id}\n")


def _split_ids(logdirs: dict[int, Path], zk: list[dict[str, Any]]) -> None:
    for ld in logdirs.values():
        for topic, parts in DRIFTED.items():
            for p in parts:
                if (ld / f"{topic}-{p}").is_dir():
                    _set_topic_id(ld / f"{topic}-{p}", OTHER_TOPIC_ID)
    _set_topic_id(logdirs[2] / "my-topic-0", NO_ZK_SPLIT_ID)
    next(r for r in zk if r["kind"] == "topic" and r["topic"] == "my-topic")["topic_id"] = None


@pytest.fixture(scope="module")
def split(spark, corpus, tmp_path_factory) -> Run:
    fleet = build_fleet(corpus, tmp_path_factory.mktemp("split") / "fleet", mutate=False, edit=_split_ids)
    rows, skipped = run_detect(spark, fleet.root)
    return Run(fleet, rows, skipped)


def _disk_ids(fleet: Fleet) -> dict[tuple[int, str, int], str]:
    """(broker, topic, partition) -> the topic ID its partition.metadata holds, read from the staged files."""
    out = {}
    for bid, ld in fleet.logdirs.items():
        for pm in ld.glob("*/partition.metadata"):
            topic, _, part = pm.parent.name.rpartition("-")
            out[(bid, topic, int(part))] = dict(ln.split(": ", 1) for ln in pm.read_text().splitlines())["topic_id"]
    return out


def _holders(fleet: Fleet, topic: str, topic_id: str) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for (bid, t, p), tid in sorted(_disk_ids(fleet).items()):
        if t == topic and tid == topic_id:
            out.setdefault(bid, []).append(p)
    return out


def test_split_is_one_finding_per_topic_and_only_where_ids_differ(split):
    ids: dict[str, set[str]] = {}
    for (_, topic, _), tid in _disk_ids(split.fleet).items():
        ids.setdefault(topic, set()).add(tid)
    split_topics = {t for t, s in ids.items() if len(s) > 1}
    assert split_topics == {"mycart", "__consumer_offsets", "my-topic"}  # every other topic: one ID, no finding
    got = sorted(split.key(r) for r in split.rows if r["rule"] == "topic-id-split")
    assert got == sorted(("topic-id-split", None, t, None, None, f"zk:/brokers/topics/{t}") for t in split_topics)


def test_split_with_a_zookeeper_id_names_the_groups_and_leaves_the_critical_findings_to_the_mismatches(split):
    """The demo's case: ZooKeeper has an ID. The drifted replicas are each a critical topic-id-mismatch; the split is
    one info finding naming both IDs and their replicas; the replicas holding ZooKeeper's ID get no critical finding
    (no finding of their own at all)."""
    zk_id = {r["topic"]: r["topic_id"] for r in split.fleet.zk if r["kind"] == "topic"}
    drifted = {k for k, tid in _disk_ids(split.fleet).items() if k[1] in DRIFTED and tid != zk_id[k[1]]}
    assert {(b, t, p) for b, t, p in drifted if t == "mycart"} == {(b, "mycart", p) for b in (0, 1, 2) for p in (0, 1)}
    mismatches = {(r["broker_id"], r["topic"], r["partition"]): r for r in split.fleet_rows("topic-id-mismatch")}
    assert {k for k in mismatches if k[1] in DRIFTED} == drifted
    assert all(mismatches[k]["severity"] == "critical" for k in drifted)
    for topic in DRIFTED:
        healthy = [(b, p) for b, ps in _holders(split.fleet, topic, zk_id[topic]).items() for p in ps]
        assert healthy, topic
        for b, p in healthy:
            on_it = [r for r in split.rows if r["broker_id"] == b and r["topic"] == topic and r["partition"] == p]
            assert not [r for r in on_it if r["rule"].startswith("topic-id") or r["severity"] == "critical"], on_it
    (mycart,) = [r for r in split.fleet_rows("topic-id-split") if r["topic"] == "mycart"]
    assert mycart["severity"] == "info" and mycart["broker_id"] is None and mycart["log_dir"] is None, mycart
    assert _holders(split.fleet, "mycart", zk_id["mycart"]) == {0: [2], 1: [2], 2: [2]}
    assert mycart["message"] == (
        f"topic mycart: its replicas hold 2 topic IDs: {zk_id['mycart']} (3 replicas, ZooKeeper's) on broker 0 "
        "partition 2, broker 1 partition 2, broker 2 partition 2; "
        f"{OTHER_TOPIC_ID} (6 replicas) on broker 0 partitions 0-1, broker 1 partitions 0-1, broker 2 partitions 0-1. "
        f"ZooKeeper /brokers/topics/mycart has {zk_id['mycart']}: the replicas holding another ID are its "
        "topic-id-mismatch findings"
    )
    (offsets,) = [r for r in split.fleet_rows("topic-id-split") if r["topic"] == "__consumer_offsets"]
    assert _holders(split.fleet, "__consumer_offsets", OTHER_TOPIC_ID) == {0: [0, 1, 2, 49]}
    assert offsets["severity"] == "info"
    assert f"{OTHER_TOPIC_ID} (4 replicas) on broker 0 partitions 0-2,49." in offsets["message"], offsets["message"]


def test_split_without_a_zookeeper_id_is_critical_and_names_each_group(split):
    (hit,) = [r for r in split.fleet_rows("topic-id-split") if r["topic"] == "my-topic"]
    assert hit["severity"] == "critical", hit
    (old_id,) = {tid for (_, t, _), tid in _disk_ids(split.fleet).items() if t == "my-topic"} - {NO_ZK_SPLIT_ID}
    assert _holders(split.fleet, "my-topic", old_id) == {0: [0, 1, 2], 1: [0, 1, 2], 2: [1, 2]}
    assert hit["message"] == (
        f"topic my-topic: its replicas hold 2 topic IDs: {old_id} (8 replicas) on broker 0 partitions 0-2, broker 1 "
        f"partitions 0-2, broker 2 partitions 1-2; {NO_ZK_SPLIT_ID} (1 replica) on broker 2 partition 0. ZooKeeper "
        "/brokers/topics/my-topic has no topic ID: no side can be called right, which ID to keep is a decision for a "
        "human"
    )
    # nothing to compare the replicas with: no mismatch, no critical finding on any of its replicas
    assert not [r for r in split.fleet_rows() if r["topic"] == "my-topic" and r["rule"] == "topic-id-mismatch"]


def test_a_split_message_stays_bounded_on_a_topic_many_clusters_share(mutated):
    """The corpus brokers riding along hold the __consumer_offsets of a dozen clusters: the one finding names
    ZooKeeper's ID and then the IDs most replicas hold (SPLIT_IDS in all), at most SPLIT_BROKERS brokers for each and
    SPLIT_RANGES partition ranges per broker, and counts what it leaves out (computed from the files)."""
    import re

    from fleet_doctor.detect.cluster import SPLIT_BROKERS, SPLIT_IDS, SPLIT_RANGES

    held: dict[str, int] = {}
    dirs = [*mutated.fleet.logdirs.values(), *(d for _, d in mutated.corpus_dirs.values())]
    for ld in dirs:
        for pm in ld.glob("__consumer_offsets-*/partition.metadata"):
            fields = dict(ln.split(": ", 1) for ln in pm.read_text().splitlines() if ": " in ln)
            if re.fullmatch(r"__consumer_offsets-\d+", pm.parent.name) and fields.get("topic_id"):
                held[fields["topic_id"]] = held.get(fields["topic_id"], 0) + 1
    zk_id = next(r["topic_id"] for r in mutated.fleet.zk if r["kind"] == "topic" and r["topic"] == "__consumer_offsets")
    shown = [zk_id, *sorted((i for i in held if i != zk_id), key=lambda i: (-held[i], i))][:SPLIT_IDS]
    assert len(held) > SPLIT_IDS
    (hit,) = [r for r in mutated.fleet_rows("topic-id-split") if r["topic"] == "__consumer_offsets"]
    msg = hit["message"]
    assert hit["severity"] == "info" and msg.startswith(f"topic __consumer_offsets: its replicas hold {len(held)} "), (
        msg
    )
    hidden = sum(held.values()) - sum(held[i] for i in shown)
    assert f"; and {len(held) - SPLIT_IDS} more IDs on {hidden} replicas. ZooKeeper " in msg, msg
    groups = msg.split(": ", 2)[2].split("; and ")[0].split("; ")
    assert [g.split(" ", 1)[0] for g in groups] == shown
    for g in groups:
        brokers = re.findall(r"broker \d+ partitions? (\d[0-9-]*(?:,\d[0-9-]*)*)", g)
        assert 0 < len(brokers) <= SPLIT_BROKERS and all(len(b.split(",")) <= SPLIT_RANGES for b in brokers), g
    assert re.search(r"broker \d+ partitions [0-9,-]+ and \d+ more partitions", msg) and len(msg) < 2000, msg


def _facts(fleet: Fleet) -> FleetFacts:
    probe_out = {}
    for bid in fleet.logdirs:
        text = (fleet.root / "probe-as-printed" / f"broker_id={bid}" / "probe.jsonl").read_text()
        probe_out[bid] = [json.loads(line) for line in text.splitlines() if line.strip()]
    return FleetFacts(probe_out, fleet.zk)


def test_the_plan_touches_exactly_the_replicas_that_differ_from_zookeeper(split):
    """The repair removes the topic-ID files of the replicas whose ID differs from ZooKeeper's (the mismatches), none
    of a replica holding ZooKeeper's ID, and none of a split topic ZooKeeper has no ID for: that one is a decision for
    a human, with the IDs to choose from."""
    plan = build_plan("lab", "run1", split.rows, _facts(split.fleet))
    zk_id = {r["topic"]: r["topic_id"] for r in split.fleet.zk if r["kind"] == "topic"}
    expected = set()
    for (bid, topic, p), tid in _disk_ids(split.fleet).items():
        if zk_id.get(topic) and tid != zk_id[topic] and topic not in INTERNAL_TOPICS:
            pdir = split.fleet.logdirs[bid] / f"{topic}-{p}"
            expected |= {
                (bid, str(pdir / n)) for n in ("partition.metadata", "leader-epoch-checkpoint") if (pdir / n).is_file()
            }
    assert {t for _, path in expected for t in [Path(path).parent.name.rpartition("-")[0]]} == {"mycart", "design1"}
    removed = {(b.broker_id, a.path) for b in plan.brokers for a in b.actions if a.action == "remove"}
    assert removed == expected
    assert {a.rule for b in plan.brokers for a in b.actions if a.action == "remove"} == {"topic-id-mismatch"}
    assert not plan.zookeeper  # my-topic's replicas do not agree on one ID: nothing to write back
    (decision,) = plan.decisions
    assert decision["rule"] == "topic-id-split" and decision["topic"] == "my-topic"
    assert decision["topic_ids"] == sorted(_holders_ids(split.fleet, "my-topic")) and len(decision["topic_ids"]) == 2
    assert "decision for a human" in decision["why"]
    splits = {s["topic"]: s for s in plan.skipped if s["rule"] == "topic-id-split"}
    assert set(splits) == {"mycart", "__consumer_offsets", "my-topic"}
    assert "topic-id-mismatches" in splits["mycart"]["why"] and "decision" not in splits["mycart"]


def _holders_ids(fleet: Fleet, topic: str) -> set[str]:
    return {tid for (_, t, _), tid in _disk_ids(fleet).items() if t == topic}


# ------------------------------------------------------------------------------- plans change, findings do not
# The findings of both runs as the rule plans of 95943f0 gave them (one plan per rule, before issue 19 fused them per
# fact frame), every column, with the fleet's and the corpus's paths made relative. Re-record only for a change that
# is meant to change findings (FLEET_DOCTOR_RECORD_FINDINGS=1 pytest tests/test_detection.py -k recorded), and say
# why in the commit and in data/detection-findings/README.md (issue 16 re-recorded topic-id-split's rows, only those).
RECORDED = Path(__file__).parent / "data" / "detection-findings"


def _normalized(run: Run, corpus: Path) -> list[str]:
    def text(v: Any) -> Any:
        return v.replace(str(run.fleet.root), "$FLEET").replace(str(corpus), "$CORPUS") if isinstance(v, str) else v

    return sorted(json.dumps({k: text(v) for k, v in r.items()}, sort_keys=True) for r in run.rows)


@pytest.mark.parametrize("name", ["mutated", "pristine"])
def test_findings_equal_those_recorded_before_the_plans_were_fused(request, corpus, name):
    run: Run = request.getfixturevalue(name)
    now = _normalized(run, corpus)
    recorded = RECORDED / f"{name}.jsonl.gz"
    if os.environ.get("FLEET_DOCTOR_RECORD_FINDINGS") == "1":
        recorded.parent.mkdir(parents=True, exist_ok=True)
        recorded.write_bytes(gzip.compress("".join(line + "\n" for line in now).encode(), mtime=0))
    before = gzip.decompress(recorded.read_bytes()).decode().splitlines()
    assert len(now) == len(before)
    assert [line for line in now if line not in set(before)] == []
    assert now == before


def test_compiled_and_interpreted_plans_give_the_recorded_findings(spark, mutated, corpus):
    """The tests' session runs the plans as a small input runs them (fleet_doctor.spark's SMALL_INPUT_CONF, which
    ``scan``, the lab's audit and a repair's verify take: interpreted, no adaptive re-planning, one shuffle
    partition; tests/conftest.py). A big input's run compiles its plans (whole-stage code generation, Janino) and
    re-plans adaptively over several partitions: every rule gives exactly the recorded findings both ways."""
    from conftest import SMALL_INPUT_SQL_CONF

    assert {k: spark.conf.get(k) for k in SMALL_INPUT_SQL_CONF} == SMALL_INPUT_SQL_CONF  # interpreted, as scan
    recorded = gzip.decompress((RECORDED / "mutated.jsonl.gz").read_bytes()).decode().splitlines()
    assert _normalized(mutated, corpus) == recorded
    big_input = {
        "spark.sql.codegen.wholeStage": "true",
        "spark.sql.codegen.factoryMode": "FALLBACK",
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.shuffle.partitions": "4",
    }
    assert set(big_input) == set(SMALL_INPUT_SQL_CONF)
    try:
        for k, v in big_input.items():
            spark.conf.set(k, v)
        rows, skipped = run_detect(spark, mutated.fleet.root)
    finally:
        for k, v in SMALL_INPUT_SQL_CONF.items():
            spark.conf.set(k, v)
    assert skipped == mutated.skipped
    assert _normalized(Run(mutated.fleet, rows, skipped), corpus) == recorded


def test_the_column_functions_reach_the_jvm_in_one_round_trip(spark, monkeypatch: pytest.MonkeyPatch) -> None:
    """``findings.pin_jvm_classes`` (detect() calls it): once pinned, a column function is its call alone, with no
    lookup of its class (through every star import of the JVM view) or of its method, and builds the same column."""
    from pyspark.sql import functions as F

    from fleet_doctor.detect.findings import PINNED_CLASSES, pin_jvm_classes

    sc = spark.sparkContext
    client = sc._gateway._gateway_client
    sent: list[str] = []
    real = client.send_command

    def counted(command: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(command.split("\n", 1)[0])
        return real(command, *args, **kwargs)

    monkeypatch.setattr(client, "send_command", counted)
    for short, fqn in PINNED_CLASSES.items():  # as a new gateway has them, whatever ran on this one before
        monkeypatch.delitem(sc._jvm.__dict__, short, raising=False)
        monkeypatch.delitem(sc._jvm.__dict__, fqn, raising=False)
    before = str(F.when(F.col("a") >= 1, F.lit("x")))
    assert sent.count("r") >= 6, sent  # unpinned: the class and its member looked up for each function
    pin_jvm_classes(sc)
    pin_jvm_classes(sc)  # once per gateway: pinned again, the same
    assert str(F.when(F.col("a") >= 1, F.lit("x"))) == before  # each method looked up once, here
    sent.clear()
    assert str(F.when(F.col("a") >= 1, F.lit("x"))) == before
    assert sent and "r" not in sent, sent  # calls only ("c"), no reflection
    for short, fqn in PINNED_CLASSES.items():
        assert getattr(sc._jvm, short) is getattr(sc._jvm, fqn)
