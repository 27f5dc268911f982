#!/usr/bin/env python3
"""Generate synthetic staged audit input for the detection benchmark: probe output of a whole fleet, the broker
facts and a ZooKeeper snapshot, as spark_apps/detect.py reads them.

    python bench/gen_staged.py --out DIR --segments 1000000 [--segments-per-partition 25] [--jobs 2] [--seed 1]

Writes

* ``DIR/probe/broker_id=<N>/logdir-<k>.jsonl.gz`` and ``logdir-<k>.{segments,partitions,files}.parquet``: one
  probe run per log dir, staged as the audit stages it (fleet_doctor.staging): the segment, partition and
  file records as Parquet, every other record (the log dir's own records, a few lines) as gzip JSON Lines. A
  broker has ``--logdirs-per-broker`` (10) log dirs ``/data/<k>/kafka-logs`` (JBOD) of up to
  ``--partitions-per-logdir`` (1000) partition replicas each, so a broker holds 250 000 segments at K = 25 and the
  fleet grows by brokers: 1 M segments are 4 brokers and 40 probe runs, 10 M are 40 brokers and 400. A probe run's
  segments Parquet (25 000 rows, one row group) is one Spark task: local[2] gets two hundred per core at 10 M,
  small enough to balance and large enough that per-task overhead does not count.
* ``DIR/brokers.jsonl``: broker facts (Kafka 3.7.0, running), ``DIR/zk.jsonl``: the ZooKeeper snapshot (cluster,
  controller, a registration per broker, every topic with its topic ID and assignment, a partition state per
  partition), and ``DIR/expected.json``: counts and the findings (rule -> count) the injected damage must give.

The records are not made up: a small log dir is generated with bench/gen_tree.py (set up as a live ZooKeeper-mode
broker leaves it: meta.properties v0, no clean-shutdown marker, ``.lock`` held), probed with
plugins/fleet_doctor/probe.py, and its probe output is turned into templates; the ZooKeeper records are templated
from the snapshot of a real cluster in the corpus (``zk-2.8plus-producerstate-cheynee``). The generator then only
substitutes log dir, topic, partition, topic ID and (shifted) offsets in those records, with str.format.

Topics come from gen_tree's layout (``__consumer_offsets`` first, then topics of 1-48 partitions), replication
factor 3, replicas placed round-robin over the brokers, leader = first replica, ISR = all replicas. Injected
damage (everything else is healthy for a running fleet, so it must give no finding):

* ``index-untrimmed``: ``segments // 100000`` replicas (at least 1) have a non-active segment whose ``.index``
  is left at the preallocated 10 MiB (from probing such a file in the template tree);
* ``topic-id-mismatch`` and ``topic-id-split``: one replica's partition.metadata holds another topic ID (a critical
  mismatch on that replica, and one info split finding for its topic: ZooKeeper has the ID);
* ``under-replicated``: one partition's ISR lacks its last replica;
* ``unsafe-replication``: one topic with replication factor 1 (it also takes the 1-2 replicas left over when the
  replica count is not 1 + a multiple of 3).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import fcntl
import json
import multiprocessing
import os
import random
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PROBE = os.path.join(REPO, "plugins", "fleet_doctor", "probe.py")
ZK_SAMPLE = "zk-2.8plus-producerstate-cheynee/zookeeper"
KAFKA_VERSION = "3.7.0"
RF1_TOPIC = "bench.rf1"
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "plugins"))
import gen_tree  # noqa: E402

from fleet_doctor.staging import ProbeSplitter, staged_outputs  # noqa: E402

# offset-valued fields of the probe records: template value + the partition's shift
SEGMENT_OFFSETS = ("base_offset", "index_first_offset", "index_last_offset", "timeindex_last_offset")
PARTITION_OFFSETS = (
    "log_start_segment_offset",
    "active_base_offset",
    "recovery_point",
    "log_start_offset",
    "high_watermark",
    "cleaner_offset",
)
CHECKPOINT_FIELDS = {
    "recovery-point-offset-checkpoint": "recovery_point",
    "log-start-offset-checkpoint": "log_start_offset",
    "replication-offset-checkpoint": "high_watermark",
    "cleaner-offset-checkpoint": "cleaner_offset",
}
TEMPLATE_PARTITIONS = 100  # gen_tree layout: 50 of __consumer_offsets, 50 of other topics
DAMAGED_TEMPLATE = 60  # a template partition of an ordinary topic (not one with an untrimmed active segment)


# ---- templates from real probe output
def _probe(tree: str, python: str) -> list[dict]:
    out = subprocess.run([python, PROBE, tree], check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def make_template_tree(work: str, k: int, python: str) -> tuple[list[dict], list[dict]]:
    """Generate, set up and probe the template log dir; returns (probe records, records after damage)."""
    tree = os.path.join(work, "tree")
    gen_tree.generate(tree, TEMPLATE_PARTITIONS * k, k, seed=7)
    # a live ZooKeeper-mode broker: meta.properties v0, no .kafka_cleanshutdown (deleted at start), .lock held
    with open(os.path.join(tree, "meta.properties"), "w") as f:
        f.write("#\n#Tue Nov 14 22:13:20 UTC 2023\nbroker.id=1\nversion=0\ncluster.id=ZmlSuuTkSbGvW-kGeZJaOA\n")
    os.unlink(os.path.join(tree, ".kafka_cleanshutdown"))
    lock = open(os.path.join(tree, ".lock"), "w")
    try:
        fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        clean = _probe(tree, python)
        # damage: a non-active segment of one template partition keeps its preallocated 10 MiB .index
        pdir = "/" + _dirs(clean)[DAMAGED_TEMPLATE]
        seg = [r for r in clean if r["kind"] == "segment" and r["path"].endswith(pdir)][3]
        with open(os.path.join(seg["path"], f"{seg['base_offset']:020d}.index"), "r+b") as f:
            f.truncate(10485760)
        damaged = _probe(tree, python)
    finally:
        lock.close()
    return clean, damaged


def _dirs(records: list[dict]) -> list[str]:
    return [r["dir"] for r in records if r["kind"] == "partition"]


def _tok(name: str) -> str:
    return f"@@{name}@@"


def partition_templates(records: list[dict]) -> list[dict]:
    """Per partition dir of the template log dir: one str.format template of all its records (file, segment,
    partition records, in probe order) with fields L (log dir), T (topic), P (partition), I (topic ID) and
    o<n> (offsets, template value + shift), plus the template values needed for the checkpoints."""
    logdir = next(r["logdir"] for r in records if r["kind"] == "logdir")
    by_dir: dict[str, list[dict]] = {}
    for r in records:
        if r["kind"] in ("segment", "partition") or (r["kind"] == "file" and r.get("partition_dir")):
            d = r["path"][len(logdir) + 1 :].split("/")[0]
            by_dir.setdefault(d, []).append(r)
    out = []
    for d, recs in by_dir.items():
        offsets: list[int] = []

        def off(v: int | None, offsets: list[int] = offsets) -> str | None:
            if v is None:
                return None
            offsets.append(v)
            return _tok(f"o{len(offsets) - 1}")

        lines = []
        part = None
        for orig in recs:
            r = copy.deepcopy(orig)
            rest = r["path"][len(logdir) + 1 + len(d) :]
            r["logdir"] = _tok("L")
            if r["kind"] == "file" and r["file_type"] == "producer_snapshot":
                rest = "/" + _tok(f"z{len(offsets)}") + ".snapshot"
                r["base_offset"] = off(r["base_offset"])
            r["path"] = _tok("L") + "/" + _tok("T") + "-" + _tok("P") + rest
            for key in ("dir", "partition_dir"):
                if key in r:
                    r[key] = _tok("T") + "-" + _tok("P")
            r["topic"], r["partition"] = _tok("T"), _tok("P")
            if "topic_id" in r:
                r["topic_id"] = _tok("I")
            if r["kind"] == "segment":
                for key in SEGMENT_OFFSETS:
                    r[key] = off(r[key])
            if r["kind"] == "partition":
                part = orig
                r["producer_snapshots"] = [off(v) for v in r["producer_snapshots"]]
                for key in PARTITION_OFFSETS:
                    r[key] = off(r[key])
            lines.append(json.dumps(r, separators=(",", ":")))
        text = "\n".join(lines) + "\n"
        text = text.replace("{", "{{").replace("}", "}}")
        text = re.sub(r'"@@(o\d+|P)@@"', r"{\1}", text)
        text = re.sub(r"@@z(\d+)@@", r"{o\1:020d}", text)
        text = re.sub(r"@@(\w+)@@", r"{\1}", text)
        assert part is not None
        out.append(
            {
                "dir": d,
                "compacted": part["topic"] == gen_tree.COMPACTED_TOPIC,
                "format": text,
                "offsets": offsets,
                "checkpoints": {cp: part[field] for cp, field in CHECKPOINT_FIELDS.items()},
                "segments": part["segment_count"],
                "files": sum(1 for r in recs if r["kind"] == "file"),
            }
        )
    return out


# ---- the fleet
def fleet_layout(n_segments: int, k: int, per_logdir: int, logdirs_per_broker: int, seed: int) -> dict:
    if n_segments % k:
        raise SystemExit(f"--segments must be a multiple of --segments-per-partition ({k})")
    replicas = n_segments // k
    if replicas < 4:
        raise SystemExit("--segments too small: need at least 4 partition replicas")
    n_brokers = max(3, -(-replicas // (per_logdir * logdirs_per_broker)))
    n_rf3 = (replicas - 1) // 3
    n_rf1 = replicas - 3 * n_rf3
    partitions = []  # (topic, partition, topic_id, replicas)
    layout = gen_tree.topic_layout(seed)
    for i in range(n_rf3):
        topic, p, tid = next(layout)
        partitions.append((topic, p, tid, [1 + (i + j) % n_brokers for j in range(3)]))
    rng = random.Random(f"{seed}/rf1")
    rf1_tid = gen_tree.topic_id(rng)
    for p in range(n_rf1):
        partitions.append((RF1_TOPIC, p, rf1_tid, [1 + (n_rf3 + p) % n_brokers]))
    return {"brokers": n_brokers, "partitions": partitions, "replicas": replicas}


def plan(
    layout: dict, templates: list[dict], per_logdir: int, logdirs_per_broker: int, seed: int, damaged_template: int
) -> dict:
    """Place the replicas in log dirs and choose the damage. Returns the per-log-dir work and expectations."""
    rng = random.Random(f"{seed}/plan")
    compacted = [i for i, t in enumerate(templates) if t["compacted"]]
    plain = [i for i, t in enumerate(templates) if not t["compacted"]]
    per_broker: dict[int, list[tuple]] = {b: [] for b in range(1, layout["brokers"] + 1)}
    for idx, (topic, p, tid, reps) in enumerate(layout["partitions"]):
        pool = compacted if topic == gen_tree.COMPACTED_TOPIC else plain
        tmpl = pool[idx % len(pool)]
        shift = rng.randrange(0, 10_000) * 1000
        for b in reps:
            per_broker[b].append((topic, p, tid, tmpl, shift))
    n_untrimmed = max(1, (layout["replicas"] * templates[0]["segments"]) // 100_000)
    all_replicas = [(b, j) for b, reps in per_broker.items() for j in range(len(reps))]
    rf3 = [(b, j) for b, j in all_replicas if per_broker[b][j][0] != RF1_TOPIC]
    # the damaged variant exists for one template partition: damage replicas built from that one
    can_damage = [(b, j) for b, j in rf3 if per_broker[b][j][3] == damaged_template]
    if len(can_damage) < n_untrimmed:
        raise SystemExit("--segments too small for the injected damage")
    untrimmed = set(rng.sample(can_damage, n_untrimmed))
    mismatch = rng.choice([r for r in rf3 if r not in untrimmed])
    wrong_tid = gen_tree.topic_id(random.Random(f"{seed}/wrong-tid"))
    work = []
    for b, reps in per_broker.items():
        n_dirs = min(logdirs_per_broker, max(1, -(-len(reps) // per_logdir)))
        dirs: list[list[tuple]] = [[] for _ in range(n_dirs)]
        for j, (topic, p, tid, tmpl, shift) in enumerate(reps):
            variant = "damaged" if (b, j) in untrimmed else "clean"
            if (b, j) == mismatch:
                tid = wrong_tid
            dirs[j % n_dirs].append((topic, p, tid, tmpl, shift, variant))
        work.extend((b, k, entries) for k, entries in enumerate(dirs))
    states = [(t, p, reps, reps) for t, p, _, reps in layout["partitions"]]
    urp = rng.choice([i for i, s in enumerate(states) if len(s[2]) == 3])
    t, p, reps, _ = states[urp]
    states[urp] = (t, p, reps, reps[:-1])
    expected = {
        "index-untrimmed": n_untrimmed,
        "topic-id-mismatch": 1,
        "topic-id-split": 1,  # one finding per topic, whatever number of replicas differ
        "under-replicated": 1,
        "unsafe-replication": 1,
    }
    return {"work": work, "states": states, "expected": expected}


def logdir_path(k: int) -> str:
    return f"/data/{k}/kafka-logs"


def write_logdir(args: tuple) -> tuple[int, int, int]:
    """Write one log dir's probe output (gzip); returns (records, segments, bytes uncompressed)."""
    out_dir, broker, k, entries, ctx = args
    tmpl = ctx["templates"]
    head = ctx["head"]
    logdir = logdir_path(k)
    path = os.path.join(out_dir, f"broker_id={broker}", f"logdir-{k}.jsonl.gz")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    records = segments = size = files = 0
    cps: dict[str, list] = {cp: [] for cp in CHECKPOINT_FIELDS}
    body = []
    for topic, p, tid, ti, shift, variant in entries:
        t = tmpl[variant][ti]
        offs = {f"o{i}": v + shift for i, v in enumerate(t["offsets"])}
        body.append(t["format"].format(L=logdir, T=topic, P=p, I=tid, **offs))
        records += t["records"]
        segments += t["segments"]
        files += t["files"]
        for cp, v in t["checkpoints"].items():
            if v is not None:
                cps[cp].append([topic, p, v + shift])
    host = f"kafka-{broker:03d}.bench"
    meta = copy.deepcopy(head["meta"])
    meta["broker_id"] = broker
    meta["properties"]["broker.id"] = str(broker)
    pre = []
    probe = dict(head["probe"], hostname=host, paths=[logdir])
    pre.append(probe)
    for name in sorted(CHECKPOINT_FIELDS):
        entries_cp = cps[name]
        text = f"0\n{len(entries_cp)}\n" + "".join(f"{t} {p} {o}\n" for t, p, o in entries_cp)
        pre.append(
            dict(
                head["checkpoint"],
                logdir=logdir,
                path=f"{logdir}/{name}",
                checkpoint=name,
                entries=entries_cp,
                bytes=len(text),
            )
        )
    pre.append(dict(head["lock"], logdir=logdir, path=f"{logdir}/.lock"))
    pre.append(dict(head["meta_file"], logdir=logdir, path=f"{logdir}/meta.properties", meta=meta))
    pre.append(
        dict(
            head["logdir"],
            logdir=logdir,
            path=logdir,
            realpath=logdir,
            meta=meta,
            lock_held_by_pid=4000 + broker,
            checkpoints={cp: {"entries": len(cps[cp]), "error": None} for cp in sorted(cps)},
            partition_dirs=len(entries),
        )
    )
    end = dict(head["probe_end"], partitions=len(entries), segments=segments, files=files + len(pre) - 2)
    text_head = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in pre)
    text_end = json.dumps(end, separators=(",", ":")) + "\n"

    # staged as the audit stages: segment, partition and file records as Parquet, the rest gzip'd JSON Lines
    with staged_outputs(path, _replaced_when_closed, gzip_level=ctx["level"]) as (gz, columnar):
        with ProbeSplitter(gz, columnar) as splitter:
            for chunk in [text_head, *body, text_end]:
                data = chunk.encode("ascii")
                size += len(data)
                splitter.write(data)
    assert not splitter.miscounted(end), (path, splitter.miscounted(end))
    assert splitter.kept_json["segment"] == splitter.kept_json["partition"] == 0, path
    return records + len(pre) + 1, segments, size


