#!/usr/bin/env python3
"""The KRaft metadata decoder (``fleet_doctor.cluster_metadata``) on hostile and big metadata logs, as a controller
runs it: the bundle on stdin of ``python3 -`` (``audit.kraft.decode_command``'s program and limits).

    .venv/bin/python bench/kraft_decoder_bench.py                 # every case, updates bench/README.md
    .venv/bin/python bench/kraft_decoder_bench.py --partitions 20000 --no-readme   # quick check

Cases (each in a fresh temporary metadata dir; the decoder's output is checked, not only timed):

    gzip bomb            one gzip batch of 97,845 bytes that inflates to 64 MiB of empty records (the safety
                         review's file): one problem record, nothing else
    8 MB of empty records one gzip batch just under KRaft's 8 MiB batch limit: 1.1 M records with null values
    ClearElr             N partitions with ELR in 100 topics, then N ClearElrRecords (one topic's, then "": every
                         topic's, in turn)
    baseline             the same N partitions without the ClearElrRecords (the ClearElr case's ratio is against it)
    big cluster          200,000 partitions (with --partitions: that many) in 1,000 topics: the decoder's memory on a
                         big cluster, what audit.kraft.DECODE_MEMORY_MIB is chosen from
    follow poll          the big cluster's log with 100 PartitionChangeRecords after it: the repair's gates' poll
                         (``--records-from N --records-to END --resume``, repair/kraft_cluster.py) on the
                         controller, and the worker's replay of what it printed into its image

For each: wall and CPU time of the decoder process, and its peak RSS (VmHWM from /proc/self/status at exit, read by
a two-line wrapper around the bundle: the rusage of a child carries the parent's high-water mark across fork and
exec). Targets (issue 28): peak RSS under 64 MiB and a clear problem record on the gzip bomb; ClearElr over 10,000
partitions x 10,000 records under 2 s. Standard library and the repo's own modules only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "plugins"), str(REPO / "lab"), str(REPO / "tests"), str(REPO / "bench")]

from readme_block import write_block  # noqa: E402

from fleet_doctor import cluster_metadata as cm  # noqa: E402
from fleet_doctor import probe  # noqa: E402
from fleet_doctor.audit.kraft import DECODE_CPU_S, DECODE_MEMORY_MIB  # noqa: E402
from fleet_lab import kraft  # noqa: E402
from harness import kraft_encode as ke  # noqa: E402

BEGIN, END = "<!-- kraft-decoder-bench:begin -->", "<!-- kraft-decoder-bench:end -->"
RSS_TARGET_MIB = 64
CLEAR_ELR_TARGET_S = 2.0
TS = 1_700_000_000_000
# reads the bundle from stdin, runs it as ``python3 -`` would, and prints VmHWM and VmPeak (kB) on fd 2 at exit
WRAPPER = (
    "import atexit, os, sys\n"
    "atexit.register(lambda: os.write(2, ''.join('\\n' + l.split()[0][:-1] + ' ' + l.split()[1] + '\\n' "
    "for l in open('/proc/self/status') if l.startswith(('VmHWM', 'VmPeak'))).encode()))\n"
    "sys.argv = ['-'] + sys.argv[1:]\n"
    "exec(compile(sys.stdin.buffer.read(), '<stdin>', 'exec'), {'__name__': '__main__'})\n"
)


def topic_id(n: int) -> str:
    return cm.uuid_text(struct.pack(">QQ", 0x1000 + n, n + 1))


def segment(values: list[bytes], base: int = 0) -> bytes:
    """Data batches of the values from ``base``, each under KRaft's batch limit, as the controller appends them."""
    out, chunk, size = bytearray(), [], 0
    for v in values:
        if chunk and size + len(v) + 16 > cm.KRAFT_MAX_BATCH_BYTES // 8:
            out += kraft.data_batch(base, 1, chunk, TS)
            base, chunk, size = base + len(chunk), [], 0
        chunk.append(v)
        size += len(v) + 16
    if chunk:
        out += kraft.data_batch(base, 1, chunk, TS)
    return bytes(out)


