"""The docker/ deployment, checked without Docker (CI has no engine): its files, and its Spark cluster run for real.

1. Policy: docker/compose.yaml, interpolated from docker/.env.example as docker-compose interpolates it, keeps these
   machines' rules and the design's (every service on the host's network, bound to 127.0.0.1, no published port; the
   services the issue asks for, healthchecks, start order; each worker named; no secret on a command line or in an
   image layer), and compose.yaml, .env.example, docker/build and docker/Dockerfile agree with one another. One test
   feeds a broken copy of the compose data to the same check to show it catches each breach.
2. The Spark standalone cluster exactly as compose runs it (spark-master, spark-worker-1, spark-worker-2: their
   ``command:`` and ``environment:`` from compose.yaml, on free ports), as local processes of this venv: the
   healthchecks compose runs say healthy (and unhealthy for a worker nobody serves), every socket the cluster listens
   on is loopback, no REST submission port, and the detection app submitted as the audit's ``detect`` task submits it
   for a ``spark://`` master gives the findings a local master gives, with an executor on each worker. The cluster
   authenticates (``spark.authenticate``, issue 28 item 14): the secret from a file, on no command line; an
   application without it, or with another, is refused by the master.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet_doctor import deploy, spark
from fleet_doctor.audit import detection
from fleet_doctor.cli.scan import stage_probe
from fleet_doctor.inventory import Inventory
from fleet_doctor.settings import Settings
from fleet_doctor.zookeeper.snapshot import read_snapshot_file
from fleet_lab.fleet import LOOPBACK, descendants, listening_sockets
from fleet_lab.zk_server import free_ports, pid_alive

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
COMPOSE = DOCKER / "compose.yaml"
ENV_EXAMPLE = DOCKER / ".env.example"
DOCKERFILE = DOCKER / "Dockerfile"
VENV_BIN = Path(sys.executable).parent

AIRFLOW_SERVICES = ("api-server", "scheduler", "dag-processor", "triggerer", "worker-1", "worker-2")
SPARK_WORKERS = ("spark-worker-1", "spark-worker-2")
SERVICES = ("postgres", "redis", "airflow-init", *AIRFLOW_SERVICES, "spark-master", *SPARK_WORKERS)
ONE_SHOT = {"airflow-init"}  # runs and exits 0: no healthcheck
SERVES_LOGS = ("scheduler", "triggerer", "worker-1", "worker-2")  # Airflow's log server binds every interface
HEALTHCHECK = "fleet-doctor-healthcheck"  # docker/healthcheck as the image installs it
REST_PORT = 6066  # the standalone master's REST submission server
# .env.example's variables compose.yaml does not read, with the reason (none today)
UNUSED_BY_COMPOSE: dict[str, str] = {}
ARYAN = "zk-3.1-single-aryan"
SECRET_ENV = "FLEET_DOCTOR_SPARK_SECRET_FILE"
SPARK_DAEMON = ["python", "-m", "fleet_doctor.spark_auth"]  # spark-class with the secret in its environment
SPARK_SECRET_MOUNT = "/run/secrets/spark_secret"


class ComposeError(ValueError):
    """compose.yaml or its env file cannot be read as docker-compose reads them (the message names file and place)."""


# ------------------------------------------------------------------------------------------- reading the files
def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as docker-compose 1.29 reads ``--env-file`` (comments and blank lines skipped)."""
    out: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key.strip()):
            raise ComposeError(f"{path}:{n}: not KEY=VALUE: {line!r}")
        out[key.strip()] = value
    return out


_TOKEN = re.compile(r"\$\$|\$\{([^}]*)\}|\$")


def interpolate(text: str, env: Mapping[str, str], where: str, used: set[str] | None = None) -> str:
    """``${VAR}`` (or ``${VAR:?message}``) from ``env`` and ``$$`` -> ``$``; anything else after a ``$`` (a bare
    ``$VAR``, a default, an unknown variable) is a ComposeError naming the variable and ``where``."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, required, message = (m.group(1) or "").partition(":?")  # ${VAR:?message}: VAR must be set
        if m.group(1) is None or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or (required and not message):
            raise ComposeError(f"{where}: write ${{VAR}} (or $$ for a literal $), not {text[m.start() :][:20]!r}")
        if name not in env:
            raise ComposeError(f"{where}: variable {name} is not defined in the env file")
        if used is not None:
            used.add(name)
        return env[name]

    return _TOKEN.sub(one, text)


def interpolated(node: Any, env: Mapping[str, str], where: str = "", used: set[str] | None = None) -> Any:
    """Every string of the parsed compose file interpolated (compose interpolates values, not keys)."""
    if isinstance(node, dict):
        return {k: interpolated(v, env, f"{where}.{k}" if where else str(k), used) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolated(v, env, f"{where}[{i}]", used) for i, v in enumerate(node)]
    if isinstance(node, str):
        return interpolate(node, env, f"{COMPOSE.name}: {where}", used)
    return node


def load_compose(env: Mapping[str, str], used: set[str] | None = None) -> dict[str, Any]:
    raw = yaml.safe_load(COMPOSE.read_text())
    if not isinstance(raw, dict) or not isinstance(raw.get("services"), dict):
        raise ComposeError(f"{COMPOSE}: no services: mapping")
    return interpolated(raw, env, "", used)


def secret_names(env: Mapping[str, str]) -> list[str]:
    """The env file's secrets: passwords, keys and secrets (a ``*_FILE`` or ``*_DIR`` names a host path, not a
    secret). None since issue 28 item 12: every secret is a file."""
    return [k for k in env if re.search(r"PASSWORD|SECRET|FERNET", k) and not k.endswith(("_FILE", "_DIR"))]


# issue 28 item 12: the secret files each service's role needs (docker/compose.yaml's table), at /run/secrets/<name>
ALL_SECRETS = frozenset(deploy.SECRET_FILES)
DB_FERNET = frozenset({"postgres_password", "fernet_key"})
ROLE_SECRETS: dict[str, frozenset[str]] = {
    "postgres": frozenset({"postgres_password"}),
    "redis": frozenset({"redis_password"}),
    "airflow-init": ALL_SECRETS,  # checks them all, then exits
    "api-server": DB_FERNET | {"jwt_secret", "api_secret_key"},
    "scheduler": DB_FERNET | {"jwt_secret", "redis_password"},
    "dag-processor": DB_FERNET,
    "triggerer": DB_FERNET,
    "worker-1": frozenset({"redis_password", "spark_secret"}),
    "worker-2": frozenset({"redis_password", "spark_secret"}),
    "spark-master": frozenset({"spark_secret"}),
    "spark-worker-1": frozenset({"spark_secret"}),
    "spark-worker-2": frozenset({"spark_secret"}),
}
# settings that hold a secret's value: never literal in a service's environment (their _CMD reads a file instead)
LITERAL_SECRETS = (*deploy.SECRETS, *deploy.URL_SECRETS, "POSTGRES_PASSWORD", "REDIS_PASSWORD", "REDISCLI_AUTH")


def secret_files_of(service: Mapping[str, Any]) -> set[str]:
    """The secret files mounted into ``service`` (``/run/secrets/<name>``; the whole directory: every one)."""
    out: set[str] = set()
    for volume in service.get("volumes") or ():
        target = str(volume).split(":")[1:2]
        if target == ["/run/secrets"]:
            out |= ALL_SECRETS
        elif target and target[0].startswith("/run/secrets/"):
            out.add(target[0].rsplit("/", 1)[1])
    return out


def with_distinct_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with each secret a value of its own that no other text contains (.env.example's are all "change-me")."""
    return {**env, **{k: f"sentinel-{k.lower()}-{i}x" for i, k in enumerate(secret_names(env))}}


