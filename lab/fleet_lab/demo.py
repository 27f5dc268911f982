"""The embedded default: Airflow (SQLite) + the fleet lab + Spark local, for the demo and the end-to-end tests.

    python -m fleet_lab.demo demo|env|audit [--home DIR] [--lab DIR] [--data DIR]

``demo`` brings up a 3-broker lab, injects incidents on different brokers, runs the audit DAG once with
``airflow dags test`` and prints the summary and where the report is. ``airflow_environ()`` is the process
environment every ``airflow`` command here runs with: its own AIRFLOW_HOME, the repo's dags/ and plugins/,
SQLite, the lab's SSH and ZooKeeper connections, ``spark_default`` on ``local[2]``, the audit settings.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fleet_doctor.settings import Settings

REPO = Path(__file__).resolve().parents[2]
AUDIT_DAG = "kafka_fleet_audit"
DEMO_INCIDENTS: list[tuple[str, dict[str, Any]]] = [
    # (incident, options): spread over the brokers, every one a different rule
    ("old-client-add-partitions", {"topic": "payments", "partitions": 5}),
    ("controller-failover", {}),  # mints a new topic ID for payments: the old replicas now mismatch
    ("index-orphan", {"broker": 1, "topic": "orders", "partition": 0}),
    ("segment-leftover", {"broker": 2, "topic": "clickstream"}),
    ("log-torn-tail", {"broker": 1, "topic": "clickstream"}),
    ("stray-dir", {"broker": 2, "topic": "orders"}),
    ("kill9-untrimmed-index", {"broker": 3}),
]


def airflow_environ(home: Path, lab_dir: Path, data: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(base if base is not None else os.environ)
    venv_bin = str(Path(sys.executable).parent)
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(
                {"conn_type": "spark", "host": "local[2]", "extra": {"deploy-mode": "client"}}
            ),
            "FLEET_DOCTOR_INVENTORY": str(lab_dir / "inventory.json"),
            "FLEET_DOCTOR_DATA": str(data),
            "PYTHONPATH": str(REPO / "plugins") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
            "PATH": venv_bin + os.pathsep + env.get("PATH", "/usr/bin:/bin"),
        }
    )
    conns = lab_dir / "airflow-connections.json"
    if conns.is_file():
        for cid, c in json.loads(conns.read_text()).items():
            env[f"AIRFLOW_CONN_{cid.upper()}"] = json.dumps(c)
    return env


def airflow(
    env: dict[str, str], *args: str, timeout: float = 900, check: bool = True
) -> subprocess.CompletedProcess[str]:
    exe = str(Path(sys.executable).parent / "airflow")
    r = subprocess.run([exe, *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"airflow {' '.join(args)} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def prepare(env: dict[str, str]) -> None:
    """Create or upgrade the metadata DB and the audit's pool, named and sized by the audit settings in ``env``
    (FLEET_DOCTOR_AUDIT_POOL, FLEET_DOCTOR_AUDIT_POOL_SLOTS); idempotent."""
    settings = Settings.from_env(env)
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    airflow(env, "db", "migrate")
    airflow(env, "pools", "set", settings.pool, str(settings.pool_slots), "Fleet Doctor: concurrent broker probes")


def run_audit(
    env: dict[str, str], run_date: str | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    args = ["dags", "test", AUDIT_DAG]
    if run_date:
        args.append(run_date)
    return airflow(env, *args, timeout=timeout, check=False)


def latest_summary(data: str | Path, environ: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The summary of the newest audit run in the data store ``data`` (a path or store URL), None if none."""
    from fleet_doctor.store import Store

    store = Store(data, environ)
    runs = store.read_jsonl("history/runs.jsonl")
    if not runs:
        return None
    return store.read_json(f"reports/{runs[-1]['audit_run']}.json")


def demo(home: Path, lab_dir: Path, data: Path, keep_lab: bool = False) -> int:
    from fleet_lab import fleet

    t0 = time.monotonic()
    if fleet.is_up(lab_dir):
        fleet.down(lab_dir)
    print(f"[demo] bringing up the fleet lab (3 brokers, Kafka {fleet.DEFAULT_VERSION}) in {lab_dir}", flush=True)
    state = fleet.up(lab_dir, brokers=3)
    try:
        return _demo_audit(state, home, lab_dir, data, t0)
    finally:
        if not keep_lab:
            fleet.down(lab_dir)
            print(f"[demo] fleet lab stopped (keep it up with --keep-lab; then: bin/fleet-lab status --dir {lab_dir})")


def _demo_audit(state: Any, home: Path, lab_dir: Path, data: Path, t0: float) -> int:
    from fleet_lab.incidents import inject

    for name, opts in DEMO_INCIDENTS:
        done = inject(state, name, **opts)
        where = ", ".join(
            f"{k} {v}"
            for k, v in (("broker", done.broker_id), ("topic", done.topic), ("partition", done.partition))
            if v is not None
        )
        print(f"[demo] injected {name} ({where}) -> rule {done.rule}", flush=True)
    env = airflow_environ(home, lab_dir, data)
    print(f"[demo] Airflow home {home} (SQLite); running the {AUDIT_DAG} DAG with `airflow dags test`", flush=True)
    prepare(env)
    r = run_audit(env)
    summary = latest_summary(data)
    if r.returncode != 0 or summary is None:
        print(r.stdout[-4000:], r.stderr[-4000:], sep="\n", file=sys.stderr)
        print("[demo] the audit DAG failed", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    print(f"[demo] report: {summary['report']}")
    print(f"[demo] done in {time.monotonic() - t0:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m fleet_lab.demo", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "command",
        choices=["demo", "env", "audit"],
        help="demo: lab + incidents + one audit; env: print the environment as shell exports; "
        "audit: one audit run of the lab at --lab",
    )
    p.add_argument("--home", default=str(REPO / ".fleet-doctor" / "airflow"))
    p.add_argument("--lab", default=str(REPO / ".lab"))
    p.add_argument("--data", default=str(REPO / ".fleet-doctor" / "data"))
    p.add_argument("--keep-lab", action="store_true", help="demo: leave the fleet lab running afterwards")
    args = p.parse_args(argv)
    home, lab_dir, data = Path(args.home).resolve(), Path(args.lab).resolve(), Path(args.data).resolve()
    if args.command == "demo":
        return demo(home, lab_dir, data, keep_lab=args.keep_lab)
    env = airflow_environ(home, lab_dir, data)
    if args.command == "env":
        for k, v in sorted(env.items()):
            if k.startswith(("AIRFLOW", "FLEET_DOCTOR")) or k in ("PYTHONPATH", "PATH"):
                print(f"export {k}={shlex.quote(v)}")
        return 0
    prepare(env)
    r = run_audit(env)
    summary = latest_summary(data)
    if r.returncode != 0 or summary is None:
        print(r.stdout[-4000:], r.stderr[-4000:], sep="\n", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