@contextlib.contextmanager
def _replaced_when_closed(path: str):
    """A file written as ``path.tmp`` and moved to ``path`` when the block ends without an exception (removed
    when it ends with one)."""
    try:
        with open(path + ".tmp", "wb") as f:
            yield f
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + ".tmp")
        raise
    os.replace(path + ".tmp", path)


def _pool_init(ctx: dict) -> None:
    global _CTX
    _CTX = ctx


def _pool_write(args: tuple) -> tuple[int, int, int]:
    return write_logdir((*args, _CTX))


def zk_records(layout: dict, states: list, sample_dir: str) -> list[dict]:
    from fleet_doctor.zookeeper import snapshot as zk_snapshot

    sample = list(zk_snapshot.read_snapshot_file(sample_dir))
    first = {}
    for r in sample:
        first.setdefault(r["kind"], r)
    cluster_id = first["cluster"]["cluster_id"]
    out = [dict(first["zk_snapshot"], file=None, source="live", zookeeper="zk-1.bench:2181,zk-2.bench:2181")]
    out.append(dict(first["cluster"], controller_id=1, controller=dict(first["cluster"]["controller"], brokerid=1)))
    for b in range(1, layout["brokers"] + 1):
        host = f"kafka-{b:03d}.bench"
        out.append(
            dict(
                first["broker"],
                broker_id=b,
                host=host,
                endpoints=[f"PLAINTEXT://{host}:9092"],
                broker_epoch=first["broker"]["broker_epoch"] + b,
                ephemeral_owner=first["broker"]["ephemeral_owner"] + b,
            )
        )
    topics: dict[str, dict] = {}
    for topic, p, tid, reps in layout["partitions"]:
        t = topics.setdefault(topic, {"topic_id": tid, "partitions": {}})
        t["partitions"][str(p)] = reps
    by_topic: dict[str, list] = {}
    for t, p, reps, isr in states:
        by_topic.setdefault(t, []).append((p, reps, isr))
    for topic in sorted(topics):
        t = topics[topic]
        out.append(
            dict(
                first["topic"],
                topic=topic,
                topic_id=t["topic_id"],
                partitions=t["partitions"],
                replication_factor=min(len(r) for r in t["partitions"].values()),
                min_insync_replicas=None,
                config={},
                marked_for_deletion=False,
            )
        )
        for p, reps, isr in by_topic[topic]:
            out.append(dict(first["partition_state"], topic=topic, partition=p, leader=reps[0], isr=isr))
    n_topics, n_states = len(topics), len(states)
    out[0]["kafka_znodes"] = 2 + layout["brokers"] + n_topics + n_states
    out.append(dict(first["zk_snapshot_end"], topics=n_topics, brokers=layout["brokers"], partition_states=n_states))
    assert cluster_id
    return out


