"""The deployment's end-to-end proof on the fleet lab (docker/README.md, "End-to-end run"). Run by docker/e2e, which
has installed and started Docker and built the images:

1. a fleet of two lab clusters on the host: a ZooKeeper one (3 brokers, seed-004's topic-ID drift) and a KRaft one
   (3 combined nodes, the demo's KRaft incidents), both accepting the one SSH key the deployment mounts; an env
   file pointing the stack at them (a directory with one inventory per cluster);
2. the stack up (docker-compose), every container healthy, every socket its processes listen on bound to 127.0.0.1;
3. ``kafka_fleet_audit__lab`` and ``kafka_fleet_audit__lab-kraft`` triggered through the REST API: the scheduler runs
   both; the ZooKeeper cluster's stage tasks ran on both Celery workers (their task instances' hostnames), each
   run's ``detect`` ran on the Spark master with an executor on each spark-worker (the master's and the workers'
   JSON status: the application named after the run); each cluster's first audit (the schedule's latest interval,
   run once at start-up: docs/audit.md) is there too; the Kafka fleet page and its metrics list both clusters,
   audited, with their metadata modes and findings;
4. ``kafka_fleet_repair__lab`` triggered, approved through the HITL endpoint as the configured approver; afterwards
   every replica's topic ID equals ZooKeeper's, every partition has its full ISR, each broker restarted once, the
   controller last (read from the lab, not from Airflow); the fleet page's metrics show the repair lock free, as
   the repair left it;
5. a second audit with the scheduler and the worker running a task restarted mid-run: the run still succeeds, and
   the findings history holds each run once and each finding once per run;
6. ``down -v``: no container, volume or process of the project is left.

Prints each step with its time and a timing table at the end (``--timings FILE`` also writes it as JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DOCKER_DIR = Path(__file__).resolve().parent
REPO = DOCKER_DIR.parent
sys.path[:0] = [str(REPO / "lab"), str(REPO / "plugins")]

from fleet_doctor import deploy  # noqa: E402
from fleet_doctor.airflow_links import audit_dag, repair_dag  # noqa: E402
from fleet_doctor.layout import safe_run_id  # noqa: E402
from fleet_lab import fleet  # noqa: E402
from fleet_lab.airflow_stack import AirflowRest  # noqa: E402
from fleet_lab.demo import DEMO_KRAFT_INCIDENTS  # noqa: E402
from fleet_lab.fleet import LOOPBACK, descendants, listening_sockets, zk_json  # noqa: E402
from fleet_lab.fleet import broker_events as events  # noqa: E402
from fleet_lab.incidents import SCENARIOS, inject, run_scenario  # noqa: E402
from fleet_lab.zk_server import free_ports  # noqa: E402

DOCKER = "/usr/bin/docker"
PROJECT = "fleet-doctor-e2e"
AUDIT, REPAIR = audit_dag(fleet.DEFAULT_CLUSTER), repair_dag(fleet.DEFAULT_CLUSTER)  # the lab cluster's DAGs
KRAFT = f"{fleet.DEFAULT_CLUSTER}-kraft"  # the fleet's second cluster, a KRaft one
KRAFT_AUDIT = audit_dag(KRAFT)
SCENARIO, TOPIC = "seed-004", "payments"
APPROVER = "approver"
UID = 50000  # the image's user: it reads the mounted key and files
# the repair's pauses and polls, shortened as the live repair tests shorten them (the ISR timeout kept)
REPAIR_CONF = {"healthy_polls": 2, "poll_interval_s": 1, "pause_between_brokers_s": 0}
PORTS = (
    "POSTGRES_PORT",
    "REDIS_PORT",
    "AIRFLOW_API_PORT",
    "AIRFLOW_SCHEDULER_HEALTH_PORT",
    "SPARK_MASTER_PORT",
    "SPARK_MASTER_WEBUI_PORT",
    "SPARK_WORKER_1_PORT",
    "SPARK_WORKER_1_WEBUI_PORT",
    "SPARK_WORKER_2_PORT",
    "SPARK_WORKER_2_WEBUI_PORT",
)


class E2EError(RuntimeError):
    """A step did not do what the deployment promises (the message says what was seen)."""


T0 = time.monotonic()


def say(message: str) -> None:
    print(f"[e2e {time.monotonic() - T0:6.1f} s] {message}", flush=True)


def check(ok: bool, message: str) -> None:
    if not ok:
        raise E2EError(message)
    say(f"ok: {message}")


@contextlib.contextmanager
def timed(timings: dict[str, float], name: str) -> Iterator[None]:
    t = time.monotonic()
    yield
    timings[name] = round(time.monotonic() - t, 1)
    say(f"{name}: {timings[name]} s")


def owned_copy(src: Path, dst: Path, mode: int) -> Path:
    """A copy of ``src`` the containers' user can read (and nobody else, for ``mode`` 0o400)."""
    shutil.copyfile(src, dst)
    os.chown(dst, UID, 0)
    dst.chmod(mode)
    return dst


