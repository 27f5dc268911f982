"""How long `bin/fleet-lab up` takes to a healthy cluster, against starting its ZooKeeper alone.

    .venv/bin/python bench/lab_bench.py [--brokers 3] [--repeat 3] [--no-readme]

Each round: `fleet-lab up --brokers N` (returns once every broker is registered, a controller is elected and every
partition has a live leader and its full ISR), then `fleet-lab down`; the baseline is a ZooKeeper 3.8 server of
the same configuration started until it serves and stopped. Medians are reported; the target (issue 4) is
`up` < 15 s for 3 brokers. Rewrites the lab block of bench/README.md unless --no-readme; exit 1 over target.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / d) for d in ("plugins", "lab")]

from readme_block import write_block  # noqa: E402

from fleet_lab.fleet import ZK_TICK_MS  # noqa: E402
from fleet_lab.zk_server import ZooKeeperServer  # noqa: E402

TARGET_S = 15.0
BEGIN, END = "<!-- lab-bench:begin -->", "<!-- lab-bench:end -->"


def time_zookeeper(base: Path) -> float:
    t0 = time.monotonic()
    zk = ZooKeeperServer(base, tick_time_ms=ZK_TICK_MS).start()
    elapsed = time.monotonic() - t0
    zk.stop()
    return elapsed


def time_lab(base: Path, brokers: int) -> float:
    t0 = time.monotonic()
    subprocess.run(
        [str(REPO / "bin" / "fleet-lab"), "up", "--dir", str(base), "--brokers", str(brokers)],
        check=True,
        capture_output=True,
    )
    elapsed = time.monotonic() - t0
    subprocess.run([str(REPO / "bin" / "fleet-lab"), "down", "--dir", str(base)], check=True, capture_output=True)
    return elapsed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--brokers", type=int, default=3)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-readme", action="store_true")
    args = p.parse_args()
    load_before = os.getloadavg()[0]
    zk_times, lab_times = [], []
    with tempfile.TemporaryDirectory(prefix="lab-bench-") as tmp:
        for i in range(args.repeat):  # interleaved, so a busy moment hits both
            zk_times.append(time_zookeeper(Path(tmp) / f"zk{i}"))
            lab_times.append(time_lab(Path(tmp) / f"lab{i}", args.brokers))
    zk_s, lab_s = statistics.median(zk_times), statistics.median(lab_times)
    verdict = "ok" if lab_s < TARGET_S else "OVER"
    block = "\n".join(
        [
            BEGIN,
            "| brokers | ZooKeeper alone (baseline) | `fleet-lab up` to healthy (min-max) | up / baseline | target |",
            "|---:|---:|---:|---:|---|",
            f"| {args.brokers} | {zk_s:.2f} s | {lab_s:.2f} s ({min(lab_times):.2f}-{max(lab_times):.2f}) "
            f"| {lab_s / zk_s:.1f}x | < {TARGET_S:.0f} s: **{verdict}** |",
            "",
            f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"{args.repeat} runs (median), load average {load_before:.1f} before and {os.getloadavg()[0]:.1f} after.",
            END,
        ]
    )
    print(block)
    if not args.no_readme:
        write_block(
            BEGIN,
            END,
            block,
            "# Fleet lab start-up\n\n`bin/fleet-lab up` must be ready in under 15 s for 3 brokers (issue 4). "
            "Reproduce: `.venv/bin/python bench/lab_bench.py` (about a minute).\n\n",
        )
    return 0 if verdict == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
