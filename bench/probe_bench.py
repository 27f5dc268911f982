#!/usr/bin/env python3
"""Benchmark the probe's metadata mode against two filesystem floors, measured in the same run.

    python3 bench/probe_bench.py                    # 100k and 200k segments, 5 runs each, updates bench/README.md
    python3 bench/probe_bench.py --sizes 20000 --repeat 3 --no-readme   # quick check

For each tree size a log dir is generated (bench/gen_tree.py) in a temporary directory (the larger tree is grown
from the smaller: it adds partitions, so 200k holds the 100k tree plus as much again), every command is run
once to warm the page cache (the probe's warm-up run is also checked: one segment record per generated segment,
no errors), then the three commands are run ``--repeat`` times, interleaved, and the median wall time is kept:

    floor 1 (stat only)          find TREE -printf '%s %p\\n' >/dev/null
    floor 2 (stat + index tails) find TREE -name '*index' -print0 | xargs -0 tail -qc 8 >/dev/null
    probe (metadata mode)        python3 plugins/fleet_doctor/probe.py TREE >/dev/null

The probe's peak RSS is its VmHWM (/proc/self/status) at exit, from the checked warm-up run, which runs the same
probe.py as __main__ through a two-line runpy wrapper. (The rusage of a child is no good here: Linux carries the
parent's high-water RSS across fork/vfork + exec, so os.wait4 would report this Python process's size.)
Acceptance: probe <= 2x floor 2, and an RSS that stays flat from 100k to 200k segments. Only the standard library
is needed. The trees are removed afterwards.
"""

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PROBE = os.path.join(REPO, "plugins", "fleet_doctor", "probe.py")
README = os.path.join(HERE, "README.md")
BEGIN, END = "<!-- probe-bench:begin -->", "<!-- probe-bench:end -->"
TARGET = 2.0

sys.path.insert(0, HERE)
import gen_tree  # noqa: E402

# Runs a script as __main__ and reports the process's peak RSS (VmHWM, KiB) on stderr when it ends.
# Also reports the largest peak RSS of its reaped children: the probe's forked worker (--jobs).
RSS_WRAPPER = """
import resource, runpy, sys
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    with open("/proc/self/status") as f:
        hwm = [line.split()[1] for line in f if line.startswith("VmHWM:")]
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    sys.stderr.write("VmHWM %s %d\\n" % (hwm[0], children))
"""