def cluster_values(partitions: int, topics: int, elr: bool) -> list[bytes]:
    values = [kraft.metadata_record("FeatureLevelRecord", 0, {"Name": "metadata.version", "FeatureLevel": 19})]
    per_topic = max(1, partitions // topics)
    for t in range(topics):
        values.append(kraft.metadata_record("TopicRecord", 0, {"Name": f"t{t}", "TopicId": topic_id(t)}))
        for p in range(per_topic):
            fields = {"PartitionId": p, "TopicId": topic_id(t), "Replicas": [1, 2, 3], "Isr": [1, 2, 3], "Leader": 1}
            fields.update(LeaderEpoch=0, PartitionEpoch=0, Directories=[probe.ZERO_UUID] * 3)
            if elr:
                fields.update(EligibleLeaderReplicas=[2, 3], LastKnownElr=[1])
            values.append(kraft.metadata_record("PartitionRecord", 2, fields))
    return values


def clear_elr_values(records: int, topics: int) -> list[bytes]:
    names = ["" if i % 2 else f"t{i % topics}" for i in range(records)]  # every other one clears every topic
    return [kraft.metadata_record("ClearElrRecord", 0, {"TopicName": n}) for n in names]


def metadata_dir(root: Path, log: bytes) -> Path:
    mdir = root / cm.METADATA_DIR_NAME
    mdir.mkdir(parents=True)
    (mdir / probe.segment_file_name(0, "log")).write_bytes(log)
    return mdir


def decode(mdir: Path, mode: list[str] | None = None) -> dict:
    """The decoder as a controller runs it (``mode``: its options before the dir, e.g. a follower's); wall and CPU
    time, peak RSS, its records' kinds and problems."""
    program = cm.bundle()
    args = ["--max-memory-mib", str(DECODE_MEMORY_MIB), "--max-cpu-s", str(DECODE_CPU_S), *(mode or []), str(mdir)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", WRAPPER, *args], input=program, capture_output=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    err = done.stderr.decode(errors="replace")
    hwm = int(err.rsplit("VmHWM ", 1)[1].split()[0]) if "VmHWM " in err else -1
    peak = int(err.rsplit("VmPeak ", 1)[1].split()[0]) if "VmPeak " in err else -1
    if done.returncode != 0:
        raise SystemExit(f"the decoder exited {done.returncode} on {mdir}: {err[-2000:]}")
    records = [json.loads(line) for line in done.stdout.splitlines()]
    problems = [r for r in records if r.get("kind") == "metadata_problem"]
    return {
        "wall_s": wall,
        "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        "rss_mib": hwm / 1024,
        "address_space_mib": peak / 1024,
        "records": len(records),
        "partitions": sum(1 for r in records if r.get("kind") == "partition_state"),
        "problems": problems,
        "end": records[-1] if records else {},
        "lines": done.stdout.splitlines(),
    }


def change_values(partitions: int, topics: int, n: int = 100) -> list[bytes]:
    """``n`` ISR shrinks (PartitionChangeRecord), spread over the big cluster's topics."""
    per_topic = max(1, partitions // topics)
    return [
        kraft.metadata_record(
            "PartitionChangeRecord", 0, {"PartitionId": i % per_topic, "TopicId": topic_id(i % topics), "Isr": [1, 2]}
        )
        for i in range(n)
    ]


def follow_poll(root: Path, partitions: int) -> dict:
    """The gates' follow poll on the controller (its CPU, RSS and output as ``decode`` measures them) and the
    worker's replay of its records (CPU, in this process), after a first read up to the tail gave the resume point."""
    base = cluster_values(partitions, 1000, elr=False)
    tail = change_values(partitions, 1000)
    mdir = metadata_dir(root / "follow", segment(base + tail))
    image, end = cm.Image(), None
    for rec in cm.metadata_records(str(mdir), 0, len(base)):  # the first poll: the image whole, up to the tail
        if rec["kind"] == "metadata_record":
            image.replay(rec["name"], rec["fields"])
        elif rec["kind"] == "metadata_records_end":
            end = rec
    assert end is not None and end["next_offset"] == len(base) and end["resume"], end
    resume = f"{end['resume'][0]}:{end['resume'][1]}"
    args = ["--records-from", str(len(base)), "--records-to", str(len(base) + len(tail)), "--resume", resume]
    out = decode(mdir, args)
    changes = [json.loads(line) for line in out.pop("lines") if b'"metadata_record"' in line]
    t0 = time.process_time()
    for rec in changes:
        assert image.replay(rec["name"], rec["fields"]) is None
    out["worker_cpu_s"] = time.process_time() - t0
    out["changes"] = len(changes)
    assert len(changes) == len(tail), len(changes)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", type=int, default=200_000, help="the big cluster's partitions (default 200000)")
    ap.add_argument("--elr", type=int, default=10_000, help="ClearElr: partitions and records (default 10000)")
    ap.add_argument("--no-readme", action="store_true", help="print the table only")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="kraft-decoder-bench-") as tmp:
        root = Path(tmp)

        def case(name: str, log: bytes) -> dict:
            d = root / name.replace(" ", "-")
            out = decode(metadata_dir(d, log))
            shutil.rmtree(d)
            out.update(name=name, file_bytes=len(log))
            rows.append(out)
            print(f"{name}: {out['wall_s']:.2f} s, {out['cpu_s']:.2f} s CPU, {out['rss_mib']:.1f} MiB", flush=True)
            return out

        bomb = case("gzip bomb", ke.empty_records_gzip_batch(64 << 20))
        assert [p["problem"] for p in bomb["problems"]] == ["undecodable"], bomb["problems"]
        assert "inflates to more than" in bomb["problems"][0]["message"]
        near = case("8 MB of empty records", ke.empty_records_gzip_batch(8_000_000))
        assert "could not be decoded; its other" in near["problems"][-1]["message"], near["problems"][-1]
        base_values = cluster_values(a.elr, 100, elr=True)
        baseline = case("baseline", segment(base_values))
        clear = case("ClearElr", segment(base_values + clear_elr_values(a.elr, 100)))
        assert clear["partitions"] == baseline["partitions"] == a.elr and not clear["problems"]
        big = case("big cluster", segment(cluster_values(a.partitions, 1000, elr=False)))
        assert big["partitions"] == a.partitions and not big["problems"]
        follow = follow_poll(root, a.partitions)
        follow.update(
            name="follow poll",
            file_bytes=(root / "follow" / cm.METADATA_DIR_NAME / "00000000000000000000.log").stat().st_size,
        )
        rows.append(follow)
        worker_ms = follow["worker_cpu_s"] * 1000
        print(
            f"follow poll: {follow['cpu_s']:.2f} s CPU on the controller, {worker_ms:.1f} ms on the worker", flush=True
        )
    clear_s = clear["cpu_s"] - baseline["cpu_s"]
    lines = [
        "| case | segment | wall | CPU | peak RSS | peak address space | output | target |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        target = ""
        if r is bomb:
            target = (
                f"RSS < {RSS_TARGET_MIB} MiB, one problem: **{'ok' if r['rss_mib'] < RSS_TARGET_MIB else 'MISSED'}**"
            )
        elif r is follow:
            verdict = "ok" if r["cpu_s"] < 1 and r["worker_cpu_s"] < 1 else "MISSED"
            target = (
                f"{follow['changes']} new records: controller {r['cpu_s']:.2f} s CPU, worker "
                f"{r['worker_cpu_s'] * 1000:.1f} ms (< 1 s each): **{verdict}**"
            )
        elif r is clear:
            verdict = "ok" if clear_s < CLEAR_ELR_TARGET_S else "MISSED"
            target = (
                f"{a.elr:,} ClearElr over the baseline: {clear_s:.2f} s CPU < {CLEAR_ELR_TARGET_S:.0f} s: **{verdict}**"
            )
        what = (
            f"{len(r['problems'])} problem(s): {r['problems'][-1]['message'].split(': ', 1)[1][:90]}"
            if r["problems"]
            else f"{r.get('changes', 0)} records printed"
            if r is follow
            else f"{r['partitions']:,} partitions"
        )
        lines.append(
            f"| {r['name']} | {r['file_bytes']:,} B | {r['wall_s']:.2f} s | {r['cpu_s']:.2f} s | "
            f"{r['rss_mib']:.1f} MiB | {r['address_space_mib']:.0f} MiB | {what} | {target} |"
        )
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines += [
        "",
        f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, Python {platform.python_version()}, the decoder's limits "
        f"{DECODE_MEMORY_MIB} MiB / {DECODE_CPU_S} s, load average after: {load}.",
    ]
    table = "\n".join(lines)
    print(table)
    if not a.no_readme:
        intro = (
            "# KRaft decoder\n\nThe metadata decoder on a controller, on hostile and big metadata logs "
            "(`bench/kraft_decoder_bench.py`; its docstring says what each case is). Reproduce (about a minute):\n\n"
            "    .venv/bin/python bench/kraft_decoder_bench.py\n\n"
        )
        write_block(BEGIN, END, f"{BEGIN}\n{table}\n{END}", intro)
    return 0


if __name__ == "__main__":
    sys.exit(main())