def kraft_lab(work: Path, key_from: fleet.LabState) -> fleet.LabState:
    """The fleet's KRaft cluster: 3 combined nodes with the demo's KRaft incidents, accepting ``key_from``'s SSH key
    as well as its own (a deployment mounts one key for every broker and controller: docker/README.md)."""
    state = fleet.up(work / "lab-kraft", brokers=3, metadata="kraft", cluster=KRAFT)
    for name, opts in DEMO_KRAFT_INCIDENTS:
        done = inject(state, name, **opts)
        say(f"{KRAFT}: injected {name} -> rule {done.rule}")
    pub = (key_from.path / "ssh" / "id_ed25519.pub").read_text().strip()
    with (state.path / "ssh" / "authorized_keys").open("a") as f:
        f.write(pub + "\n")
    return state


def inventory_dir(work: Path, states: list[fleet.LabState]) -> Path:
    """The fleet's inventories as the stack mounts them: one ``<cluster>.json`` per lab, readable by its user."""
    d = work / "inventory.d"
    d.mkdir(mode=0o755)
    for st in states:
        owned_copy(st.path / "inventory.json", d / f"{st.cluster}.json", 0o444)
    return d


def write_env(work: Path, states: list[fleet.LabState], tag: str) -> tuple[Path, dict[str, str], dict[str, str]]:
    """docker/.env.example with fresh secrets, free ports, the labs' inventories and the first lab's key (every lab
    accepts it); returns (file, values, passwords)."""
    state = states[0]
    values: dict[str, str] = {}
    for line in (DOCKER_DIR / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key] = value
    secrets_dir = work / "secrets"
    made = deploy.write_secrets(secrets_dir)  # as an operator makes them: python -m fleet_doctor.deploy secrets
    say(f"secret files made: {', '.join(made)}")
    passwords = {"admin": secrets.token_urlsafe(12), APPROVER: secrets.token_urlsafe(12)}
    pw_file = work / "airflow-passwords.json"
    pw_file.write_text(json.dumps(passwords))
    os.chown(pw_file, UID, 0)
    pw_file.chmod(0o400)
    values.update(
        {
            "FLEET_DOCTOR_IMAGE_TAG": tag,
            "FLEET_DOCTOR_SECRETS_DIR": str(secrets_dir),
            "AIRFLOW_USERS": f"admin:admin,{APPROVER}:op",
            "AIRFLOW_PASSWORDS_FILE": str(pw_file),
            "FLEET_DOCTOR_APPROVERS": APPROVER,
            "FLEET_DOCTOR_INVENTORY_PATH": str(inventory_dir(work, states)),
            "FLEET_DOCTOR_SSH_KEY_FILE": str(owned_copy(state.path / "ssh" / "id_ed25519", work / "id_key", 0o400)),
            # two task slots per worker: the four tasks after discover (3 stage, snapshot) must use both workers
            "WORKER_CONCURRENCY": "2",
            "TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
            **{name: str(port) for name, port in zip(PORTS, free_ports(len(PORTS)), strict=True)},
        }
    )
    env_file = work / "e2e.env"
    env_file.touch(mode=0o600)
    env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return env_file, values, passwords