def run_timed(argv):
    """Run argv with stdout to /dev/null; return (wall seconds, exit status)."""
    t0 = time.perf_counter()
    rc = subprocess.call(argv, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0, rc


def run_rss(python, script_argv, stdout):
    """Run a Python script as __main__ under RSS_WRAPPER.

    Returns (exit status, its peak RSS in KiB, the largest peak RSS of its child processes in KiB)."""
    p = subprocess.run([python, "-c", RSS_WRAPPER, *script_argv], stdout=stdout, stderr=subprocess.PIPE)
    err = p.stderr.decode("utf-8", "replace")
    m = re.search(r"^VmHWM (\d+) (\d+)$", err, re.M)
    if not m:
        raise SystemExit(f"no VmHWM from {script_argv}: {err}")
    return p.returncode, int(m.group(1)), int(m.group(2))


def commands(tree, python):
    q = shlex.quote(tree)
    return [
        ("floor1", "stat floor", ["sh", "-c", f"find {q} -printf '%s %p\\n' >/dev/null"]),
        (
            "floor2",
            "stat+tails floor",
            ["sh", "-c", f"find {q} -name '*index' -print0 | xargs -0 tail -qc 8 >/dev/null"],
        ),
        ("probe", "probe (metadata)", [python, PROBE, tree]),
    ]


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2.0


def check_probe_output(path, segments):
    nseg = 0
    last = None
    with open(path) as f:
        for line in f:
            if line.startswith('{"kind":"segment"'):
                nseg += 1
            last = line
    end = json.loads(last)
    if end.get("kind") != "probe_end" or end.get("segments") != segments or nseg != segments or end.get("errors"):
        raise SystemExit(f"probe output check failed: {nseg} segment records, probe_end {end!r}")
    return end


def fs_type(path):
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                mnt = parts[1]
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, kind = mnt, parts[2]
    except OSError:
        pass
    return kind


def bench_one(size, args, python, workdir):
    tree = os.path.join(workdir, "logdir")
    if os.path.isdir(tree) and size % args.segments_per_partition:
        shutil.rmtree(tree)  # only whole partitions can be added to an existing tree
    t0 = time.perf_counter()
    info = gen_tree.generate(tree, size, args.segments_per_partition, args.seed)
    os.sync()  # let writeback finish before timing anything
    gen_s = time.perf_counter() - t0
    sys.stderr.write(
        f"  {size} segments in {info['partitions']} partitions ({info['created']} new) written in {gen_s:.1f} s\n"
    )
    cmds = commands(tree, python)
    # warm-up: fills the page cache (dentries, inodes, index pages); the probe's run is checked and measured
    for key, _label, argv in cmds:
        if key == "probe":
            out = os.path.join(workdir, "probe-out.jsonl")
            with open(out, "w") as f:
                rc, rss_kib, worker_rss_kib = run_rss(python, argv[1:], f)
            if rc != 0:
                raise SystemExit(f"probe exited {rc}")
            check_probe_output(out, size)
            os.unlink(out)
        else:
            run_timed(argv)
    os.sync()  # the warm-up reads updated atimes: write them back before timing
    times = {k: [] for k, _l, _a in cmds}
    for _ in range(args.repeat):
        for key, _label, argv in cmds:
            wall, rc = run_timed(argv)
            if rc != 0:
                raise SystemExit(f"{key} exited {rc}: {argv}")
            times[key].append(wall)
    med = {k: median(v) for k, v in times.items()}
    return {
        "segments": size,
        "partitions": info["partitions"],
        "floor1": med["floor1"],
        "floor2": med["floor2"],
        "probe": med["probe"],
        "probe_min": min(times["probe"]),
        "probe_max": max(times["probe"]),
        "rss_kib": rss_kib,
        "worker_rss_kib": worker_rss_kib,
        "r1": med["probe"] / med["floor1"],
        "r2": med["probe"] / med["floor2"],
    }


def table(rows, baseline_rss, startup):
    lines = [
        "| segments | partitions | floor 1: stat | floor 2: stat+tails | probe (min-max) | probe/floor1 | "
        "probe/floor2 | probe max RSS: writer, worker |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['segments']} | {r['partitions']} | {r['floor1']:.2f} s | {r['floor2']:.2f} s | "
            f"{r['probe']:.2f} s ({r['probe_min']:.2f}-{r['probe_max']:.2f}) | {r['r1']:.2f}x | **{r['r2']:.2f}x** | "
            f"{r['rss_kib'] / 1024:.1f} MiB, {r['worker_rss_kib'] / 1024:.1f} MiB |"
        )
    lines.append("")
    lines.append(
        f"For reference: interpreter start-up (`python3 -c pass`, included in every probe time) {startup:.2f} s; "
        "max RSS of the same interpreter loading probe.py and exiting (`probe.py --help`) "
        f"{baseline_rss / 1024:.1f} MiB."
    )
    return "\n".join(lines)


def update_readme(text):
    with open(README) as f:
        doc = f.read()
    pat = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pat.search(doc):
        raise SystemExit(f"{README} has no {BEGIN} ... {END} block")
    doc = pat.sub(lambda _m: BEGIN + "\n" + text + "\n" + END, doc)
    with open(README, "w") as f:
        f.write(doc)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100000,200000", help="comma-separated segment counts (default 100000,200000)")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per command, median reported (default 5)")
    ap.add_argument("--segments-per-partition", type=int, default=25, help="K (default 25)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--python",
        default=shutil.which("python3") or sys.executable,
        help="interpreter for the probe (default python3; a launcher such as a pyenv shim is resolved to the "
        "interpreter it starts)",
    )
    ap.add_argument("--tmpdir", default=None, help="where to generate the trees (default: the system temp dir)")
    ap.add_argument("--no-readme", action="store_true", help="do not update the results block of bench/README.md")
    args = ap.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(",") if s.strip())
    for tool in ("find", "xargs", "tail", "sh"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found")
    # the interpreter itself: a launcher (a pyenv shim is a shell script) would add its own start-up to every run
    executable, py_version = (
        subprocess.check_output([args.python, "-c", "import sys; print(sys.executable); print(sys.version.split()[0])"])
        .decode()
        .splitlines()
    )
    args.python = executable or args.python
    _rc, baseline_rss, _ = run_rss(args.python, [PROBE, "--help"], subprocess.DEVNULL)
    startup = median([run_timed([args.python, "-c", "pass"])[0] for _ in range(5)])
    load_before = os.getloadavg()[0]
    workdir = tempfile.mkdtemp(prefix="probe-bench-", dir=args.tmpdir)
    fs = fs_type(os.path.realpath(workdir))
    started = time.perf_counter()
    rows = []
    try:
        for size in sizes:
            sys.stderr.write(f"tree of {size} segments in {workdir}\n")
            rows.append(bench_one(size, args, args.python, workdir))
    finally:
        t0 = time.perf_counter()
        shutil.rmtree(workdir, ignore_errors=True)
        sys.stderr.write(f"removed {workdir} in {time.perf_counter() - t0:.1f} s\n")
    env = (
        f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, Python {py_version} ({args.python}), "
        f"{platform.platform()}, trees on {fs}, {args.repeat} runs per command (median), "
        f"K={args.segments_per_partition} segments per partition, load average {load_before:.1f} before and "
        f"{os.getloadavg()[0]:.1f} after (other jobs on the machine slow all three commands)"
    )
    text = table(rows, baseline_rss, startup)
    verdicts = [
        f"{r['segments']}: probe/floor2 = {r['r2']:.2f}x ({'ok' if r['r2'] <= TARGET else 'OVER'})" for r in rows
    ]
    if len(rows) > 1:
        lo, hi = rows[0], rows[-1]
        verdicts.append(
            f"max RSS {lo['segments']} -> {hi['segments']} segments: writer "
            f"{lo['rss_kib'] / 1024:.1f} -> {hi['rss_kib'] / 1024:.1f} MiB, worker "
            f"{lo['worker_rss_kib'] / 1024:.1f} -> {hi['worker_rss_kib'] / 1024:.1f} MiB"
        )
    summary = text + "\n\n" + env + ".\n\n" + "; ".join(verdicts) + "."
    sys.stdout.write(summary + "\n")
    sys.stderr.write(f"total bench time {time.perf_counter() - started:.0f} s\n")
    if not args.no_readme:
        update_readme(summary)
        sys.stderr.write(f"updated {README}\n")
    return 0 if all(r["r2"] <= TARGET for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