def env_example() -> dict[str, str]:
    return read_env_file(ENV_EXAMPLE)


def argv_of(service: Mapping[str, Any], key: str = "command") -> list[str]:
    """A service's command (or healthcheck test without its CMD) as an argv list; [] when it has none."""
    value = service.get(key)
    if key == "healthcheck":
        value = (service.get("healthcheck") or {}).get("test")
        if isinstance(value, list) and value and value[0] in ("CMD", "CMD-SHELL"):
            value = value[1:] if value[0] == "CMD" else ["sh", "-c", *value[1:]]
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else shlex.split(str(value))


def words(argv: list[str]) -> list[str]:
    """argv with every ``sh -c SCRIPT`` script split into its words too."""
    out = list(argv)
    for i, arg in enumerate(argv[:-1]):
        if arg == "-c" and Path(argv[0]).name in ("sh", "bash"):
            out += shlex.split(argv[i + 1])
    return out


def flag_value(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def hosts_given(argv: list[str]) -> list[tuple[str, str]]:
    """Every (option, address) a command line gives a server or client: ``--host``, ``-H``, ``--bind``,
    ``listen_addresses=`` (and ``-h`` for the Postgres and Redis clients, where it means the host). Airflow's ``-H``
    (a Celery worker's hostname) is not an address."""
    found = []
    ws = words(argv)
    program = Path(argv[0]).name if argv else ""
    flags = ["--host", "--bind", "--bind-address"]
    if program != "airflow":
        flags.append("-H")
    if program in ("pg_isready", "redis-cli", "psql") or "redis-server" in ws:
        flags.append("-h")
    for i, w in enumerate(ws):
        for flag in flags:
            if w == flag and i + 1 < len(ws):
                found.append((flag, ws[i + 1]))
            elif w.startswith(flag + "=") and flag.startswith("--"):
                found.append((flag, w.split("=", 1)[1]))
        if "listen_addresses=" in w:
            found.append(("listen_addresses", w.split("listen_addresses=", 1)[1].strip("'\"")))
    return found


_URL = re.compile(r"\b([a-z][a-z0-9+.-]*)://(?:[^/@\s]*@)?([^/:\s\"']+)")


def address_problems(name: str, env: Mapping[str, Any]) -> list[str]:
    """An Airflow or Spark process's environment: every ``*_HOST`` / bind setting and every URL's host is 127.0.0.1
    (an ``s3a://`` store names a bucket, not an address)."""
    problems = []
    for key, value in env.items():
        text = str(value)
        if re.search(r"(_HOST|BIND|BIND_ADDRESS)$", key) and text != "127.0.0.1":
            problems.append(f"{name}: environment {key}={text!r}, not 127.0.0.1")
        for scheme, host in _URL.findall(text):
            if scheme not in ("s3a", "s3", "hdfs") and host != "127.0.0.1":
                problems.append(f"{name}: environment {key} points at {scheme}://{host}, not 127.0.0.1")
    conf = env.get("FLEET_DOCTOR_SPARK_CONF")
    if conf:
        try:
            spark_conf = json.loads(str(conf))
        except ValueError as e:
            return [*problems, f"{name}: FLEET_DOCTOR_SPARK_CONF is not JSON ({e})"]
        for key, value in spark_conf.items():
            if key.endswith((".host", ".bindAddress")) and value != "127.0.0.1":
                problems.append(f"{name}: FLEET_DOCTOR_SPARK_CONF {key}={value!r}, not 127.0.0.1")
    return problems


def depends(service: Mapping[str, Any]) -> dict[str, str]:
    """depends_on as {service: condition} (the short list form: service_started)."""
    value = service.get("depends_on") or {}
    if isinstance(value, list):
        return {str(s): "service_started" for s in value}
    return {str(s): str((c or {}).get("condition", "service_started")) for s, c in value.items()}


# ------------------------------------------------------------------------------------------- the compose checks
def compose_problems(compose: Mapping[str, Any], secrets: Mapping[str, str]) -> list[str]:
    """What in the interpolated compose data breaks the deployment's rules, each naming the service; ``secrets``:
    the env file's secret variables and the (distinct) values they were interpolated with."""
    problems: list[str] = []
    services: Mapping[str, Any] = compose.get("services") or {}
    if "networks" in compose:
        problems.append("compose.yaml: a top-level networks: (every service uses the host's network)")
    for name in SERVICES:
        if name not in services:
            problems.append(f"{name}: missing (the issue asks for it)")
    for name, svc in services.items():
        if svc.get("network_mode") != "host":
            problems.append(f"{name}: network_mode is {svc.get('network_mode')!r}, not host")
        for key in ("ports", "expose", "networks", "build"):
            if key in svc:
                problems.append(f"{name}: has {key}: ({svc[key]!r}): nothing is published, bridged or built")
        for key in ("command", "healthcheck"):
            for flag, address in hosts_given(argv_of(svc, key)):
                if address != "127.0.0.1" and not (flag == "listen_addresses" and address == ""):
                    problems.append(f"{name}: {key} gives {flag} {address!r}, not 127.0.0.1")
        env = svc.get("environment") or {}
        if isinstance(env, list):
            env = dict(str(e).partition("=")[::2] for e in env)
        problems += address_problems(name, env)
        if name not in ONE_SHOT and not (svc.get("healthcheck") or {}).get("test"):
            problems.append(f"{name}: no healthcheck (it runs for good: compose must know when it is up)")
        # a secret reaches a process only through its environment: never a command line, a path or an image name
        outside = {k: v for k, v in svc.items() if k != "environment"}
        text = json.dumps(outside)
        for var, value in secrets.items():
            if value and value in text:
                problems.append(f"{name}: secret {var} appears outside environment: (on a command line or a path)")
        # and since issue 28 item 12 not even there: files, each only where the role needs it, read through _CMD
        files = secret_files_of(svc)
        role = ROLE_SECRETS.get(name, frozenset())
        if files - role:
            problems.append(f"{name}: gets secret file(s) {', '.join(sorted(files - role))} its role does not need")
        if role - files:
            problems.append(f"{name}: lacks secret file(s) {', '.join(sorted(role - files))} its role needs")
        for key in env:
            if key in LITERAL_SECRETS:
                problems.append(f"{name}: environment holds {key} literally (a secret: {key}_CMD reading a file)")
        for key, value in env.items():
            if not key.endswith(
                "_CMD"
            ):  # FLEET_DOCTOR_SPARK_SECRET_FILE: the same DAG everywhere, read where Spark runs
                continue
            for read in re.findall(r"/run/secrets/([a-z_]+)", str(value)):
                if read not in files:
                    problems.append(f"{name}: {key} reads /run/secrets/{read}, which is not mounted")

    def service(name: str) -> Mapping[str, Any]:
        return services.get(name) or {}

    for name in ("airflow-init", *AIRFLOW_SERVICES):
        svc, env = service(name), service(name).get("environment") or {}
        if not svc:
            continue
        if env.get("FLEET_DOCTOR_HOSTNAME") != name:
            problems.append(f"{name}: FLEET_DOCTOR_HOSTNAME is {env.get('FLEET_DOCTOR_HOSTNAME')!r}, not {name!r}")
        if env.get("AIRFLOW__CORE__HOSTNAME_CALLABLE") != "fleet_doctor.deploy.hostname":
            problems.append(f"{name}: AIRFLOW__CORE__HOSTNAME_CALLABLE is not fleet_doctor.deploy.hostname")
        wanted = {"postgres": "service_healthy", "redis": "service_healthy"}
        if name != "airflow-init":
            wanted["airflow-init"] = "service_completed_successfully"
        got = depends(svc)
        for dep, condition in wanted.items():
            if got.get(dep) != condition:
                problems.append(f"{name}: depends_on {dep} is {got.get(dep)!r}, not {condition}")
    init = argv_of(service("airflow-init"))
    if service("airflow-init") and init[-3:] != ["-m", "fleet_doctor.deploy", "init"]:
        problems.append(f"airflow-init: command {init}, not python -m fleet_doctor.deploy init")
    for name in SERVES_LOGS:
        if service(name) and "--skip-serve-logs" not in argv_of(service(name)):
            problems.append(f"{name}: runs without --skip-serve-logs (Airflow's log server binds every interface)")
    celery: dict[str, str | None] = {}
    for name in ("worker-1", "worker-2"):
        if not service(name):
            continue
        argv = argv_of(service(name))
        celery[name] = flag_value(argv, "--celery-hostname")
        if argv[:3] != ["airflow", "celery", "worker"] or not celery[name]:
            problems.append(f"{name}: command {argv}, not airflow celery worker --celery-hostname NAME")
        ping = flag_value(argv_of(service(name), "healthcheck"), "-d")
        if ping != celery[name]:
            problems.append(f"{name}: healthcheck pings {ping!r}, its celery hostname is {celery[name]!r}")
    if len(celery) == 2 and len(set(celery.values())) < 2:
        problems.append(f"worker-1, worker-2: the same celery hostname {celery['worker-1']!r}")
    for name in ("dag-processor", "triggerer"):
        checked = flag_value(argv_of(service(name), "healthcheck"), "--hostname")
        if service(name) and checked != name:
            problems.append(f"{name}: healthcheck checks the job of hostname {checked!r}, not {name!r}")
    api = flag_value(argv_of(service("api-server")), "--port")
    base = (service("scheduler").get("environment") or {}).get("AIRFLOW__API__BASE_URL")
    if service("api-server") and base != f"http://127.0.0.1:{api}":
        problems.append(f"scheduler: AIRFLOW__API__BASE_URL {base!r}, the api-server listens on port {api}")
    master = argv_of(service("spark-master"))
    master_port, master_ui = flag_value(master, "--port"), flag_value(master, "--webui-port")
    if service("spark-master"):
        if master[:4] != [*SPARK_DAEMON, "org.apache.spark.deploy.master.Master"]:
            problems.append(f"spark-master: command {master}, not {' '.join(SPARK_DAEMON)} ...deploy.master.Master")
        if "spark.master.rest.enabled=false" not in str(service("spark-master").get("environment") or {}):
            problems.append("spark-master: the REST submission server (6066) is not turned off in SPARK_MASTER_OPTS")
        for name in ("worker-1", "worker-2"):
            url = (service(name).get("environment") or {}).get("FLEET_DOCTOR_SPARK_MASTER")
            if service(name) and url != f"spark://127.0.0.1:{master_port}":
                problems.append(f"{name}: FLEET_DOCTOR_SPARK_MASTER {url!r}, the master listens on {master_port}")
    for name in SPARK_WORKERS:
        argv = argv_of(service(name))
        if not argv:
            continue
        if argv[:4] != [*SPARK_DAEMON, "org.apache.spark.deploy.worker.Worker"]:
            problems.append(f"{name}: command {argv}, not {' '.join(SPARK_DAEMON)} ...deploy.worker.Worker")
        if argv[-1] != f"spark://127.0.0.1:{master_port}":
            problems.append(f"{name}: registers with {argv[-1]!r}, the master listens on {master_port}")
        if depends(service(name)).get("spark-master") != "service_healthy":
            problems.append(f"{name}: does not wait for spark-master service_healthy")
        check = argv_of(service(name), "healthcheck")
        if check[1:4] != ["spark-worker", f"http://127.0.0.1:{master_ui}", flag_value(argv, "--webui-port")]:
            problems.append(f"{name}: healthcheck {check} does not ask the master for this worker's web UI port")
    # Spark's authentication (issue 28 item 14): on in every daemon, its secret file mounted where Spark runs
    for name, opts in (("spark-master", "SPARK_MASTER_OPTS"), *((w, "SPARK_WORKER_OPTS") for w in SPARK_WORKERS)):
        env = service(name).get("environment") or {}
        if not service(name):
            continue
        for flag in ("-Dspark.authenticate=true", "-Dspark.ui.killEnabled=false"):
            if flag not in str(env.get(opts, "")).split():
                problems.append(f"{name}: {opts} lacks {flag}")
    for name in ("spark-master", *SPARK_WORKERS, "worker-1", "worker-2"):
        mounted = any(str(v).split(":")[1:2] == [SPARK_SECRET_MOUNT] for v in service(name).get("volumes") or ())
        if service(name) and not mounted:
            problems.append(f"{name}: the Spark secret file is not mounted at {SPARK_SECRET_MOUNT}")
        if service(name) and (service(name).get("environment") or {}).get(SECRET_ENV) != SPARK_SECRET_MOUNT:
            problems.append(f"{name}: {SECRET_ENV} is not {SPARK_SECRET_MOUNT}")
    return problems


@pytest.fixture(scope="module")
def example() -> dict[str, str]:
    return env_example()


def test_interpolation_as_compose_does_it_and_an_unknown_variable_is_named() -> None:
    env = {"PORT": "1", "PW": "s"}
    assert interpolate("a${PORT}b$$PW", env, "x") == "a1b$PW"
    with pytest.raises(ComposeError, match=r"worker-1.command\[2\]: variable NOPE is not defined"):
        interpolated({"worker-1": {"command": ["a", "b", "${NOPE}"]}}, env)
    for text in ("$PORT", "${PORT:-2}"):
        with pytest.raises(ComposeError, match=r"write \$\{VAR\}"):
            interpolate(text, env, "x")


def test_compose_keeps_the_deployments_rules(example: dict[str, str]) -> None:
    env = with_distinct_secrets(example)
    problems = compose_problems(load_compose(env), {k: env[k] for k in secret_names(env)})
    assert problems == [], "\n".join(problems)


def test_a_broken_compose_is_caught(example: dict[str, str]) -> None:
    """The same check on a copy with one breach per service: each is reported, naming the service."""
    env = with_distinct_secrets(example)
    secrets = {k: env[k] for k in secret_names(env)}
    good = load_compose(env)
    bad = copy.deepcopy(good)
    s = bad["services"]
    s["api-server"]["ports"] = ["28180:28180"]
    s["spark-master"]["command"][s["spark-master"]["command"].index("--host") + 1] = "0.0.0.0"
    s["redis"]["command"][-1] = s["redis"]["command"][-1].replace("--bind 127.0.0.1", "--bind 0.0.0.0")
    del s["postgres"]["network_mode"]
    del s["scheduler"]["healthcheck"]
    s["triggerer"]["command"].remove("--skip-serve-logs")
    s["worker-2"]["command"] = [c.replace("worker-2@", "worker-1@") for c in s["worker-2"]["command"]]
    s["worker-2"]["environment"]["FLEET_DOCTOR_HOSTNAME"] = "worker-1"
    s["dag-processor"]["depends_on"]["airflow-init"]["condition"] = "service_started"
    s["worker-1"]["environment"]["AIRFLOW__API__HOST"] = "0.0.0.0"
    s["worker-2"]["environment"]["AIRFLOW__CORE__FERNET_KEY"] = "f" * 44
    s["worker-1"]["volumes"].append("/etc/s/postgres_password:/run/secrets/postgres_password:ro")
    s["scheduler"]["volumes"] = [v for v in s["scheduler"]["volumes"] if "jwt_secret" not in v]
    s["spark-worker-2"]["environment"]["SPARK_WORKER_OPTS"] = "-Dspark.ui.killEnabled=false"
    s["spark-master"]["volumes"] = []
    del s["spark-worker-1"]
    bad["networks"] = {"default": {}}
    problems = "\n".join(compose_problems(bad, secrets))
    for expected in (
        "api-server: has ports:",
        "spark-master: command gives --host '0.0.0.0'",
        "redis: command gives --bind '0.0.0.0'",
        "postgres: network_mode is None, not host",
        "scheduler: no healthcheck",
        "triggerer: runs without --skip-serve-logs",
        "worker-1, worker-2: the same celery hostname",
        "worker-2: healthcheck pings 'worker-2@",
        "worker-2: FLEET_DOCTOR_HOSTNAME is 'worker-1', not 'worker-2'",
        "dag-processor: depends_on airflow-init is 'service_started', not service_completed_successfully",
        "worker-1: environment AIRFLOW__API__HOST='0.0.0.0', not 127.0.0.1",
        "worker-2: environment holds AIRFLOW__CORE__FERNET_KEY literally",
        "worker-1: gets secret file(s) postgres_password its role does not need",
        "scheduler: lacks secret file(s) jwt_secret its role needs",
        "scheduler: AIRFLOW__API_AUTH__JWT_SECRET_CMD reads /run/secrets/jwt_secret, which is not mounted",
        "spark-worker-1: missing",
        "spark-worker-2: SPARK_WORKER_OPTS lacks -Dspark.authenticate=true",
        "spark-master: the Spark secret file is not mounted at /run/secrets/spark_secret",
        "compose.yaml: a top-level networks:",
    ):
        assert expected in problems, f"not caught: {expected}\n{problems}"
    assert compose_problems(good, secrets) == []


def test_every_variable_is_defined_and_used(example: dict[str, str]) -> None:
    used: set[str] = set()
    load_compose(example, used)
    unused = set(example) - used - set(UNUSED_BY_COMPOSE)
    assert not unused, f"{ENV_EXAMPLE.name} defines variables compose.yaml never uses: {sorted(unused)}"
    stale = set(UNUSED_BY_COMPOSE) & used
    assert not stale, f"listed as unused by compose.yaml but used: {sorted(stale)}"
    # e2e.py writes its env file from .env.example with fresh ports: every *_PORT variable must be among its PORTS
    from_e2e = re.search(r"^PORTS = \((.*?)^\)", (DOCKER / "e2e.py").read_text(), re.S | re.M)
    assert from_e2e, "docker/e2e.py: no PORTS tuple"
    e2e_ports = set(re.findall(r'"([A-Z0-9_]+)"', from_e2e.group(1)))
    assert e2e_ports == {k for k in example if k.endswith("_PORT")}, "docker/e2e.py PORTS and .env.example's ports"


def test_every_port_is_distinct_and_every_service_binds_its_own(example: dict[str, str]) -> None:
    ports = {k: v for k, v in example.items() if k.endswith("_PORT")}
    assert all(v.isdigit() and 1024 < int(v) < 65536 for v in ports.values()), ports
    by_value: dict[str, list[str]] = {}
    for k, v in ports.items():
        by_value.setdefault(v, []).append(k)
    assert not [ks for ks in by_value.values() if len(ks) > 1], f"ports shared: {by_value}"
    # and none is Airflow's, Spark's or bin/dev ui's own default (8080, 7077, 8081, 6066, 28080)
    assert not set(ports.values()) & {"8080", "7077", "8081", "6066", "28080", "5432", "6379"}, ports


def test_the_spark_settings_pass_the_products_settings_and_hold_no_credential(example: dict[str, str]) -> None:
    env = with_distinct_secrets(example)
    worker = load_compose(env)["services"]["worker-1"]["environment"]
    conf = json.loads(worker["FLEET_DOCTOR_SPARK_CONF"])
    assert isinstance(conf, dict) and conf, conf
    settings = Settings.from_env({k: str(v) for k, v in worker.items()})
    assert dict(settings.spark_conf) == {k: str(v) for k, v in conf.items()}
    for var in secret_names(env):
        assert env[var] not in worker["FLEET_DOCTOR_SPARK_CONF"], f"FLEET_DOCTOR_SPARK_CONF holds {var}"
    # what the executors get must fit a spark-worker: cores.max over executor.cores executors, one per worker
    cores, per_executor = int(conf["spark.cores.max"]), int(conf["spark.executor.cores"])
    assert cores // per_executor == len(SPARK_WORKERS) and per_executor <= int(example["SPARK_WORKER_CORES"])


# ------------------------------------------------------------------------------------------- images and Dockerfile
def dockerfile_stages(text: str) -> dict[str, list[str]]:
    """Each ``FROM ... AS <target>`` stage's instructions (continuation lines joined)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    stages: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM\s+\S+\s+AS\s+(\S+)$", line, re.I)
        if m:
            current = stages.setdefault(m.group(1), [])
        elif current is not None:
            current.append(line)
    return stages


def image_env(stage: list[str]) -> dict[str, str]:
    """A stage's ENV KEY=VALUE settings."""
    env: dict[str, str] = {}
    for line in stage:
        if line.upper().startswith("ENV "):
            for word in shlex.split(line[4:]):
                key, _, value = word.partition("=")
                env[key] = value
    return env


def built_targets() -> list[str]:
    m = re.search(r"^for target in ([a-z0-9 -]+); do", (DOCKER / "build").read_text(), re.M)
    assert m, "docker/build: no `for target in ...; do` loop"
    return m.group(1).split()


def test_the_brokers_ssh_key_is_mounted_only_where_tasks_run(example: dict[str, str]) -> None:
    """Issue 28 item 15: the key that opens every broker is in the workers (they run the tasks that SSH) and in
    airflow-init (it checks the key is readable), nowhere else."""
    compose = load_compose(example)
    key = "/etc/kafka-fleet-doctor/ssh/id_key"
    holding = sorted(
        name
        for name, service in compose["services"].items()
        if any(str(v).split(":")[1:2] == [key] for v in service.get("volumes") or ())
    )
    assert holding == ["airflow-init", "worker-1", "worker-2"]


def test_every_image_compose_names_is_one_docker_build_builds() -> None:
    build = (DOCKER / "build").read_text()
    assert '-t "fleet-doctor/$target:$TAG"' in build and '--target "$target"' in build
    stages = dockerfile_stages(DOCKERFILE.read_text())
    targets = built_targets()
    missing = set(targets) - set(stages)
    assert not missing, f"docker/build builds targets the Dockerfile lacks: {missing}"
    raw = yaml.safe_load(COMPOSE.read_text())["services"]
    for name, svc in raw.items():
        m = re.fullmatch(r"fleet-doctor/([a-z0-9-]+):\$\{FLEET_DOCTOR_IMAGE_TAG\}", str(svc.get("image")))
        assert m and m.group(1) in targets, f"{name}: image {svc.get('image')!r} is not one docker/build tags"


def test_no_secret_is_baked_into_an_image() -> None:
    text = DOCKERFILE.read_text()
    stages = dockerfile_stages(text)
    for target, stage in stages.items():
        for line in stage:
            if re.match(r"(COPY|ADD)\s", line, re.I):
                sources = [w for w in shlex.split(line)[1:-1] if not w.startswith("--")]
                for src in sources:
                    assert not re.search(r"\.(crt|pem|key|p12)$|id_|\.env|ssh|passw|secret", src, re.I), (
                        f"Dockerfile {target}: {line!r} copies {src} into a layer"
                    )
            if re.match(r"(ARG|ENV)\s", line, re.I):
                assert not re.search(r"PASSWORD|SECRET|TOKEN|FERNET|CERT", line, re.I), (
                    f"Dockerfile {target}: {line!r} puts a secret into the image's config"
                )
    assert "--mount=type=secret,id=pipca" in text, "Dockerfile: pip's CA bundle must come as the BuildKit secret pipca"
    assert '--secret "id=pipca,src=' in (DOCKER / "build").read_text(), "docker/build does not pass the pipca secret"
    users = [line.split()[1] for line in stages["app"] if line.upper().startswith("USER ")]
    assert users and users[-1] not in ("root", "0", "0:0"), f"Dockerfile app: last USER {users}: not root"
    assert image_env(stages["app"]).get("SPARK_LOCAL_IP") == "127.0.0.1", "the app image binds Spark to 127.0.0.1"


def test_services_without_a_command_bind_loopback_through_their_image() -> None:
    """postgres and redis run their image's CMD: the address is there (and in the postgres entrypoint)."""
    stages = dockerfile_stages(DOCKERFILE.read_text())
    raw = yaml.safe_load(COMPOSE.read_text())["services"]
    copies = {}
    for stage in stages.values():
        for line in stage:
            if line.upper().startswith("COPY ") and "--from" not in line:
                *src, dst = shlex.split(line)[1:]
                copies[dst] = src
    for name, svc in raw.items():
        if svc.get("command"):
            continue
        target = str(svc["image"]).split("/")[1].split(":")[0]
        cmd = [line for line in stages[target] if line.upper().startswith("CMD ")]
        assert cmd, f"{name}: no command and no CMD in the Dockerfile's {target} target"
        argv = json.loads(cmd[-1][4:])
        found = hosts_given(argv)
        if argv[0] in copies:  # a script of ours: its server's command line
            script = (REPO / copies[argv[0]][0]).read_text()
            found += [("listen_addresses", v.strip("'\"")) for v in re.findall(r"listen_addresses=(\S*)", script)]
        assert found, f"{name}: its image's CMD {argv} names no address"
        wrong = [(f, a) for f, a in found if a not in ("127.0.0.1", "")]
        assert not wrong, f"{name}: its image binds {wrong}, not 127.0.0.1"


# ------------------------------------------------------------------------------------------- the Spark cluster
def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+)(ms|s|m)?", str(value))
    assert m, f"not a compose duration: {value!r}"
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, None: 1}[m.group(2)]