class Stack:
    """docker-compose with this deployment's file, the e2e's project name and env file."""

    def __init__(self, env_file: Path) -> None:
        self.base = [
            "docker-compose",
            "--project-name",
            PROJECT,
            "--project-directory",
            str(DOCKER_DIR),
            "--env-file",
            str(env_file),
            "-f",
            str(DOCKER_DIR / "compose.yaml"),
        ]

    def run(self, *args: str, timeout: float = 900, check: bool = True) -> str:
        r = subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise E2EError(
                f"docker-compose {' '.join(args)} exited {r.returncode}:\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
            )
        return r.stdout

    def containers(self) -> dict[str, dict[str, Any]]:
        """Each service's container: its state, health, exit code and main PID (docker inspect)."""
        ids = docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}").split()
        if not ids:
            return {}
        out = {}
        for c in json.loads(docker("inspect", *ids)):
            service = c["Config"]["Labels"]["com.docker.compose.service"]
            st = c["State"]
            out[service] = {
                "id": c["Id"],
                "status": st["Status"],
                "health": (st.get("Health") or {}).get("Status"),
                "exit_code": st["ExitCode"],
                "pid": st["Pid"],
                "network_mode": c["HostConfig"]["NetworkMode"],
            }
        return out

    def wait_healthy(self, timeout: float = 600) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        waiting: dict[str, Any] = {}
        while time.monotonic() < deadline:
            cs = self.containers()
            init = cs.get("airflow-init", {})
            if init.get("status") == "exited" and init.get("exit_code") != 0:
                raise E2EError(f"airflow-init exited {init['exit_code']}:\n{self.logs('airflow-init')}")
            waiting = {
                s: c["health"] or c["status"]
                for s, c in cs.items()
                if s != "airflow-init" and not (c["status"] == "running" and c["health"] in (None, "healthy"))
            }
            if cs and not waiting and init.get("status") == "exited":
                return cs
            time.sleep(2)
        raise E2EError(f"not healthy within {timeout:.0f} s: {waiting}")

    def logs(self, service: str, tail: int = 60) -> str:
        return self.run("logs", "--no-color", "--tail", str(tail), service, check=False)


def docker(*args: str) -> str:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, check=True, timeout=120).stdout


class ComposeAirflow(AirflowRest):
    """The REST client, reading the scheduler's log through docker-compose (for wait_for_approval)."""

    def __init__(self, stack: Stack, base: str, passwords: dict[str, str]) -> None:
        super().__init__(base, passwords, ["admin", APPROVER])
        self.stack = stack

    def log_tail(self, name: str, n: int = 30) -> str:
        return self.stack.logs(name, n)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


# ---- the steps


def check_loopback_only(stack: Stack) -> None:
    cs = stack.containers()
    check(all(c["network_mode"] == "host" for c in cs.values()), f"all {len(cs)} containers use the host's network")
    pids = [p for c in cs.values() if c["pid"] for p in (c["pid"], *descendants(c["pid"]))]
    sockets = listening_sockets(pids)
    outside = {k: v for k, v in sockets.items() if k[0] not in LOOPBACK}
    check(not outside and bool(sockets), f"{len(sockets)} listening sockets of the stack, every one on 127.0.0.1")


