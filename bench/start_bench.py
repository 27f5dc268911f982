"""Detection in seconds (issue 19): `fleet-doctor scan` of small log dirs and the audit DAG's `detect` task on the
3-broker fleet lab, each against the floor of any Spark app, measured side by side in one run.

    .venv/bin/python bench/start_bench.py [--repeat 5] [--audits 3] [--no-lab] [--no-readme]

* floor: `spark-submit bench/spark_floor.py` (start a session, read one small Parquet file, write one row) with the
  Spark settings a short local run had before this issue (``fleet_doctor.spark.LOCAL_SPARK_CONF``: the `local`
  profile and the C1 JIT), on `local[*]` as `scan` runs;
* floor with the class archive: the same with the driver's class-data sharing archive the product maps
  (``fleet_doctor.spark.class_archive``): what start-up alone gains from it, for reference;
* scan: `bin/fleet-doctor scan ... --format json` of corpus samples (probe, stage, spark-submit of the detection app
  with the settings chosen for the input's size, the report); also the first sample with
  `FLEET_DOCTOR_SPARK_CLASS_ARCHIVE=off`, to show what the archive is worth;
* detect task: the `detect` task of `kafka_fleet_audit` (its task instance's start to end, from Airflow's API) on a
  live Airflow (api-server, scheduler, dag-processor, LocalExecutor, SQLite) over a 3-broker lab with the demo's
  incidents; a floor run follows every audit.

Commands are interleaved, each once to warm up, then `--repeat` times; medians (and min-max) are reported. Targets:
scan <= 1.5x the floor, detect task <= 2x the floor. Rewrites the block of bench/README.md unless --no-readme;
exit 1 over a target.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / d) for d in ("plugins", "lab", "tests")]

from readme_block import write_block  # noqa: E402

from fleet_doctor import spark  # noqa: E402
from fleet_doctor.cli.scan import prepare_class_archive  # noqa: E402
from harness.corpus import CORPUS  # noqa: E402

BEGIN, END = "<!-- start-bench:begin -->", "<!-- start-bench:end -->"
SCAN_TARGET, DETECT_TARGET = 1.5, 2.0
FLEET_DOCTOR = REPO / "bin" / "fleet-doctor"
MASTER = "local[*]"  # scan's default
THILLAI_ZK = "zookeeper/version-2"  # its snapshots sit one level deeper (MANIFEST.md)
# (label, scan arguments relative to the corpus, Kafka version)
SAMPLES = [
    ("zk-3.1-single-aryan", ["kafka-logs", "--zk-snapshot-file", "zookeeper"], "3.1.0"),
    ("zk-3.9-3broker-thillai", [*(f"kafka-logs-{i}" for i in range(3)), "--zk-snapshot-file", THILLAI_ZK], "3.9.0"),
    ("kraft-3.5-3broker-greenlemon", ["kafka1", "kafka2", "kafka3"], "3.5.1"),
]


def timed(cmd: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    took = time.monotonic() - t0
    if proc.returncode not in ok:
        raise SystemExit(f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return took


class Floor:
    """The floor app's spark-submit, plain or with the product's class archive."""

    def __init__(self, tmp: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.input, self.output = tmp / "floor-in.parquet", tmp / "floor-out"
        pq.write_table(pa.table({"n": [1, 2, 3]}), self.input)
        self.env = spark.spark_env()

    def command(self, archive: bool) -> list[str]:
        conf = dict(spark.LOCAL_SPARK_CONF)
        if archive:
            conf = spark.class_archive(MASTER).conf(conf)
        args = ["--input", str(self.input), "--output", str(self.output)]
        return spark.submit_command(REPO / "bench" / "spark_floor.py", MASTER, conf, args)

    def run(self, archive: bool = False) -> float:
        return timed(self.command(archive), self.env)


def scan_command(sample: str, args: list[str], version: str) -> list[str]:
    paths = [a if a.startswith("--") else str(CORPUS / sample / a) for a in args]
    return [str(FLEET_DOCTOR), "scan", *paths, "--kafka-version", version, "--format", "json"]


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def measure_scans(floor: Floor, repeat: int) -> dict[str, list[float]]:
    env = dict(os.environ)
    off = {**env, spark.CLASS_ARCHIVE_ENV: "off"}
    jobs: list[tuple[str, Any]] = [
        ("floor", lambda: floor.run()),
        ("floor with the class archive", lambda: floor.run(archive=True)),
    ]
    for sample, args, version in SAMPLES:
        cmd = scan_command(sample, args, version)
        jobs.append((f"scan {sample}", lambda cmd=cmd: timed(cmd, env, ok=(0, 1))))
    first = scan_command(*SAMPLES[0])
    jobs.append((f"scan {SAMPLES[0][0]}, no class archive", lambda: timed(first, off, ok=(0, 1))))
    times: dict[str, list[float]] = {name: [] for name, _ in jobs}
    for _name, job in jobs:  # warm-up (page cache, the library archive)
        job()
    for i in range(repeat):
        for name, job in jobs:
            times[name].append(job())
        print(f"round {i + 1}: " + ", ".join(f"{n} {t[-1]:.1f} s" for n, t in times.items()), flush=True)
    return times


def measure_detect_task(floor: Floor, audits: int, tmp: Path) -> dict[str, Any]:
    from audit_bench import AUDIT, run_audit, window

    from fleet_lab import demo, fleet
    from fleet_lab.airflow_stack import LiveAirflow
    from fleet_lab.incidents import inject

    lab_dir, home, data = tmp / "lab", tmp / "airflow", tmp / "data"
    state = fleet.up(lab_dir, brokers=3)
    detect, audit_wall, floors = [], [], []
    try:
        for name, opts in demo.DEMO_INCIDENTS:
            inject(state, name, **opts)
        env = demo.airflow_environ(home, lab_dir, data)
        env["FLEET_DOCTOR_AUDIT_SCHEDULE"] = "0 2 1 1 *"  # no nightly run of its own during the bench
        demo.prepare(env)
        with LiveAirflow(env) as af:
            af.wait_dag(AUDIT)
            while any(r["state"] not in ("success", "failed") for r in af.runs(AUDIT)):
                time.sleep(1)  # the run the scheduler creates at unpause: it is the warm-up
            for i in range(audits):
                _, tis = run_audit(af)
                d0, d1 = window(tis, "detect")
                a0, _ = window(tis, "discover")
                _, a1 = window(tis, "alert")
                detect.append(d1 - d0)
                audit_wall.append(a1 - a0)
                floors.append(floor.run())
                print(
                    f"audit {i + 1}: detect {detect[-1]:.1f} s, whole run {audit_wall[-1]:.1f} s, "
                    f"floor {floors[-1]:.1f} s",
                    flush=True,
                )
    finally:
        fleet.down(lab_dir)
    return {"detect": detect, "audit": audit_wall, "floor": floors}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--audits", type=int, default=3)
    p.add_argument("--no-lab", action="store_true", help="skip the audit's detect task")
    p.add_argument("--no-readme", action="store_true")
    p.add_argument("--tmpdir", default=None)
    args = p.parse_args()
    if spark.class_archive(MASTER).dumping:
        print("dumping the class archive first (bin/dev setup does this)", flush=True)
        prepare_class_archive(MASTER)
    load = [os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="start-bench-", dir=args.tmpdir) as tmp:
        floor = Floor(Path(tmp))
        scans = measure_scans(floor, args.repeat)
        load.append(os.getloadavg())
        lab = None if args.no_lab else measure_detect_task(floor, args.audits, Path(tmp))
        load.append(os.getloadavg())
    floor_s = summary(scans["floor"])["median"]
    rows, over = [], []
    for name, xs in scans.items():
        s = summary(xs)
        ratio = s["median"] / floor_s
        target = SCAN_TARGET if name.startswith("scan") and "no class archive" not in name else None
        verdict = "" if target is None else (f"<= {target}x: **ok**" if ratio <= target else f"<= {target}x: **OVER**")
        if target is not None and ratio > target:
            over.append(name)
        rows.append(f"| {name} | {s['median']:.2f} s ({s['min']:.2f}-{s['max']:.2f}) | {ratio:.2f}x | {verdict} |")
    if lab is not None:
        d, f = summary(lab["detect"]), summary(lab["floor"])
        ratio = d["median"] / f["median"]
        verdict = f"<= {DETECT_TARGET}x: **{'ok' if ratio <= DETECT_TARGET else 'OVER'}**"
        if ratio > DETECT_TARGET:
            over.append("detect task")
        rows.append(
            f"| audit's `detect` task, 3-broker lab (floor beside it: {f['median']:.2f} s) "
            f"| {d['median']:.2f} s ({d['min']:.2f}-{d['max']:.2f}) | {ratio:.2f}x | {verdict} |"
        )
        a = summary(lab["audit"])
        rows.append(f"| whole audit run, 3-broker lab | {a['median']:.2f} s ({a['min']:.2f}-{a['max']:.2f}) | | |")
    loads = " -> ".join(" ".join(f"{x:.2f}" for x in la) for la in load)
    block = "\n".join(
        [
            BEGIN,
            "| command | wall time: median (min-max) | / floor | target |",
            "|---|---:|---:|---|",
            *rows,
            "",
            f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, master {MASTER}, Python {platform.python_version()}, "
            f"{args.repeat} runs per command (median; the audits: {args.audits}), load average (1/5/15 min) before, "
            f"after the scans, after the audits: {loads}.",
            "",
            "Commands (the floor's, then a scan's):",
            "",
            "    " + " ".join(floor.command(archive=False)),
            "    " + " ".join(scan_command(*SAMPLES[0])),
            END,
        ]
    )
    print(block)
    if not args.no_readme:
        write_block(BEGIN, END, block, "# Detection in seconds\n\n")
    print(json.dumps({"over": over}))
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
