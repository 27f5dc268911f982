"""The audit DAG on a 20-broker fleet lab, on a live Airflow: how long the staging phase takes against the biggest
broker staged alone, and where the whole audit's time goes.

    .venv/bin/python bench/audit_bench.py [--brokers 20] [--repeat 2] [--pool-slots N] [--no-readme]

Setup: `fleet-lab up --brokers N` (real sshd per broker, ZooKeeper, lab brokers), then Airflow's api-server,
scheduler and dag-processor as processes (LocalExecutor, SQLite), the pool at the product's default size unless
`--pool-slots`. Each round runs, through the REST API:

* the whole audit (`kafka_fleet_audit`, every broker): its staging phase is the time from the first mapped
  `stage` task's start to the last one's end (task instance dates from Airflow's API);
* the same DAG for only the broker with the most to stage (`{"brokers": [id]}`, the DAG's own param): its one
  `stage` task's duration is the baseline.

Target (issue 5): staging phase <= 1.5x the baseline. Busy CPU time of the whole machine (from /proc/stat,
sampled every 0.3 s) is reported for both windows: on this machine the lab's brokers, their sshd and probes share
the CPUs with Airflow, which a real fleet's brokers do not. Rewrites the audit block of bench/README.md unless
--no-readme; exit 1 over target.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / d) for d in ("plugins", "lab", "tests")]

from readme_block import write_block  # noqa: E402

from fleet_doctor.layout import safe_run_id  # noqa: E402
from fleet_doctor.settings import Settings  # noqa: E402
from fleet_lab import demo, fleet  # noqa: E402
from fleet_lab.airflow_stack import LiveAirflow  # noqa: E402
from fleet_lab.broker import running_pid  # noqa: E402

AUDIT = "kafka_fleet_audit__lab"  # the lab cluster's
TARGET = 1.5
BEGIN, END = "<!-- audit-bench:begin -->", "<!-- audit-bench:end -->"
PHASES = ("discover", "stage", "snapshot_metadata", "broker_facts", "detect", "publish", "alert")  # the DAG's tasks
CLK_TCK = os.sysconf("SC_CLK_TCK")


def process_cpu() -> dict[int, tuple[int, float]]:
    """pid -> (ppid, CPU seconds of the process and of its children it has reaped), from /proc/<pid>/stat."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[int(d)] = (int(fields[1]), sum(map(int, fields[11:15])) / CLK_TCK)
    return out


def tree_cpu(table: dict[int, tuple[int, float]], roots: list[int]) -> float:
    """CPU seconds of the roots, their live descendants and every child they reaped (forked task runners, probes
    run by sshd: their time lands in the parent's cutime when they exit)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [r for r in roots if r in table]
    while todo:
        pid = todo.pop()
        total += table[pid][1]
        todo += children.get(pid, [])
    return total


class CpuSampler(threading.Thread):
    """Every 0.3 s: monotonic time, busy CPU seconds of the whole machine (/proc/stat) and CPU seconds of each
    component's process tree (set ``components`` to name -> root pids)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float, dict[str, float]]] = []
        self.components: dict[str, list[int]] = {}
        self.stop = threading.Event()

    @staticmethod
    def busy() -> float:
        with open("/proc/stat") as f:
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
        return (user + nice + system + irq + softirq + steal) / CLK_TCK

    def run(self) -> None:
        while not self.stop.is_set():
            table = process_cpu() if self.components else {}
            per = {name: tree_cpu(table, roots) for name, roots in dict(self.components).items()}
            self.samples.append((time.monotonic(), self.busy(), per))
            self.stop.wait(0.3)

    def at(self, t: float) -> tuple[float, float, dict[str, float]]:
        return min(self.samples, key=lambda s: abs(s[0] - t))

    def between(self, t0: float, t1: float) -> tuple[float, dict[str, float]]:
        """Busy CPU seconds of the machine, and of each component, between two monotonic times."""
        (_, b0, c0), (_, b1, c1) = self.at(t0), self.at(t1)
        return b1 - b0, {k: c1[k] - c0.get(k, 0.0) for k in c1}