def check_secrets_kept(stack: Stack, secrets_dir: Path) -> None:
    """Issue 28 item 12: no secret's value in any container's environment or command line (docker inspect, and
    every process's /proc environ and cmdline), and a Celery worker holds only the Redis and Spark secrets."""
    values = {p.name: p.read_text().strip() for p in secrets_dir.iterdir()}
    cs = stack.containers()
    inspected = json.loads(docker("inspect", *[c["id"] for c in cs.values()]))
    leaks = [
        (c["Config"]["Labels"]["com.docker.compose.service"], name)
        for c in inspected
        for name, value in values.items()
        if value in json.dumps([c["Config"].get("Env"), c["Config"].get("Cmd"), c["Args"]])
    ]
    for service, c in cs.items():
        for pid in (c["pid"], *descendants(c["pid"])) if c["pid"] else ():
            for what in ("environ", "cmdline"):
                with contextlib.suppress(OSError):
                    text = Path(f"/proc/{pid}/{what}").read_bytes().decode(errors="replace")
                    leaks += [
                        (f"{service} pid {pid} {what}", n)
                        for n, v in values.items()
                        if v in text  # Spark's daemons and executors take theirs from the environment, by design
                        and not (n == "spark_secret" and what == "environ" and service.startswith("spark-"))
                    ]
    check(leaks == [], f"no secret in any container's environment or command line ({leaks})")
    held = stack.run("exec", "-T", "worker-1", "ls", "/run/secrets").split()
    check(held == ["redis_password", "spark_secret"], f"worker-1 holds only the secrets its role needs: {held}")


def check_no_bridge_traffic() -> None:
    networks = docker("network", "ls", "--filter", f"label=com.docker.compose.project={PROJECT}", "-q").split()
    check(networks == [], "compose created no network (no bridge, no private-range address)")


def audit(af: ComposeAirflow, timings: dict[str, float], name: str, dags: tuple[str, ...] = (AUDIT,)) -> list[str]:
    """Each of ``dags`` triggered at once, then every run waited for: their run ids."""
    with timed(timings, name):
        runs = [af.trigger(dag) for dag in dags]
        states = [af.wait_run(dag, run, timeout=900) for dag, run in zip(dags, runs, strict=True)]
    for dag, run, state in zip(dags, runs, states, strict=True):
        check(state == "success", f"{dag} run {run} {state}: {af.task_states(dag, run)}")
    return runs


def check_spread(af: ComposeAirflow, run: str) -> None:
    tis = af.task_instances(AUDIT, run)
    stage = {t["map_index"]: t["hostname"] for t in tis if t["task_id"] == "stage"}
    detect = [t["hostname"] for t in tis if t["task_id"] == "detect"]
    say(f"stage task instances by worker: {stage}; detect's driver ran on {detect}")
    check(len(stage) == 3, "3 stage task instances, one per broker")
    check(set(stage.values()) == {"worker-1", "worker-2"}, "the stage tasks ran on both Celery workers")
    others = {t["hostname"] for t in tis}
    check(others <= {"worker-1", "worker-2"}, f"every task ran on a Celery worker ({sorted(others)})")


def check_first_audit(af: ComposeAirflow) -> None:
    """The deployment's first audit (docs/audit.md, "The first audit"): unpaused at creation with catchup off, each
    cluster's audit DAG runs its schedule's latest interval once, at start-up."""
    for dag in (AUDIT, KRAFT_AUDIT):
        scheduled = [r["dag_run_id"] for r in af.runs(dag) if r["run_type"] == "scheduled"]
        check(len(scheduled) == 1, f"the deployment's first audit: one scheduled run of {dag} ({scheduled})")


def fleet_get(af: ComposeAirflow, path: str) -> str:
    bearer = {"Authorization": f"Bearer {af.token()}"}
    with urllib.request.urlopen(
        urllib.request.Request(f"{af.base}/kafka-fleet/{path}", headers=bearer), timeout=30
    ) as r:
        return str(r.read().decode())


def metrics(af: ComposeAirflow) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The fleet's metrics, parsed by Prometheus' own parser: name -> {labels: value}."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(fleet_get(af, "metrics")):
        for x in family.samples:
            out.setdefault(x.name, {})[tuple(sorted(x.labels.items()))] = x.value
    return out