def generate(
    out: str,
    segments: int,
    k: int = 25,
    per_logdir: int = 1000,
    logdirs_per_broker: int = 10,
    seed: int = 1,
    jobs: int = 2,
    level: int = 1,
    python: str = sys.executable,
    corpus: str | None = None,
    log=print,
) -> dict:
    t0 = time.perf_counter()
    corpus = corpus or os.environ.get("FLEET_DOCTOR_CORPUS") or os.path.join(REPO, "..", "shared", "kafka-real-data")
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gen-staged-", dir=out) as work:
        clean, damaged = make_template_tree(work, k, python)
    tmpl_clean = partition_templates(clean)
    tmpl_damaged = partition_templates(damaged)
    for t in (*tmpl_clean, *tmpl_damaged):
        t["records"] = t["format"].count("\n")
    assert all(t["segments"] == k for t in tmpl_clean), "template partitions must hold K segments"
    # the damaged variant differs from the clean one only in one template partition
    variants = {
        "clean": tmpl_clean,
        "damaged": [tmpl_damaged[i] if i == DAMAGED_TEMPLATE else t for i, t in enumerate(tmpl_clean)],
    }
    head = {
        "probe": next(r for r in clean if r["kind"] == "probe"),
        "probe_end": next(r for r in clean if r["kind"] == "probe_end"),
        "logdir": next(r for r in clean if r["kind"] == "logdir"),
        "checkpoint": next(r for r in clean if r.get("file_type") == "offset_checkpoint"),
        "lock": next(r for r in clean if r.get("file_type") == "lock"),
        "meta_file": next(r for r in clean if r.get("file_type") == "meta_properties"),
    }
    head["meta"] = head["logdir"]["meta"]
    assert head["logdir"]["lock_held_by_pid"] and not head["logdir"]["clean_shutdown"], head["logdir"]
    layout = fleet_layout(segments, k, per_logdir, logdirs_per_broker, seed)
    p = plan(layout, tmpl_clean, per_logdir, logdirs_per_broker, seed, DAMAGED_TEMPLATE)
    work_items = [(os.path.join(out, "probe"), b, kk, entries) for b, kk, entries in p["work"]]
    ctx = {"templates": variants, "head": head, "level": level}
    if jobs > 1:
        with multiprocessing.get_context("fork").Pool(jobs, _pool_init, (ctx,)) as pool:
            results = pool.map(_pool_write, work_items, chunksize=1)
    else:
        results = [write_logdir((*w, ctx)) for w in work_items]
    records = sum(r[0] for r in results)
    written = sum(r[1] for r in results)
    assert written == segments, (written, segments)
    with open(os.path.join(out, "brokers.jsonl"), "w") as f:
        for b in range(1, layout["brokers"] + 1):
            fact = {"broker_id": b, "kafka_version": KAFKA_VERSION, "running": True, "host": f"kafka-{b:03d}.bench"}
            f.write(json.dumps(fact) + "\n")
    zk = zk_records(layout, p["states"], os.path.join(corpus, ZK_SAMPLE))
    with open(os.path.join(out, "zk.jsonl"), "w") as f:
        for r in zk:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    info = {
        "segments": written,
        "records": records,
        "json_bytes": sum(r[2] for r in results),
        "staged_bytes": sum(  # gzip JSON Lines + the Parquet files
            os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(out, "probe")) for f in fs
        ),
        "brokers": layout["brokers"],
        "files": len(work_items),
        "partitions": len(layout["partitions"]),
        "replicas": layout["replicas"],
        "zk_records": len(zk),
        "expected": p["expected"],
        "seconds": round(time.perf_counter() - t0, 1),
    }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(info, f, indent=2)
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory to write (probe/, brokers.jsonl, zk.jsonl, expected.json)")
    ap.add_argument("--segments", type=int, default=1_000_000, help="total segments (default 1000000)")
    ap.add_argument("--segments-per-partition", type=int, default=25, help="K (default 25)")
    ap.add_argument("--partitions-per-logdir", type=int, default=1000, help="replicas per log dir (default 1000)")
    ap.add_argument("--logdirs-per-broker", type=int, default=10, help="log dirs per broker (default 10)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="writer processes (default 2)")
    ap.add_argument("--gzip-level", type=int, default=1, help="gzip compression level (default 1)")
    a = ap.parse_args(argv)
    info = generate(
        a.out,
        a.segments,
        a.segments_per_partition,
        a.partitions_per_logdir,
        a.logdirs_per_broker,
        a.seed,
        a.jobs,
        a.gzip_level,
    )
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
