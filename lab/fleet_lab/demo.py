"""The embedded default: Airflow (SQLite) + the fleet lab + Spark local, for the demo and the end-to-end tests.

    python -m fleet_lab.demo demo|env|audit [--home DIR] [--lab DIR] [--data DIR]
    python -m fleet_lab.demo ui [--scenario demo|seed-004|seed-000] [--metadata both|zookeeper|kraft] [--no-kraft]
        [--port N] [--home DIR] [--lab DIR] [--data DIR]

``demo`` brings up a fleet of two 3-broker labs (ZooKeeper and KRaft), injects incidents on different brokers, runs
each cluster's audit DAG once with ``airflow dags test`` and prints the summaries and where the reports are. ``ui``
(``bin/dev ui``) brings up the same fleet (the ZooKeeper lab with a seed report's scenario, or the demo's incidents;
``--metadata zookeeper`` or ``--no-kraft``: that lab alone; ``--metadata kraft``: the KRaft lab alone), a live
Airflow on 127.0.0.1 (api-server, scheduler, dag-processor, triggerer), has the scheduler audit each cluster once,
prints the URL, the user and where the password is, and stays up until Ctrl-C (SIGINT or SIGTERM), then stops every
process it started. ``airflow_environ()`` is the process
environment every ``airflow`` command here runs with: its own AIRFLOW_HOME, the repo's dags/ and plugins/,
SQLite, the lab's SSH and ZooKeeper connections, ``spark_default`` on ``local[2]``, the audit settings.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from fleet_doctor import layout
from fleet_doctor.airflow_links import audit_dag, repair_dag
from fleet_doctor.settings import Settings
from fleet_doctor.store import Store
from fleet_lab.fleet import DEFAULT_CLUSTER

REPO = Path(__file__).resolve().parents[2]
# ui: a fixed port, so that a bookmark keeps working (8080 is often taken); FLEET_DOCTOR_UI_PORT or --port
UI_PORT = 28080
UI_SCENARIOS = ("demo", "seed-004", "seed-000")  # demo: DEMO_INCIDENTS; seed-*: fleet_lab.incidents.SCENARIOS
UI_DIR = REPO / ".fleet-doctor" / "ui"  # ui's own Airflow home and data store, started afresh by every `bin/dev ui`
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
DEMO_KRAFT_INCIDENTS: list[tuple[str, dict[str, Any]]] = [
    # the KRaft cluster's own: a 3.7 stray replica, a diverged quorum-state, a drifted topic ID, a bad index
    ("kraft-stray-replica", {"topic": "clickstream"}),
    ("quorum-state-divergent", {"broker": 3}),
    ("topic-id-mismatch", {"broker": 2, "topic": "payments"}),
    ("index-bad-size", {"broker": 1, "topic": "orders"}),
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


def lab_cluster(env: dict[str, str]) -> str:
    """The cluster of the one inventory ``env`` names (FLEET_DOCTOR_INVENTORY: the lab's)."""
    return Settings.from_env(env).load_inventory().cluster


def run_audit(
    env: dict[str, str], run_date: str | None = None, timeout: float = 900, cluster: str | None = None
) -> subprocess.CompletedProcess[str]:
    """A cluster's audit DAG (default: the one cluster of ``env``'s inventory), run with ``airflow dags test``."""
    args = ["dags", "test", audit_dag(cluster or lab_cluster(env))]
    if run_date:
        args.append(run_date)
    return airflow(env, *args, timeout=timeout, check=False)


def store_of(data: str | Path, environ: dict[str, str] | None = None, cluster: str = DEFAULT_CLUSTER) -> Store:
    """The cluster's store in the data root ``data`` (a path or store URL): ``clusters/<cluster>/``
    (``layout.cluster_store``)."""
    return layout.cluster_store(Store(data, environ), cluster)


def latest_summary(
    data: str | Path, environ: dict[str, str] | None = None, cluster: str | None = DEFAULT_CLUSTER
) -> dict[str, Any] | None:
    """The summary of the cluster's newest audit run in the data root ``data`` (a path or store URL; ``cluster``
    None: the data root's own history), None if none."""
    store = store_of(data, environ, cluster) if cluster else Store(data, environ)
    runs = store.read_jsonl(layout.HISTORY_RUNS)
    if not runs:
        return None
    return store.read_json(layout.report_json(runs[-1]["audit_run"]))


def kraft_lab_dir(lab_dir: Path) -> Path:
    """The demo's second lab, the KRaft cluster's: beside the first (``.lab`` -> ``.lab-kraft``)."""
    return lab_dir.with_name(f"{lab_dir.name}-kraft")


def demo(home: Path, lab_dir: Path, data: Path, keep_lab: bool = False) -> int:
    """Two lab clusters, a ZooKeeper one with ``DEMO_INCIDENTS`` and a KRaft one with ``DEMO_KRAFT_INCIDENTS``, one
    fleet (a directory of their two inventories), each cluster's audit DAG run once."""
    from fleet_lab import fleet

    t0 = time.monotonic()
    kraft_dir = kraft_lab_dir(lab_dir)
    for d in (lab_dir, kraft_dir):
        if fleet.is_up(d):
            fleet.down(d)
    print(f"[demo] bringing up the fleet lab (3 brokers, Kafka {fleet.DEFAULT_VERSION}, ZooKeeper) in {lab_dir}")
    print(f"[demo] and a KRaft lab (3 brokers, Kafka {fleet.DEFAULT_KRAFT_VERSION}) in {kraft_dir}", flush=True)
    started = []
    try:
        started.append(fleet.up(lab_dir, brokers=3))
        started.append(fleet.up(kraft_dir, brokers=3, metadata="kraft", cluster=f"{DEFAULT_CLUSTER}-kraft"))
        return _demo_audit(started, home, [lab_dir, kraft_dir], data, t0)
    finally:
        if not keep_lab:
            for state in started:
                fleet.down(state.dir)
            dirs = " and ".join(str(s.dir) for s in started)
            print(f"[demo] fleet labs stopped (keep them up with --keep-lab; then: bin/fleet-lab status --dir {dirs})")


def inject_demo_incidents(state: Any, tag: str = "demo") -> None:
    """The demo's incidents (``DEMO_INCIDENTS``), each said as it is injected."""
    from fleet_lab.incidents import inject

    for name, opts in DEMO_INCIDENTS:
        done = inject(state, name, **opts)
        where = ", ".join(
            f"{k} {v}"
            for k, v in (("broker", done.broker_id), ("topic", done.topic), ("partition", done.partition))
            if v is not None
        )
        print(f"[{tag}] injected {name} ({where}) -> rule {done.rule}", flush=True)


def fleet_environ(home: Path, lab_dirs: list[Path], data: Path, fleet_dir: Path) -> dict[str, str]:
    """``airflow_environ`` for a fleet of labs: ``FLEET_DOCTOR_INVENTORY`` a directory of their inventories (made in
    ``fleet_dir``, one link per lab, named after its cluster), every lab's Airflow connections."""
    fleet_dir.mkdir(parents=True, exist_ok=True)
    for old in fleet_dir.glob("*.json"):
        old.unlink()
    env = airflow_environ(home, lab_dirs[0], data)
    for d in lab_dirs:
        cluster = Settings.from_env({"FLEET_DOCTOR_INVENTORY": str(d / "inventory.json")}).load_inventory().cluster
        (fleet_dir / f"{cluster}.json").symlink_to(d / "inventory.json")
        for cid, c in json.loads((d / "airflow-connections.json").read_text()).items():
            env[f"AIRFLOW_CONN_{cid.upper()}"] = json.dumps(c)
    env["FLEET_DOCTOR_INVENTORY"] = str(fleet_dir)
    return env


def _demo_audit(states: list[Any], home: Path, lab_dirs: list[Path], data: Path, t0: float) -> int:
    from fleet_lab.incidents import inject

    zk, kraft = states
    inject_demo_incidents(zk)
    for name, opts in DEMO_KRAFT_INCIDENTS:
        done = inject(kraft, name, **opts)
        print(f"[demo] {kraft.cluster}: injected {name} -> rule {done.rule}", flush=True)
    env = fleet_environ(home, lab_dirs, data, home / "fleet")
    print(f"[demo] Airflow home {home} (SQLite); the fleet's inventories: {env['FLEET_DOCTOR_INVENTORY']}", flush=True)
    prepare(env)
    summaries = []
    for state in states:
        print(f"[demo] running the {audit_dag(state.cluster)} DAG with `airflow dags test`", flush=True)
        r = run_audit(env, cluster=state.cluster)
        summary = latest_summary(data, cluster=state.cluster)
        if r.returncode != 0 or summary is None:
            print(r.stdout[-4000:], r.stderr[-4000:], sep="\n", file=sys.stderr)
            print(f"[demo] the {audit_dag(state.cluster)} DAG failed", file=sys.stderr)
            return 1
        print(json.dumps(summary, indent=2), flush=True)
        summaries.append(summary)
    for summary in summaries:
        counts = ", ".join(f"{n} {sev}" for sev, n in summary["by_severity"].items())
        print(f"[demo] cluster {summary['cluster']} ({summary.get('metadata_mode')}): {counts}")
        print(f"[demo]   report: {summary['report']}")
    print(
        "[demo] the Kafka fleet page (every cluster, then each one's findings and repairs): `bin/dev ui`, then Kafka "
        "fleet in Airflow's nav; in a deployment, <airflow>/kafka-fleet/ (docs/fleet.md)"
    )
    print(f"[demo] done in {time.monotonic() - t0:.0f} s")
    return 0


def first_audit(af: Any, cluster: str = DEFAULT_CLUSTER, timeout: float = 900) -> tuple[str, str]:
    """One audit through the scheduler: the audit DAG is unpaused at creation, so the scheduler runs its latest
    nightly interval right away (what a fresh deployment does); when it has not within a minute, one is triggered.
    Returns the run id and its final state, once no other audit run is still going (a manual one and the nightly
    one may both run)."""
    from fleet_lab.airflow_stack import AirflowLiveError

    dag = audit_dag(cluster)
    af.wait_dag(dag)
    deadline = time.monotonic() + 60
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not runs:
        runs = af.runs(dag)
        if not runs:
            time.sleep(2)
    run = str(runs[0]["dag_run_id"]) if runs else af.trigger(dag)
    deadline = time.monotonic() + timeout
    state = af.wait_run(dag, run, timeout)
    while going := [r["dag_run_id"] for r in af.runs(dag) if r["state"] not in ("success", "failed")]:
        if time.monotonic() > deadline:
            raise AirflowLiveError(f"{dag} runs {going} still not finished after {timeout:.0f} s")
        time.sleep(2)
    return run, state


class _Stop(Exception):
    """SIGINT or SIGTERM: ``ui`` leaves what it is doing and stops everything it started."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop(signal.Signals(signum).name)


def _port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _start_afresh(home: Path, data: Path) -> None:
    """ui's own Airflow home and data store emptied (the lab is new, so is its history); the users' passwords kept."""
    from fleet_lab.airflow_stack import PASSWORDS

    if home.is_dir():
        for entry in home.iterdir():
            if entry.name != PASSWORDS:
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    if data.is_dir():
        shutil.rmtree(data)


def ui(
    home: Path,
    lab_dir: Path,
    data: Path,
    scenario: str = "demo",
    port: int = UI_PORT,
    password: str | None = None,
    afresh: bool = False,
    kraft: bool = True,
    zookeeper: bool = True,
) -> int:
    """``bin/dev ui``: a fleet of two lab clusters, the ZooKeeper lab (``zookeeper``) with ``scenario``'s incidents
    and (``kraft``) a KRaft lab beside it with ``DEMO_KRAFT_INCIDENTS``, a live Airflow on 127.0.0.1:``port`` with
    each cluster's first audit done, until SIGINT or SIGTERM; then every process it started is stopped (Airflow's by
    PID, then the labs'). ``password``: the first user's (else generated, in the simple auth manager's passwords
    file). ``afresh``: empty ``home`` and ``data`` first (ui's own default dirs)."""
    if not (kraft or zookeeper):
        print("[ui] neither lab cluster chosen", file=sys.stderr)
        return 2
    if scenario not in UI_SCENARIOS:
        print(f"[ui] unknown scenario {scenario!r}: one of {', '.join(UI_SCENARIOS)}", file=sys.stderr)
        return 2
    if _port_taken(port):
        print(
            f"[ui] 127.0.0.1:{port} is taken (another `bin/dev ui`?): choose another with --port or "
            "FLEET_DOCTOR_UI_PORT",
            file=sys.stderr,
        )
        return 2
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _ui(home, lab_dir, data, scenario, port, password, afresh, kraft, zookeeper)
    except _Stop as e:
        print(f"[ui] {e}: stopped", flush=True)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _ui(
    home: Path,
    lab_dir: Path,
    data: Path,
    scenario: str,
    port: int,
    password: str | None,
    afresh: bool,
    kraft: bool,
    zookeeper: bool = True,
) -> int:
    from fleet_lab import fleet
    from fleet_lab.airflow_stack import UI_COMPONENTS, AirflowLiveError, LiveAirflow
    from fleet_lab.incidents import SCENARIOS, inject, run_scenario

    t0 = time.monotonic()
    kraft_dir = kraft_lab_dir(lab_dir)
    for d in [*([lab_dir] if zookeeper else []), *([kraft_dir] if kraft else [])]:
        if fleet.is_up(d):  # someone's lab (a kept demo, another ui): not ours to stop
            print(
                f"[ui] a fleet lab is already up in {d}: stop it first (bin/fleet-lab down --dir {d}) or give --lab "
                "another directory",
                file=sys.stderr,
            )
            return 2
    if afresh:
        _start_afresh(home, data)
    version = SCENARIOS[scenario][0] if scenario in SCENARIOS else fleet.DEFAULT_VERSION
    started: list[Any] = []
    af: LiveAirflow | None = None
    try:
        if zookeeper:
            print(f"[ui] bringing up the fleet lab (3 brokers, Kafka {version}, ZooKeeper) in {lab_dir}", flush=True)
            started.append(fleet.up(lab_dir, brokers=3, kafka_version=version))
            if scenario == "demo":
                inject_demo_incidents(started[0], "ui")
            else:
                for step in run_scenario(started[0], scenario):
                    ok = "as reported" if step.ok else "NOT as reported"
                    print(f"[ui] {scenario}: {step.step}: {ok}", flush=True)
        if kraft:
            print(
                f"[ui] and a KRaft lab (3 combined nodes, Kafka {fleet.DEFAULT_KRAFT_VERSION}) in {kraft_dir}",
                flush=True,
            )
            started.append(fleet.up(kraft_dir, brokers=3, metadata="kraft", cluster=f"{DEFAULT_CLUSTER}-kraft"))
            for name, opts in DEMO_KRAFT_INCIDENTS:
                inject(started[-1], name, **opts)
        env = fleet_environ(home, [s.path for s in started], data, home / "fleet")
        prepare(env)
        user = (env.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS") or "admin:admin").split(",")[0].split(":")[0]
        af = LiveAirflow(env, port, UI_COMPONENTS, {user: password} if password else None)
        print(f"[ui] starting Airflow ({', '.join(UI_COMPONENTS)}) on {af.base}, home {home}", flush=True)
        try:
            af.start()
            dags = ", ".join(audit_dag(s.cluster) for s in started)
            print(f"[ui] Airflow is healthy; {dags} audit the labs (about a minute)", flush=True)
            audits = [(s.cluster, *first_audit(af, s.cluster)) for s in started]
        except AirflowLiveError as e:
            print(f"[ui] {e}\n[ui] logs: {home}/*.out", file=sys.stderr)
            return 1
        _say_ready(af, user, password is not None, audits, data, Path(started[0].path), time.monotonic() - t0)
        return _stay_up(af)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not cut the clean-up short
            signal.signal(sig, signal.SIG_IGN)
        print("[ui] stopping Airflow and the fleet labs", flush=True)
        if af is not None:
            af.stop()
        for s in started:
            fleet.down(s.dir)
        print("[ui] every process started is stopped", flush=True)


def _say_ready(
    af: Any, user: str, chosen: bool, audits: list[tuple[str, str, str]], data: Path, lab_dir: Path, took: float
) -> None:
    """Where the UI is, who logs in, each cluster's first audit ((cluster, run, state) in ``audits``, the lab's
    first) and what to click."""
    from fleet_doctor.settings import Settings

    approvers = Settings.from_env(af.env).approvers
    where = "FLEET_DOCTOR_UI_PASSWORD" if chosen else f"{af.passwords_file} (JSON: user -> password)"
    cluster = audits[0][0]
    lines = [f"Airflow UI: {af.base}/", f"  user:     {user}", f"  password: {where}"]
    for name, run, audit_state in audits:
        audit = f"cluster {name}: audit {run}: {audit_state}"
        summary = latest_summary(data, cluster=name) if audit_state == "success" else None
        if summary:
            audit += f"; report {summary['report']}"
        lines.append(f"  {audit}" + ("" if audit_state == "success" else " (open the run's task logs in the UI)"))
    lines += [
        "  approvals: "
        + (
            f"only {', '.join(approvers)} (FLEET_DOCTOR_APPROVERS), never on a run they triggered"
            if approvers
            else f"any signed-in user, {user} included, on runs they triggered too (FLEET_DOCTOR_APPROVERS unset)"
        ),
        "What to click:",
        f"  1. Kafka fleet (in the nav): the fleet, one row per cluster; {cluster} opens its latest audit's findings,",
        "     one row per broker, rule and cause",
        f"  2. Repair... on a group: the {repair_dag(cluster)} DAG's trigger form, pre-filled; Trigger starts the "
        "repair run",
        "  3. Browse -> Required Actions: open the request, read the plan (summary, hash, backups), click Approve",
        f"  4. the run's grid shows the repair progress; check the lab: bin/fleet-lab status --dir {lab_dir}",
        "Stop with Ctrl-C: stops Airflow and the fleet labs.",
    ]
    print("\n".join(f"[ui] {line}" for line in lines), flush=True)
    print(f"[ui] ready in {took:.0f} s: {af.base}/", flush=True)


def _stay_up(af: Any) -> int:
    """Until a signal (``_Stop``); 1 when an Airflow component exits on its own."""
    while True:
        for name, proc in af.procs.items():
            if proc.poll() is not None:
                print(f"[ui] airflow {name} exited {proc.returncode}:\n{af.log_tail(name)}", file=sys.stderr)
                return 1
        time.sleep(1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m fleet_lab.demo", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "command",
        choices=["demo", "env", "audit", "ui"],
        help="demo: lab + incidents + one audit; env: print the environment as shell exports; "
        "audit: one audit run of the lab at --lab; ui: lab + incidents + a live Airflow UI until Ctrl-C",
    )
    p.add_argument(
        "--home",
        help=f"Airflow home (default {REPO / '.fleet-doctor' / 'airflow'}; ui: {UI_DIR / 'airflow'}, emptied first)",
    )
    p.add_argument("--lab", default=str(REPO / ".lab"))
    p.add_argument(
        "--data", help=f"data store (default {REPO / '.fleet-doctor' / 'data'}; ui: {UI_DIR / 'data'}, emptied first)"
    )
    p.add_argument("--keep-lab", action="store_true", help="demo: leave the fleet lab running afterwards")
    p.add_argument("--scenario", choices=UI_SCENARIOS, default="demo", help="ui: the demo's incidents or a seed report")
    p.add_argument(
        "--no-kraft",
        action="store_true",
        help="ui: the ZooKeeper lab cluster only (by default a KRaft lab cluster runs beside it: a fleet of two)",
    )
    p.add_argument(
        "--metadata",
        choices=("both", "zookeeper", "kraft"),
        default="both",
        help="ui: which lab clusters: both (default), the ZooKeeper one (as --no-kraft), or the KRaft one alone "
        "(3 combined nodes with the demo's KRaft incidents: a repair to approve, refusals to read)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("FLEET_DOCTOR_UI_PORT") or UI_PORT),
        help=f"ui: the api-server's port on 127.0.0.1 (default $FLEET_DOCTOR_UI_PORT, else {UI_PORT})",
    )
    args = p.parse_args(argv)
    ui_cmd = args.command == "ui"
    home = Path(args.home or (UI_DIR / "airflow" if ui_cmd else REPO / ".fleet-doctor" / "airflow")).resolve()
    data = Path(args.data or (UI_DIR / "data" if ui_cmd else REPO / ".fleet-doctor" / "data")).resolve()
    lab_dir = Path(args.lab).resolve()
    if ui_cmd:
        password = os.environ.get("FLEET_DOCTOR_UI_PASSWORD") or None
        return ui(
            home,
            lab_dir,
            data,
            args.scenario,
            args.port,
            password,
            afresh=not (args.home or args.data),
            kraft=not args.no_kraft and args.metadata != "zookeeper",
            zookeeper=args.metadata != "kraft",
        )
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
    summary = latest_summary(data, cluster=lab_cluster(env))
    if r.returncode != 0 or summary is None:
        print(r.stdout[-4000:], r.stderr[-4000:], sep="\n", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