def check_fleet_page(af: ComposeAirflow) -> None:
    """The Kafka fleet page and its metrics, served by the api-server from the inventories it mounts: both clusters,
    audited, with their metadata modes and their findings (docs/fleet.md)."""
    page = fleet_get(af, "")
    for cluster in (fleet.DEFAULT_CLUSTER, KRAFT):
        row = f"data-testid='cluster-row' data-cluster='{cluster}' data-state='ok'"
        check(row in page, f"the fleet page lists cluster {cluster}, audited")
    m = metrics(af)
    up = {dict(k)["cluster"]: v for k, v in m["kafka_fleet_store_up"].items()}
    check(up == {fleet.DEFAULT_CLUSTER: 1, KRAFT: 1}, f"the metrics read both clusters' stores ({up})")
    modes = {dict(k)["cluster"]: dict(k)["metadata_mode"] for k in m["kafka_fleet_cluster_info"]}
    check(modes == {fleet.DEFAULT_CLUSTER: "zookeeper", KRAFT: "kraft"}, f"one ZooKeeper, one KRaft cluster ({modes})")
    rules: dict[str, set[str]] = {}
    for k in m.get("kafka_fleet_findings", {}):
        rules.setdefault(dict(k)["cluster"], set()).add(dict(k)["rule"])
    check(
        "topic-id-mismatch" in rules.get(fleet.DEFAULT_CLUSTER, set()), f"{fleet.DEFAULT_CLUSTER}'s findings: {rules}"
    )
    check({"stray-replica", "topic-id-mismatch"} <= rules.get(KRAFT, set()), f"{KRAFT}'s findings: {rules}")


def check_lock_shown(af: ComposeAirflow) -> None:
    """After the repair: the fleet page's view of the lab cluster's repair lock is free, as the repair left it."""
    held = {dict(k)["cluster"]: v for k, v in metrics(af).get("kafka_fleet_repair_lock_held", {}).items()}
    check(held.get(fleet.DEFAULT_CLUSTER) == 0, f"the metrics show {fleet.DEFAULT_CLUSTER}'s repair lock free ({held})")


def check_detect_on_spark(values: dict[str, str], run: str) -> None:
    """The audit run ``run``'s detection ran on the Spark master, with an executor on each worker. Told apart from
    any other run's (the first audit's, which may start before or after ``run`` was triggered) by its application
    name: the detection app names itself after its audit run (spark_apps/detect.py)."""
    master = get_json(f"http://127.0.0.1:{values['SPARK_MASTER_WEBUI_PORT']}/json/")
    name = f"fleet-doctor-detect-{safe_run_id(run)}"
    apps = [a for a in master["completedapps"] if a["name"] == name]
    seen = [(a["name"], a["state"], a["starttime"]) for a in master["completedapps"] + master["activeapps"]]
    check(len(apps) == 1 and apps[0]["state"] == "FINISHED", f"{name} ran on the Spark master: {apps} (all: {seen})")
    app = apps[0]["id"]
    ran_on = []
    for n in (1, 2):
        worker = get_json(f"http://127.0.0.1:{values[f'SPARK_WORKER_{n}_WEBUI_PORT']}/json/")
        if any(e["appid"] == app for e in worker["finishedexecutors"] + worker["executors"]):
            ran_on.append(f"spark-worker-{n}")
    check(ran_on == ["spark-worker-1", "spark-worker-2"], f"application {app} had an executor on {ran_on}")