def ts(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def run_audit(af: LiveAirflow, conf: dict[str, Any] | None = None) -> tuple[str, list[dict[str, Any]]]:
    run = af.trigger(AUDIT, conf or {})
    state = af.wait_run(AUDIT, run, timeout=1800)
    tis = af.task_instances(AUDIT, run)
    if state != "success":
        raise SystemExit(f"audit run {run} ended {state}: {[(t['task_id'], t['map_index'], t['state']) for t in tis]}")
    return run, tis


def window(tis: list[dict[str, Any]], task_id: str) -> tuple[float, float]:
    mine = [t for t in tis if t["task_id"] == task_id]
    return min(ts(t["start_date"]) for t in mine), max(ts(t["end_date"]) for t in mine)


def wall_to_mono(wall: float) -> float:
    return time.monotonic() - (time.time() - wall)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--brokers", type=int, default=20)
    p.add_argument("--repeat", type=int, default=2, help="rounds (whole audit + baseline); medians reported")
    p.add_argument("--pool-slots", type=int, default=None, help="default: the product's default pool size")
    p.add_argument("--no-readme", action="store_true")
    p.add_argument("--tmpdir", default=None)
    args = p.parse_args()
    slots = args.pool_slots or Settings.from_env().pool_slots
    cpu = CpuSampler()
    cpu.start()
    load_before = os.getloadavg()
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="audit-bench-", dir=args.tmpdir) as tmp:
        root = Path(tmp)
        lab_dir, home, data = root / "lab", root / "airflow", root / "data"
        t0 = time.monotonic()
        state = fleet.up(lab_dir, brokers=args.brokers)
        lab_up_s = time.monotonic() - t0
        try:
            env = demo.airflow_environ(home, lab_dir, data)
            env["FLEET_DOCTOR_AUDIT_SCHEDULE"] = "0 2 1 1 *"  # no nightly run of its own during the bench
            env["AIRFLOW__CORE__PARALLELISM"] = str(max(slots, int(env.get("AIRFLOW__CORE__PARALLELISM", "4"))))
            env["FLEET_DOCTOR_AUDIT_POOL_SLOTS"] = str(slots)  # the pool prepare() creates, and the DAG's cap
            demo.prepare(env)
            with LiveAirflow(env) as af:
                cpu.components = {
                    "Airflow scheduler, its LocalExecutor workers and task runners": [af.procs["scheduler"].pid],
                    "Airflow api-server (the tasks' execution API)": [af.procs["api-server"].pid],
                    "Airflow dag-processor": [af.procs["dag-processor"].pid],
                    "brokers' sshd and the probes they run": [b.sshd_pid for b in state.brokers if b.sshd_pid],
                    "lab broker daemons and ZooKeeper": [
                        pid for pid in [state.zk_pid, *(running_pid(b.config()) for b in state.brokers)] if pid
                    ],
                }
                af.wait_dag(AUDIT)
                while any(r["state"] not in ("success", "failed") for r in af.runs(AUDIT)):
                    time.sleep(2)  # the run the scheduler creates at unpause: let it finish first
                for i in range(args.repeat):
                    run, tis = run_audit(af)
                    sizes = {
                        int(d.name.split("=")[1]): sum(f.stat().st_size for f in d.iterdir())  # JSON + Parquet
                        for d in (Path(data) / "staging" / safe_run_id(run) / "probe").iterdir()
                    }
                    biggest = max(sizes, key=lambda b: (sizes[b], -b))
                    s0, s1 = window(tis, "stage")
                    r0 = min(ts(t["start_date"]) for t in tis)
                    r1 = max(ts(t["end_date"]) for t in tis)
                    phases = {}
                    for task in PHASES:
                        a, b = window(tis, task)
                        phases[task] = b - a
                    _, btis = run_audit(af, {"brokers": [biggest]})
                    b0, b1 = window(btis, "stage")
                    stage_cpu, stage_parts = cpu.between(wall_to_mono(s0), wall_to_mono(s1))
                    base_cpu, base_parts = cpu.between(wall_to_mono(b0), wall_to_mono(b1))
                    rounds.append(
                        {
                            "stage_phase": s1 - s0,
                            "stage_cpu": stage_cpu,
                            "stage_parts": stage_parts,
                            "baseline": b1 - b0,
                            "baseline_cpu": base_cpu,
                            "baseline_parts": base_parts,
                            "biggest": biggest,
                            "stage_tasks": sum(1 for t in tis if t["task_id"] == "stage"),
                            "audit_wall": r1 - r0,
                            "phases": phases,
                        }
                    )
                    print(f"round {i + 1}: {rounds[-1]}", flush=True)
        finally:
            fleet.down(lab_dir)
    cpu.stop.set()
    med = {
        k: statistics.median(r[k] for r in rounds)
        for k in ("stage_phase", "stage_cpu", "baseline", "baseline_cpu", "audit_wall")
    }
    ratio = med["stage_phase"] / med["baseline"]
    ncpu = os.cpu_count() or 1
    verdict = "ok" if ratio <= TARGET else "OVER"

    def each(key: str) -> str:
        return ", ".join(f"{r[key]:.1f}" for r in rounds)

    phase_med = {t: statistics.median(r["phases"][t] for r in rounds) for t in PHASES}
    lines = [
        BEGIN,
        "| brokers | pool slots | staging phase (all mapped `stage` tasks) | biggest broker staged alone | ratio | "
        "machine CPU busy: phase, alone | target |",
        "|---:|---:|---:|---:|---:|---:|---|",
        f"| {args.brokers} | {slots} | {med['stage_phase']:.1f} s "
        f"({each('stage_phase')}) | {med['baseline']:.1f} s "
        f"({each('baseline')}; broker {rounds[-1]['biggest']}) | **{ratio:.2f}x** "
        f"| {med['stage_cpu']:.1f} CPU-s ({med['stage_cpu'] / med['stage_phase'] / ncpu:.0%} of {ncpu} CPUs), "
        f"{med['baseline_cpu']:.1f} CPU-s | <= {TARGET}x: **{verdict}** |",
        "",
        "Where the CPU went (CPU seconds of each process tree; the staging phase's per stage task, and the "
        "baseline's one task):",
        "",
        "| process tree | staging phase, per stage task | one broker alone |",
        "|---|---:|---:|",
        *(
            f"| {name} | {statistics.median(r['stage_parts'][name] for r in rounds) / rounds[0]['stage_tasks']:.2f} "
            f"CPU-s | {statistics.median(r['baseline_parts'][name] for r in rounds):.2f} CPU-s |"
            for name in rounds[0]["stage_parts"]
        ),
        "",
        "Whole audit, task by task (median wall time of each task; `stage` is the phase above; the rest of the "
        f"run's {med['audit_wall']:.0f} s is the scheduler's hand-over between tasks):",
        "",
        "| " + " | ".join(PHASES) + " | whole run |",
        "|" + "---:|" * (len(PHASES) + 1),
        "| " + " | ".join(f"{phase_med[t]:.1f} s" for t in PHASES) + f" | {med['audit_wall']:.1f} s |",
        "",
        f"{time.strftime('%Y-%m-%d')}, {ncpu} CPUs, Python {platform.python_version()}, Airflow LocalExecutor "
        f"(parallelism {max(slots, 4)}), SQLite; `fleet-lab up --brokers {args.brokers}` took {lab_up_s:.0f} s; "
        f"{len(rounds)} round(s), medians; load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after.",
        END,
    ]
    block = "\n".join(lines)
    print(block)
    if not args.no_readme:
        write_block(BEGIN, END, block, "# Audit staging\n\n")
    return 0 if verdict == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
