#!/usr/bin/env python3
"""Benchmark the detection app (spark_apps/detect.py) on synthetic staged data against Spark baselines measured
in the same run.

    .venv/bin/python bench/detect_bench.py                           # 1M and 10M segments, updates bench/README.md
    .venv/bin/python bench/detect_bench.py --sizes 100000 --no-readme  # quick check

Per size: bench/gen_staged.py writes the staged probe output of a fleet (segment, partition and file records as
Parquet, the other records as gzip JSON Lines, as the audit stages them; broker facts, ZooKeeper
snapshot, with a known amount of injected damage), the files are read once to warm the page cache, then three
spark-submit runs on ``local[2]`` with the same Spark configuration (BIG_RUN_CONF):

    baseline text   bench/spark_baseline.py --mode text   read + decompress every line, count lines and Parquet rows
    baseline parse  bench/spark_baseline.py --mode parse  ... parse every line with detection's record schema and
                                                          read every Parquet column detection reads
    detect          spark_apps/detect.py (probe + brokers + ZooKeeper snapshot -> Parquet findings + summary)

Reported: wall time, CPU time (user+sys of the spark-submit process tree, from wait4), peak RSS (sum over the
process tree of each process's VmHWM, polled), seconds per million segments, detect/baseline ratios, the 10M/1M
ratio of detect's wall time, and whether detect's findings are exactly the injected ones. Exit status 1 when the
largest size is over the target (TARGET_SECONDS per 10M segments, scaled linearly for other sizes), when scaling
is worse than linear by more than LINEAR_SLACK, or when the findings are wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
README = os.path.join(HERE, "README.md")
BEGIN, END = "<!-- detect-bench:begin -->", "<!-- detect-bench:end -->"
TARGET_SECONDS = 60.0  # per 10M segments (issue 19; issue 3 asked for 120)
LINEAR_SLACK = 1.25  # seconds per million segments at the largest size <= 1.25x that at the smallest
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "plugins"))
import gen_staged  # noqa: E402

from fleet_doctor.spark import DETECT_APP, LOCAL_SPARK_CONF, spark_env  # noqa: E402
from fleet_doctor.spark import submit_command as spark_submit_cmd  # noqa: E402

BASELINE_APP = os.path.join(HERE, "spark_baseline.py")
MASTER = "local[2]"


def big_run_conf(driver_memory: str, local_dir: str) -> dict[str, str]:
    """The Spark configuration for a large fleet on one machine (what the audit DAG should pass for big runs).

    Differs from LOCAL_SPARK_CONF (tuned for tiny scans, where JVM warm-up dominates): the full tiered JIT (C2:
    the C1-only -XX:TieredStopAtLevel=1 makes JSON parsing about 3x slower), the throughput collector, a driver
    heap big enough to cache the parsed facts (local mode: the driver is the executor), more shuffle partitions
    for AQE to coalesce, broadcast joins up to 128 MB, and spill/shuffle files under the bench's temp dir."""
    conf = dict(LOCAL_SPARK_CONF)
    conf.update(
        {
            "spark.driver.memory": driver_memory,
            "spark.driver.extraJavaOptions": "-XX:+UseParallelGC",
            "spark.sql.shuffle.partitions": "64",
            # the facts the rules join (partitions, files, ZooKeeper state) are tens of MB at 10 M segments:
            # broadcast hash joins instead of shuffles and sorts of both sides
            "spark.sql.autoBroadcastJoinThreshold": str(128 << 20),
            "spark.sql.adaptive.coalescePartitions.enabled": "true",
            "spark.local.dir": local_dir,
        }
    )
    return conf


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return out


def _hwm_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_measured(cmd: list[str], env: dict[str, str], log_path: str) -> dict:
    """Run cmd; return wall s, CPU s (user+sys of the whole tree), peak RSS MiB (sum of per-process VmHWM), rc."""
    with open(log_path, "w") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        peaks: dict[int, int] = {}
        done = threading.Event()

        def poll() -> None:
            while not done.is_set():
                for p in _descendants(proc.pid):
                    peaks[p] = max(peaks.get(p, 0), _hwm_kib(p))
                done.wait(0.5)

        th = threading.Thread(target=poll, daemon=True)
        th.start()
        out = proc.stdout.read() if proc.stdout else ""
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        done.set()
        th.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "wall": wall,
        "cpu": ru.ru_utime + ru.ru_stime,
        "rss_mib": sum(peaks.values()) / 1024,
        "rc": proc.returncode,
        "stdout": out,
    }