def repair(af: ComposeAirflow, state: fleet.LabState, timings: dict[str, float]) -> None:
    from fleet_lab.fleet import partition_topic_ids, wait_healthy

    zk_topic_id = zk_json(state, f"/brokers/topics/{TOPIC}")["topic_id"]
    controller = zk_json(state, "/controller")["brokerid"]
    before = {b: len(es) for b, es in events(state).items()}
    with timed(timings, "repair"):
        run = af.trigger(REPAIR, {**REPAIR_CONF, "rules": ["topic-id-mismatch"]})
        request = af.wait_for_approval(REPAIR, run, "approve")
        say(f"approval requested: {request['subject']}")
        option = af.approve(REPAIR, run, "approve", user=APPROVER)
        say(f"{APPROVER} chose {option!r}")
        result = af.wait_run(REPAIR, run, timeout=900)
    check(result == "success", f"{REPAIR} run {run} {result}: {af.task_states(REPAIR, run)}")
    detail = af.hitl_detail(REPAIR, run, "approve")
    check(detail["responded_by_user"]["id"] == APPROVER, f"approved by {detail['responded_by_user']}")
    starts = {b: [e["ts"] for e in es[before[b] :] if e["event"] == "running"] for b, es in events(state).items()}
    check({b: len(v) for b, v in starts.items()} == {1: 1, 2: 1, 3: 1}, "each broker restarted once")
    order = sorted(starts, key=lambda b: starts[b][0])
    check(order[-1] == controller, f"restart order {order}: the controller ({controller}) last")
    wait_healthy(state, timeout=60)
    ids = {k: v for k, v in partition_topic_ids(state).items() if k[1] == TOPIC}
    check(bool(ids) and set(ids.values()) == {zk_topic_id}, f"every {TOPIC} replica holds ZooKeeper's topic ID")
    assigned = zk_json(state, f"/brokers/topics/{TOPIC}")["partitions"]
    for p, replicas in assigned.items():
        st = zk_json(state, f"/brokers/topics/{TOPIC}/partitions/{p}/state")
        if sorted(st["isr"]) != sorted(replicas):
            raise E2EError(f"{TOPIC}-{p}: ISR {st['isr']}, replicas {replicas}")
    say(f"ok: every {TOPIC} partition has its full ISR ({len(assigned)} partitions)")


def audit_through_restarts(af: ComposeAirflow, stack: Stack, timings: dict[str, float]) -> str:
    """A second audit; once one of its tasks runs on a worker, that worker and the scheduler are restarted."""
    with timed(timings, "audit with restarts"):
        run = af.trigger(AUDIT)
        deadline = time.monotonic() + 600
        running: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not running:
            running = [
                t
                for t in af.task_instances(AUDIT, run)
                if t["state"] == "running" and t["task_id"] in ("stage", "snapshot_metadata", "detect")
            ]
            time.sleep(0.5)
        if not running:
            raise E2EError(f"no stage/detect task of {run} ran within 600 s")
        worker = running[0]["hostname"]
        say(f"{running[0]['task_id']} runs on {worker}: restarting the scheduler and {worker}")
        stack.run("restart", "scheduler", worker)
        state = af.wait_run(AUDIT, run, timeout=1200)
    check(state == "success", f"{AUDIT} run {run} {state} after the restarts: {af.task_states(AUDIT, run)}")
    tries = {f"{t['task_id']}[{t['map_index']}]": t["try_number"] for t in af.task_instances(AUDIT, run)}
    say(f"tries per task: {tries}")
    return run


def check_history(stack: Stack, runs: list[str]) -> None:
    """The findings history, read from the data volume through a container of the stack."""
    out = stack.run(
        "exec",
        "-T",
        "worker-2",
        "python",
        "-c",
        "import json; from fleet_doctor import layout; from fleet_doctor.store import Store; "
        "from fleet_doctor.audit.history import finding_key; "
        f"s = layout.cluster_store(Store('/opt/fleet-doctor/data'), {fleet.DEFAULT_CLUSTER!r}); "
        "runs = [r['audit_run'] for r in s.read_jsonl(layout.HISTORY_RUNS)]; "
        "f = {r: [finding_key(x) for x in s.read_jsonl(layout.history_findings(r))] for r in runs}; "
        "print(json.dumps([runs, f]))",
    )
    history_runs, findings = json.loads(out.strip().splitlines()[-1])
    check(sorted(history_runs) == sorted(set(history_runs)), f"each audit run once in the history ({history_runs})")
    for r in runs:
        ours = [h for h in history_runs if h in (r, safe_run_id(r))]
        check(len(ours) == 1, f"audit run {r} is in the history once")
    for r, ids in findings.items():
        check(len(ids) == len(set(ids)), f"audit run {r}: {len(ids)} findings, none twice")