def run_healthcheck(service: Mapping[str, Any]) -> subprocess.CompletedProcess[str]:
    """The service's healthcheck as compose runs it, docker/healthcheck run by this venv's python."""
    argv = argv_of(service, "healthcheck")
    assert argv[0] == HEALTHCHECK, argv
    timeout = seconds(service["healthcheck"].get("timeout", "30s"))
    return subprocess.run(
        [sys.executable, str(DOCKER / "healthcheck"), *argv[1:]], capture_output=True, text=True, timeout=timeout + 5
    )


class Cluster:
    """spark-master and the spark-workers as compose runs them, as local processes (each its own session)."""

    def __init__(self, services: Mapping[str, Any], ports: Mapping[str, str], work: Path, image: Mapping[str, str]):
        self.services = services
        self.ports = ports
        self.work = work
        self.image = image
        # the secret file compose mounts at SPARK_SECRET_MOUNT: one of this cluster's own
        self.secret_file = work / "spark_secret"
        self.secret_file.write_text(secrets.token_urlsafe(32) + "\n")
        self.secret_file.chmod(0o400)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.healthy_after: dict[str, float] = {}  # seconds from start until its healthcheck passed

    def start(self, name: str) -> None:
        svc = self.services[name]
        argv = argv_of(svc)
        assert argv[:3] == ["python", "-m", "fleet_doctor.spark_auth"], argv  # the secret put in its environment
        argv[0] = sys.executable  # the image's PATH has its venv's bin first (spark-class is found there)
        if "--work-dir" in argv:  # the container's /opt/spark/work: a directory of this worker's own
            i = argv.index("--work-dir") + 1
            argv[i] = str(self.work / name)
            Path(argv[i]).mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        env.update(
            PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
            SPARK_LOCAL_IP=self.image["SPARK_LOCAL_IP"],
            SPARK_LOG_DIR=str(self.work),
            PYSPARK_PYTHON=sys.executable,  # the image's venv python
            PYTHONPATH=str(REPO / "plugins"),  # the image installs the package (its wheel); here, the checkout's
            **{k: str(v) for k, v in (svc.get("environment") or {}).items()},
        )
        assert env[SECRET_ENV] == SPARK_SECRET_MOUNT and self.mounts_secret(name), name
        env[SECRET_ENV] = str(self.secret_file)
        with open(self.work / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def mounts_secret(self, name: str) -> bool:
        return any(str(v).split(":")[1:2] == [SPARK_SECRET_MOUNT] for v in self.services[name].get("volumes") or ())

    def pids(self) -> dict[str, list[int]]:
        return {name: [p.pid, *descendants(p.pid)] for name, p in self.procs.items() if p.poll() is None}

    def log(self, name: str) -> str:
        return "\n".join((self.work / f"{name}.log").read_text(errors="replace").splitlines()[-20:])

    def wait_healthy(self, name: str) -> float:
        """Run the service's healthcheck as compose does (every interval, within start_period + retries x interval)
        until it passes; the seconds it took."""
        hc = self.services[name]["healthcheck"]
        interval = min(seconds(hc.get("interval", "30s")), 1.0)  # compose's interval, polled faster here
        budget = seconds(hc.get("start_period", "0s")) + int(hc.get("retries", 3)) * seconds(hc.get("interval", "30s"))
        t0 = time.monotonic()
        last = None
        while time.monotonic() - t0 < budget:
            if self.procs[name].poll() is not None:
                pytest.fail(f"{name} exited {self.procs[name].returncode}:\n{self.log(name)}")
            last = run_healthcheck(self.services[name])
            if last.returncode == 0:
                return time.monotonic() - t0
            time.sleep(interval)
        pytest.fail(f"{name} not healthy within {budget:.0f} s: {last.stdout if last else ''}\n{self.log(name)}")

    def stop(self) -> list[int]:
        """SIGTERM each session, then SIGKILL what is left of it (executors and their Python workers included);
        returns the PIDs still alive after that (none, or a JVM was left)."""
        family = [pid for pids in self.pids().values() for pid in pids]
        for p in self.procs.values():
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        for pid in family:
            if pid_alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs.values():
            if p.poll() is None:
                p.wait(timeout=10)
        time.sleep(0.2)
        return [pid for pid in family if pid_alive(pid)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, example: dict[str, str]) -> Iterator[Cluster]:
    spark_ports = [k for k in example if k.startswith("SPARK_") and k.endswith("_PORT")]
    ports = dict(zip(spark_ports, map(str, free_ports(len(spark_ports))), strict=True))
    services = load_compose({**example, **ports})["services"]
    image = image_env(dockerfile_stages(DOCKERFILE.read_text())["app"])
    c = Cluster(services, ports, tmp_path_factory.mktemp("spark-cluster"), image)
    try:
        c.start("spark-master")
        c.healthy_after["spark-master"] = c.wait_healthy("spark-master")
        for name in SPARK_WORKERS:  # compose starts them once the master is healthy
            c.start(name)
        for name in SPARK_WORKERS:
            c.healthy_after[name] = c.wait_healthy(name)
        yield c
    finally:
        left = c.stop()
        assert not left, f"processes left after stopping the cluster: {left}"


def test_the_healthchecks_say_healthy_and_name_what_is_wrong(cluster: Cluster) -> None:
    assert set(cluster.healthy_after) == {"spark-master", *SPARK_WORKERS}  # the fixture waited for each, as compose
    for name in ("spark-master", *SPARK_WORKERS):
        r = run_healthcheck(cluster.services[name])
        assert r.returncode == 0 and r.stdout == "", (name, r)
    master = get_json(f"http://127.0.0.1:{cluster.ports['SPARK_MASTER_WEBUI_PORT']}/json/")
    assert master["aliveworkers"] == 2, master
    # a worker whose web UI port nobody serves: unhealthy, one line saying why
    (nobody,) = free_ports(1)
    worker = copy.deepcopy(cluster.services["spark-worker-1"])
    worker["healthcheck"]["test"][-1] = str(nobody)
    r = run_healthcheck(worker)
    assert r.returncode == 1 and len(r.stdout.splitlines()) == 1, r
    assert f"no ALIVE worker with web UI port {nobody}" in r.stdout, r.stdout
    # a master nobody serves: unhealthy, one line naming the URL
    master_svc = copy.deepcopy(cluster.services["spark-master"])
    master_svc["healthcheck"]["test"][-1] = f"http://127.0.0.1:{nobody}"
    r = run_healthcheck(master_svc)
    assert r.returncode == 1 and len(r.stdout.splitlines()) == 1 and f"127.0.0.1:{nobody}" in r.stdout, r
    # the http check (api-server, scheduler) against a page that answers, and one that does not
    ok = subprocess.run(
        [
            sys.executable,
            str(DOCKER / "healthcheck"),
            "http",
            f"http://127.0.0.1:{cluster.ports['SPARK_MASTER_WEBUI_PORT']}",
        ],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert ok.returncode == 0 and ok.stdout == "", ok
    down = subprocess.run(
        [sys.executable, str(DOCKER / "healthcheck"), "http", f"http://127.0.0.1:{nobody}/health"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert down.returncode == 1 and len(down.stdout.splitlines()) == 1, down


@pytest.fixture(scope="module")
def aryan(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """The aryan log dir probed and staged as ``scan`` stages it, and its ZooKeeper snapshot's records."""
    work = tmp_path_factory.mktemp("aryan")
    stage_probe([str(corpus / ARYAN / "kafka-logs")], work, deep=False, verify_crc=False, broker_id=None)
    return work, read_snapshot_file(str(corpus / ARYAN / "zookeeper"))


class SocketWatch:
    """Samples, while it runs, every socket listening among the cluster's processes and their children and the
    driver (a spark-submit under this test), and which executors it saw."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.sockets: dict[tuple[str, int], set[str]] = {}
        self.executors: set[int] = set()
        self.drivers: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def cmdline(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return ""

    def sample(self) -> None:
        owner = {pid: name for name, pids in self.cluster.pids().items() for pid in pids}
        for pid in descendants(os.getpid()):
            if pid not in owner and "org.apache.spark.deploy.SparkSubmit" in self.cmdline(pid):
                self.drivers.add(pid)
                owner.update({p: "driver" for p in [pid, *descendants(pid)]})
        for pid in owner:
            if "CoarseGrainedExecutorBackend" in self.cmdline(pid):
                self.executors.add(pid)
        for key, pids in listening_sockets(list(owner)).items():
            self.sockets.setdefault(key, set()).update(owner[p] for p in pids)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(0.3)

    def __enter__(self) -> SocketWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def test_every_socket_is_loopback_and_no_rest_port(cluster: Cluster) -> None:
    watch = SocketWatch(cluster)
    watch.sample()
    master = {p for (a, p), who in watch.sockets.items() if "spark-master" in who}
    assert master == {int(cluster.ports["SPARK_MASTER_PORT"]), int(cluster.ports["SPARK_MASTER_WEBUI_PORT"])}, (
        f"the master listens on {sorted(master)} (no REST port {REST_PORT}, nothing else)"
    )
    for name, n in (("spark-worker-1", 1), ("spark-worker-2", 2)):
        mine = {p for (a, p), who in watch.sockets.items() if name in who}
        own = {int(cluster.ports[f"SPARK_WORKER_{n}_PORT"]), int(cluster.ports[f"SPARK_WORKER_{n}_WEBUI_PORT"])}
        assert mine == own, f"{name} listens on {sorted(mine)}, not its port and web UI port {sorted(own)}"
    outside = {k: v for k, v in watch.sockets.items() if k[0] not in LOOPBACK}
    assert not outside, f"listening beyond 127.0.0.1: {outside}"
    assert not [k for k in watch.sockets if k[1] == REST_PORT], f"port {REST_PORT} is open"


def detect_task_submit(
    worker_env: Mapping[str, Any], args: list[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[str, dict[str, str], dict[str, str] | None, str | None]:
    """The master, settings and environment the audit's ``detect`` task (DetectOperator.prepare, configured by the
    DAG from the Celery worker's environment) gives this submit, with ``spark_default`` as
    ``python -m fleet_doctor.deploy init`` writes it from FLEET_DOCTOR_SPARK_MASTER."""
    from fleet_doctor.audit.detect_task import DetectOperator

    settings = Settings.from_env({k: str(v) for k, v in worker_env.items()})  # the DAG's SETTINGS in that worker
    inventory = Inventory("c", "127.0.0.1:2181", [])
    conns = deploy.connections([inventory], "/k", worker_env[deploy.SPARK_MASTER], "http://127.0.0.1:1", "api", "pw")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(conns[deploy.SPARK_CONN]))
    op = DetectOperator(
        task_id="detect",
        conn_id="spark_default",
        conf=settings.detect_conf({}),
        secret_file=settings.spark_auth_file,
        application_args=args,
    )
    master = op.prepare()
    assert op.py_files == str(spark.library_archive())
    return master, dict(op.conf), op.env_vars, op.properties_file


def test_detection_on_the_cluster_finds_what_a_local_master_finds(
    cluster: Cluster, aryan: tuple[Path, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    work, zk = aryan
    broker = {"broker_id": 0, "kafka_version": "3.1.0", "running": False}
    local = detection.detect_locally(
        work, [broker], zk, metadata_mode="zookeeper", master="local[2]", audit_run="compose"
    )
    assert {f["topic"] for f in local.findings if f["rule"] == "topic-id-mismatch"} == {"design1"}

    assert cluster.mounts_secret("worker-1")  # the worker that drives the app holds the secret file
    worker_env = {**cluster.services["worker-1"]["environment"], SECRET_ENV: str(cluster.secret_file)}
    out = work / "cluster"
    out.mkdir()
    args = spark.detect_args(
        str(work / "probe"),
        str(work / "brokers.jsonl"),
        str(out / "findings"),
        "compose",
        str(out / "summary.json"),
        str(out / "findings.jsonl"),
        str(work / "cluster-metadata.jsonl"),
        metadata_mode="zookeeper",
    )
    master, conf, env, properties = detect_task_submit(worker_env, args, monkeypatch)
    secret = cluster.secret_file.read_text().strip()
    assert conf["spark.authenticate"] == "true" and secret not in json.dumps(conf)  # the secret: no setting
    assert properties and Path(properties).stat().st_mode & 0o777 == 0o600
    assert f"spark.authenticate.secret={secret}\n" in Path(properties).read_text()
    assert master == f"spark://127.0.0.1:{cluster.ports['SPARK_MASTER_PORT']}", master
    assert spark.profile_for(master) == "cluster"
    assert env is None, f"the detect task hands a cluster submit no environment, not {env}"
    assert {k: conf[k] for k in json.loads(worker_env["FLEET_DOCTOR_SPARK_CONF"])} == json.loads(
        worker_env["FLEET_DOCTOR_SPARK_CONF"]
    )
    started = time.time()
    with SocketWatch(cluster) as watch:
        spark.run_detect(master, conf, args, secret_file=str(cluster.secret_file))
    found = [json.loads(line) for line in (out / "findings.jsonl").read_text().splitlines() if line.strip()]
    key = lambda f: json.dumps(f, sort_keys=True)  # noqa: E731
    assert sorted(map(key, found)) == sorted(map(key, local.findings))

    # the master ran it to the end, with an executor on each worker
    ui = f"http://127.0.0.1:{cluster.ports['SPARK_MASTER_WEBUI_PORT']}/json/"
    apps = [a for a in get_json(ui)["completedapps"] if a["starttime"] / 1000 >= started - 1]
    assert len(apps) == 1 and apps[0]["state"] == "FINISHED", apps
    app = apps[0]["id"]
    ran_on: dict[str, list[int]] = {}
    deadline = time.monotonic() + 20  # a worker moves the executor to finished once the master tells it
    while time.monotonic() < deadline:
        for name, n in (("spark-worker-1", 1), ("spark-worker-2", 2)):
            w = get_json(f"http://127.0.0.1:{cluster.ports[f'SPARK_WORKER_{n}_WEBUI_PORT']}/json/")
            ran_on[name] = [e["id"] for e in w["finishedexecutors"] if e["appid"] == app]
        if all(ran_on.values()):
            break
        time.sleep(0.5)
    assert all(ran_on.values()), f"application {app} ({apps[0]['name']}): executors by worker {ran_on}"

    # every socket the cluster, its executors and the driver listened on meanwhile was loopback
    assert len(watch.executors) >= 2 and watch.drivers, (watch.executors, watch.drivers)
    outside = {k: v for k, v in watch.sockets.items() if k[0] not in LOOPBACK}
    assert not outside, f"listening beyond 127.0.0.1 during the run: {outside}"
    assert not [k for k in watch.sockets if k[1] == REST_PORT], f"port {REST_PORT} was open"


@pytest.mark.parametrize("secret", ["none", "another"])
def test_an_application_without_the_clusters_secret_is_refused(cluster: Cluster, secret: str, tmp_path: Path) -> None:
    """Issue 28 item 14: a local process that submits to the master without the secret (or with another) does not
    get an application registered, let alone executors; the master says why."""
    app = tmp_path / "app.py"
    app.write_text("from pyspark.sql import SparkSession\nSparkSession.builder.getOrCreate().range(1).count()\n")
    master = f"spark://127.0.0.1:{cluster.ports['SPARK_MASTER_PORT']}"
    ui = f"http://127.0.0.1:{cluster.ports['SPARK_MASTER_WEBUI_PORT']}/json/"
    before = {a["id"] for key in ("activeapps", "completedapps") for a in get_json(ui)[key]}
    conf = {"spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    properties = ""
    if secret == "another":
        other = tmp_path / "other_secret"
        other.write_text(secrets.token_urlsafe(32))
        properties = spark.auth_properties(str(other))
        conf["spark.authenticate"] = "true"
    master_log = cluster.work / "spark-master.log"
    seen = len(master_log.read_bytes())
    client_log = tmp_path / "client.log"
    cmd = spark.submit_command(app, master, conf, [], properties_file=properties)
    with open(client_log, "wb") as out:
        client = subprocess.Popen(
            cmd, env=spark.spark_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        # the master's own words: no SASL from the client, or a digest from another secret
        refused = re.compile(r"Expected SaslMessage|DIGEST-MD5: digest response format violation\. Mismatched response")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and client.poll() is None:
            said = master_log.read_bytes()[seen:].decode(errors="replace")
            if refused.search(said):
                break
            time.sleep(0.5)
        said = master_log.read_bytes()[seen:].decode(errors="replace")
        client_said = client_log.read_text(errors="replace")[-3000:]
        assert refused.search(said), f"the master did not refuse it:\n{said[-3000:]}\nclient:\n{client_said}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(client.pid, signal.SIGKILL)
        client.wait(timeout=30)
    after = {a["id"] for key in ("activeapps", "completedapps") for a in get_json(ui)[key]}
    assert after == before, f"an application registered without the secret: {after - before}"


def test_the_env_file_holds_no_secret_and_each_role_only_its_own(example: dict[str, str]) -> None:
    """Issue 28 item 12: .env.example names a directory of secret files, no secret; the Celery workers (task code)
    get neither the database password, nor the Fernet key, nor the JWT secret or the API secret key."""
    assert secret_names(example) == [], secret_names(example)
    services = load_compose(example)["services"]
    task_code_may_not = {"postgres_password", "fernet_key", "jwt_secret", "api_secret_key"}
    settings_not = {n for n in (*deploy.SECRETS, *deploy.URL_SECRETS) if "CELERY" not in n}
    for worker in ("worker-1", "worker-2"):
        assert not secret_files_of(services[worker]) & task_code_may_not
        assert not {k.removesuffix("_CMD") for k in services[worker]["environment"]} & settings_not
    assert {name: secret_files_of(s) for name, s in services.items()} == {n: set(r) for n, r in ROLE_SECRETS.items()}


def test_the_e2e_script_imports_against_todays_product() -> None:
    """docker/e2e is not in CI (it builds images): at least its imports must match the product's modules (a moved
    function once broke it unseen)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fleet_doctor_e2e", DOCKER / "e2e.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(module.main) and callable(module.check_secrets_kept)