def warm(path: str) -> None:
    for d, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(d, name), "rb") as f:
                while f.read(1 << 20):
                    pass


def bench_size(n: int, args: argparse.Namespace, tmp: str) -> dict:
    staged = os.path.join(tmp, f"staged-{n}")
    print(f"[{n}] generating staged data in {staged} ...", flush=True)
    info = gen_staged.generate(staged, n, jobs=args.jobs, seed=args.seed)
    print(f"[{n}] {json.dumps(info)}", flush=True)
    warm(staged)
    env = spark_env()
    conf = big_run_conf(args.driver_memory, os.path.join(tmp, "spark-local"))
    probe_dir = os.path.join(staged, "probe")
    runs: dict[str, list[dict]] = {"text": [], "parse": [], "detect": []}
    commands = {}
    for rep in range(args.repeat):
        for name in ("text", "parse", "detect"):
            if name == "detect":
                out_dir = os.path.join(staged, f"findings-{rep}")
                summary = os.path.join(staged, f"summary-{rep}.json")
                app_args = [
                    "--probe-dir",
                    probe_dir,
                    "--brokers",
                    os.path.join(staged, "brokers.jsonl"),
                    "--zk-snapshot",
                    os.path.join(staged, "zk.jsonl"),
                    "--output",
                    out_dir,
                    "--audit-run",
                    "bench",
                    "--summary",
                    summary,
                ]
                cmd = spark_submit_cmd(DETECT_APP, MASTER, conf, app_args)
            else:
                cmd = spark_submit_cmd(BASELINE_APP, MASTER, conf, ["--mode", name, "--probe-dir", probe_dir])
            commands[name] = cmd
            before = loadavg()
            r = run_measured(cmd, env, os.path.join(tmp, f"{name}-{n}-{rep}.log"))
            r["load_before"], r["load_after"] = before, loadavg()
            if r["rc"] != 0:
                with open(os.path.join(tmp, f"{name}-{n}-{rep}.log")) as f:
                    tail = f.read()[-3000:]
                raise SystemExit(f"{name} at {n} segments failed (exit {r['rc']}):\n{tail}")
            if name == "detect":
                with open(summary) as f:
                    r["by_rule"] = json.load(f)["by_rule"]
                shutil.rmtree(out_dir, ignore_errors=True)
            else:
                r["result"] = json.loads(r["stdout"].strip().splitlines()[-1])
            print(
                f"[{n}] {name}: {r['wall']:.1f} s wall, {r['cpu']:.1f} s CPU, peak RSS {r['rss_mib']:.0f} MiB, "
                f"load {r['load_before']} -> {r['load_after']}",
                flush=True,
            )
            runs[name].append(r)
    if not args.keep:
        shutil.rmtree(staged, ignore_errors=True)
    best = {k: min(v, key=lambda r: r["wall"]) for k, v in runs.items()}
    ok = best["detect"]["by_rule"] == info["expected"]
    return {"n": n, "info": info, "best": best, "runs": runs, "findings_ok": ok, "commands": commands}


def fmt_cmd(cmd: list[str]) -> str:
    out = []
    for part in cmd:
        part = part.replace(REPO + "/", "").replace(os.path.dirname(cmd[0]) + "/", "$SPARK_HOME/bin/")
        out.append(part)
    return " ".join(out)


