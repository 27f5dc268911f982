#!/usr/bin/env python3
"""A fleet of clusters in one deployment (docs/fleet.md): what grows with the number of clusters.

    .venv/bin/python bench/fleet_bench.py               # 50 clusters, updates bench/README.md
    .venv/bin/python bench/fleet_bench.py --clusters 10 --no-readme

Cases:

    DAG files        each of the three DAG files parsed as Airflow's DagBag parses it, with FLEET_DOCTOR_INVENTORY a
                     directory of N inventories of 20 brokers each, against the same file with one inventory (the
                     baseline, in the same run): the parse a dag-processor repeats every refresh, after Airflow and
                     the library are imported (what its pre-import gives it), and a cold process's whole time
    fleet overview   GET /kafka-fleet/ (the FastAPI app, through its TestClient) with N clusters of 30 published
                     audit runs each (the real publisher, 20 findings a run) and its repair lock as last seen, against
                     one such cluster; a cluster's page of the same store; and GET /kafka-fleet/metrics of both
                     fleets

Targets (issue 29): a DAG file with 50 inventories of 20 brokers parsed in under 2 s (Airflow's default import
timeout is 30 s); the overview of 50 clusters x 30 runs served in under 500 ms, the metrics likewise.
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
sys.path[:0] = [str(REPO / "plugins"), str(REPO / "lab"), str(REPO / "tests"), str(REPO / "bench")]

from readme_block import write_block  # noqa: E402

from harness import inventories  # noqa: E402

BEGIN, END = "<!-- fleet-bench:begin -->", "<!-- fleet-bench:end -->"
PARSE_TARGET_S, PAGE_TARGET_S = 2.0, 0.5
DAG_FILES = ("kafka_fleet_audit", "kafka_fleet_repair", "kafka_fleet_restore")
# one process: Airflow and the library imported first, then each DAG file parsed REPEAT times; prints JSON seconds
PARSE = """
import json, os, sys, time
sys.path.insert(0, {plugins!r})
t0 = time.perf_counter()
from airflow.dag_processing.dagbag import DagBag
import fleet_doctor.audit.detect_task, fleet_doctor.repair.hitl, fleet_doctor.fleet_dags, fleet_doctor.repair.tasks
imports = time.perf_counter() - t0
out = {{"imports": imports}}
for name in {files!r}:
    times = []
    for _ in range({repeat}):
        t = time.perf_counter()
        bag = DagBag(dag_folder=os.path.join({dags!r}, name + ".py"))
        times.append(time.perf_counter() - t)
        assert not bag.import_errors, bag.import_errors
    out[name] = {{"best": min(times), "median": sorted(times)[len(times) // 2], "dags": len(bag.dags)}}
print(json.dumps(out))
"""


def fleet_dir(root: Path, clusters: int, brokers: int) -> Path:
    return inventories.fleet_dir(
        root, *(inventories.inventory(f"prod-{i:03d}", brokers=brokers, kraft=i % 2 == 1) for i in range(clusters))
    )


def parse_times(inventory: Path, home: Path, repeat: int) -> dict[str, Any]:
    code = PARSE.format(plugins=str(REPO / "plugins"), files=DAG_FILES, repeat=repeat, dags=str(REPO / "dags"))
    env = {**os.environ, "AIRFLOW_HOME": str(home), "FLEET_DOCTOR_INVENTORY": str(inventory)}
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(r.stderr[-3000:])
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["process"] = wall
    return out


def publish_runs(settings: Any, cluster: str, runs: int, findings: int) -> None:
    """``runs`` audit runs of ``cluster`` published by the real publisher, ``findings`` findings each (a few move
    from run to run: new, persisting and resolved ones)."""
    from fleet_doctor import layout, lock_state
    from fleet_doctor.audit import history
    from harness.findings import finding

    for n in range(runs):
        run = f"scheduled__2026-10-{n + 1:02d}T02:00:00+00:00"
        rows = []
        for i in range(findings):
            rule, sev = ("index-untrimmed", "warning") if i % 3 else ("topic-id-mismatch", "critical")
            topic = f"t{(i + n) % (findings + 5)}"
            f = finding(rule, 1 + i % 3, f"/var/lib/kafka/{topic}-0/00000000000000000000.index", sev)
            f["topic"] = topic
            rows.append(f)
        area = layout.staging(run)
        settings.store.write_jsonl(area.findings_json, rows)
        settings.store.write_text(area.summary, json.dumps({"rules_skipped": {}}))
        discovered = {"cluster": cluster, "only_in_inventory": [], "only_in_zookeeper": []}
        history.publish(settings, run, discovered, {"audited": [1, 2, 3], "not_audited": []})
    # the repair lock as the audit saw it: one more object the page and the metrics read per cluster
    lock_state.record(settings.store, lock_state.LockState(False, time.time(), "audit"))


def page_times(settings: Any, path: str, repeat: int) -> dict[str, float]:
    from fastapi.testclient import TestClient

    from fleet_doctor.console.app import create_app

    client = TestClient(create_app(lambda: settings))
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        r = client.get(path)
        times.append(time.perf_counter() - t)
        assert r.status_code == 200, r.text[:300]
    return {"best": min(times), "median": statistics.median(times), "bytes": len(r.content)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clusters", type=int, default=50)
    p.add_argument("--brokers", type=int, default=20)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--no-readme", action="store_true")
    args = p.parse_args()
    from fleet_doctor.settings import Settings

    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        root = Path(tmp)
        one, many = fleet_dir(root / "one", 1, args.brokers), fleet_dir(root / "many", args.clusters, args.brokers)
        parse_one = parse_times(one, root / "af1", args.repeat)
        parse_many = parse_times(many, root / "afn", args.repeat)
        print(json.dumps({"one": parse_one, "many": parse_many}, indent=1), flush=True)

        t = time.perf_counter()
        base = {"FLEET_DOCTOR_DATA": str(root / "data-one"), "FLEET_DOCTOR_INVENTORY": str(one)}
        s_one = Settings.from_env(base)
        publish_runs(s_one.for_cluster("prod-000"), "prod-000", args.runs, 20)
        s_many = Settings.from_env({"FLEET_DOCTOR_DATA": str(root / "data-many"), "FLEET_DOCTOR_INVENTORY": str(many)})
        for i in range(args.clusters):
            name = f"prod-{i:03d}"
            publish_runs(s_many.for_cluster(name), name, args.runs, 20)
        published = time.perf_counter() - t
        page_one = page_times(s_one, "/", args.repeat)
        page_many = page_times(s_many, "/", args.repeat)
        cluster_page = page_times(s_many, f"/clusters/prod-{(args.clusters - 1) // 2:03d}/", args.repeat)
        metrics_one = page_times(s_one, "/metrics", args.repeat)
        metrics_many = page_times(s_many, "/metrics", args.repeat)
        print(json.dumps({"one": page_one, "many": page_many, "cluster": cluster_page}, indent=1), flush=True)

    worst_parse = max(parse_many[f]["median"] for f in DAG_FILES)
    rows = [
        f"| case | 1 cluster (baseline) | {args.clusters} clusters | ratio | target |",
        "|---|---:|---:|---:|---|",
    ]
    for f in DAG_FILES:
        a, b = parse_one[f]["median"], parse_many[f]["median"]
        ok = "**ok**" if b < PARSE_TARGET_S else "**missed**"
        rows.append(
            f"| parse `dags/{f}.py` ({parse_many[f]['dags']} DAGs; {args.brokers} brokers each) | {a * 1000:.0f} ms | "
            f"{b * 1000:.0f} ms | {b / a:.1f} | < {PARSE_TARGET_S:.0f} s: {ok} |"
        )
    cold_one, cold_many = parse_one["process"], parse_many["process"]
    rows.append(
        f"| a cold process: Airflow and the library imported, the three files parsed {args.repeat} times each | "
        f"{cold_one:.1f} s | {cold_many:.1f} s | {cold_many / cold_one:.1f} | |"
    )
    a, b = page_one["median"], page_many["median"]
    ok = "**ok**" if b < PAGE_TARGET_S else "**missed**"
    rows.append(
        f"| `GET /kafka-fleet/` ({args.runs} runs each, {page_many['bytes'] // 1024} KiB) | {a * 1000:.0f} ms | "
        f"{b * 1000:.0f} ms | {b / a:.1f} | < {PAGE_TARGET_S * 1000:.0f} ms: {ok} |"
    )
    rows.append(
        f"| `GET /kafka-fleet/clusters/<cluster>/` in that fleet | | {cluster_page['median'] * 1000:.0f} ms | | |"
    )
    a, b = metrics_one["median"], metrics_many["median"]
    ok = "**ok**" if b < PAGE_TARGET_S else "**missed**"
    rows.append(
        f"| `GET /kafka-fleet/metrics` ({metrics_many['bytes'] // 1024} KiB) | {a * 1000:.0f} ms | {b * 1000:.0f} ms | "
        f"{b / a:.1f} | < {PAGE_TARGET_S * 1000:.0f} ms: {ok} |"
    )
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    block = "\n".join(
        [
            BEGIN,
            *rows,
            "",
            f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, Python {platform.python_version()}; medians of "
            f"{args.repeat}; {args.clusters} x {args.runs} runs published in {published:.0f} s; load average after: "
            f"{load}.",
            END,
        ]
    )
    print(block)
    if not args.no_readme:
        section = (
            "# A fleet of clusters\n\nWhat grows with the number of clusters in one deployment "
            "(`bench/fleet_bench.py`; its docstring says what each case is). Reproduce (about two minutes):\n\n"
            "    .venv/bin/python bench/fleet_bench.py\n\n"
        )
        write_block(BEGIN, END, block, section)
    pages_ok = max(page_many["median"], metrics_many["median"]) < PAGE_TARGET_S
    return 0 if worst_parse < PARSE_TARGET_S and pages_ok else 1


if __name__ == "__main__":
    sys.exit(main())