def check_down(stack: Stack) -> None:
    stack.run("down", "-v", "--remove-orphans")
    left = docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}").split()
    volumes = docker("volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}").split()
    check(left == [] and volumes == [], f"down -v left no container ({left}) and no volume ({volumes})")
    ps = subprocess.run(["ps", "-eo", "uid=,args="], capture_output=True, text=True, check=True).stdout
    ours = [line for line in ps.splitlines() if line.split()[0] == str(UID)]
    check(ours == [], f"no process of the containers' user is left ({ours[:3]})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tag", default=os.environ.get("FLEET_DOCTOR_IMAGE_TAG", "latest"), help="the images' tag")
    p.add_argument("--timings", type=Path, help="also write the timings here (JSON)")
    p.add_argument("--keep", action="store_true", help="leave the stack and the lab up (then: docker-compose down -v)")
    args = p.parse_args(argv)
    timings: dict[str, float] = json.loads(os.environ.get("FLEET_DOCTOR_E2E_TIMINGS") or "{}")
    work = Path(tempfile.mkdtemp(prefix="fleet-doctor-e2e-", dir="/var/tmp"))
    work.chmod(0o755)
    lab_dir = work / "lab"
    stack: Stack | None = None
    ok = False
    try:
        version = SCENARIOS[SCENARIO][0]
        say(f"fleet lab: 3 brokers, Kafka {version}, {SCENARIO} in {lab_dir}")
        state = fleet.up(lab_dir, brokers=3, kafka_version=version)
        for step in run_scenario(state, SCENARIO):
            if not step.ok:
                raise E2EError(f"{SCENARIO}: {step.step}: not as reported")
        say(f"and a KRaft lab: 3 combined nodes, Kafka {fleet.DEFAULT_KRAFT_VERSION}, cluster {KRAFT}")
        kraft = kraft_lab(work, state)
        env_file, values, passwords = write_env(work, [state, kraft], args.tag)
        stack = Stack(env_file)
        with timed(timings, "stack up to healthy"):
            stack.run("up", "-d")
            stack.wait_healthy()
        check_loopback_only(stack)
        check_no_bridge_traffic()
        check_secrets_kept(stack, work / "secrets")
        af = ComposeAirflow(stack, f"http://127.0.0.1:{values['AIRFLOW_API_PORT']}", passwords)
        first, first_kraft = audit(af, timings, "audit (2 clusters)", (AUDIT, KRAFT_AUDIT))
        check_spread(af, first)
        check_detect_on_spark(values, first)
        check_detect_on_spark(values, first_kraft)
        check_first_audit(af)
        check_fleet_page(af)
        repair(af, state, timings)
        check_lock_shown(af)
        second = audit_through_restarts(af, stack, timings)
        check_history(stack, [first, second])
        ok = True
    except E2EError as e:
        say(f"FAILED: {e}")
        if stack is not None:
            for service in ("scheduler", "worker-1", "worker-2", "airflow-init"):
                print(f"--- {service}\n{stack.logs(service, 40)}", flush=True)
    finally:
        if args.keep:
            say(f"kept: the stack (project {PROJECT}, env {work / 'e2e.env'}) and the lab ({lab_dir})")
        else:
            if stack is not None:
                with timed(timings, "down -v"):
                    try:
                        check_down(stack)
                    except E2EError as e:
                        say(f"FAILED: {e}")
                        ok = False
            for d in (lab_dir, work / "lab-kraft"):
                if fleet.is_up(d):
                    fleet.down(d)
            shutil.rmtree(work, ignore_errors=True)
    print("\n| step | seconds |\n|---|---|")
    for name, seconds in timings.items():
        print(f"| {name} | {seconds} |")
    if args.timings:
        args.timings.write_text(json.dumps(timings, indent=2) + "\n")
    say("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