def render(results: list[dict], args: argparse.Namespace, conf: dict[str, str]) -> tuple[str, list[str]]:
    lines = [
        "| segments | brokers / log dirs | probe output (staged) | gen | text | parse | detect "
        "| CPU: text, parse, detect | detect per M segments | detect/text | detect/parse | detect peak RSS "
        "| findings |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    problems = []
    for r in results:
        b, i = r["best"], r["info"]
        d, t, p = b["detect"]["wall"], b["text"]["wall"], b["parse"]["wall"]
        found = ", ".join(f"{k} {v}" for k, v in sorted(b["detect"]["by_rule"].items()))
        cells = [
            f"{r['n']:,}",
            f"{i['brokers']} / {i['files']}",
            f"{i['json_bytes'] / 1e9:.2f} GB ({i['staged_bytes'] / 1e6:.0f} MB)",
            f"{i['seconds']:.0f} s",
            f"{t:.1f} s",
            f"{p:.1f} s",
            f"**{d:.1f} s**",
            f"{b['text']['cpu']:.0f} s, {b['parse']['cpu']:.0f} s, {b['detect']['cpu']:.0f} s",
            f"{d / (r['n'] / 1e6):.1f} s",
            f"{d / t:.2f}x",
            f"**{d / p:.2f}x**",
            f"{b['detect']['rss_mib'] / 1024:.1f} GiB",
            "as injected" if r["findings_ok"] else "WRONG: " + found,
        ]
        lines.append("| " + " | ".join(cells) + " |")
        if not r["findings_ok"]:
            problems.append(f"{r['n']}: findings {b['detect']['by_rule']} != expected {i['expected']}")
    last, first = results[-1], results[0]
    target = TARGET_SECONDS * last["n"] / 10_000_000
    d_last = last["best"]["detect"]["wall"]
    met = "met" if d_last <= target else "OVER"
    verdict = [f"{last['n']:,} segments: detect {d_last:.1f} s, target {target:.0f} s ({met})"]
    if d_last > target:
        problems.append(f"detect at {last['n']} segments took {d_last:.1f} s > {target:.0f} s")
    if len(results) > 1:
        ratio = d_last / first["best"]["detect"]["wall"]
        size_ratio = last["n"] / first["n"]
        per_m = (d_last / last["n"]) / (first["best"]["detect"]["wall"] / first["n"])
        base_ratio = last["best"]["parse"]["wall"] / first["best"]["parse"]["wall"]
        verdict.append(
            f"{last['n']:,}/{first['n']:,} segments ({size_ratio:.0f}x): detect {ratio:.2f}x, parse baseline "
            f"{base_ratio:.2f}x; time per segment {per_m:.2f}x that of the smaller run "
            f"({'linear' if per_m <= LINEAR_SLACK else 'WORSE than linear'}, limit {LINEAR_SLACK}x)"
        )
        if per_m > LINEAR_SLACK:
            problems.append(f"scaling: time per segment grew {per_m:.2f}x")
    loads = [
        f"{r['load_before']} -> {r['load_after']}"
        for res in results
        for k in ("text", "parse", "detect")
        for r in res["runs"][k]
    ]
    conf_txt = " ".join(f"{k}={v}" for k, v in conf.items() if k != "spark.local.dir")
    lines += [
        "",
        f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, master {MASTER}, Python {platform.python_version()}, "
        f"Spark {spark_version()}, {platform.platform()}; best of {args.repeat} run(s) per command; "
        f"load average (1/5/15 min) before -> after each run: {'; '.join(loads)}.",
        "",
        f"Spark conf: `{conf_txt}`",
        "",
        "; ".join(verdict) + ".",
    ]
    return "\n".join(lines), problems


def spark_version() -> str:
    import pyspark

    return pyspark.__version__


def update_readme(block: str, commands: dict[str, list[str]]) -> None:
    with open(README) as f:
        text = f.read()
    if BEGIN not in text:
        raise SystemExit(f"{README}: no {BEGIN} marker")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    cmds = "\n".join(f"    {fmt_cmd(c)}" for c in commands.values())
    new = f"{head}{BEGIN}\n{block}\n\nCommands of the largest size (N = its segment count):\n\n{cmds}\n{END}{tail}"
    with open(README + ".tmp", "w") as f:
        f.write(new)
    os.replace(README + ".tmp", README)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000000,10000000", help="segment counts (default 1000000,10000000)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per command and size, best kept (default 1)")
    ap.add_argument("--driver-memory", default="14g", help="spark.driver.memory (default 14g)")
    ap.add_argument("--jobs", type=int, default=2, help="generator processes (default 2)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tmpdir", help="where the staged data goes (default: the system temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the staged data and logs")
    ap.add_argument("--no-readme", action="store_true", help="do not rewrite the results block of bench/README.md")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    tmp = tempfile.mkdtemp(prefix="detect-bench-", dir=args.tmpdir)
    try:
        results = [bench_size(n, args, tmp) for n in sizes]
        conf = big_run_conf(args.driver_memory, os.path.join(tmp, "spark-local"))
        block, problems = render(results, args, conf)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}")
    print(block)
    if not args.no_readme:
        update_readme(block, results[-1]["commands"])
    for p in problems:
        print("OVER/WRONG:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
