"""fleet_doctor.deploy: what the container deployment's airflow-init runs (docker/compose.yaml), against a real fleet
lab's inventory and a real ``airflow`` CLI on SQLite in a temporary AIRFLOW_HOME."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor import deploy
from fleet_doctor.inventory import InventoryError
from fleet_doctor.inventory import load as load_inventory
from fleet_lab import fleet

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
MASTER = "spark://127.0.0.1:27077"
API = "http://127.0.0.1:28099"
OPERATOR = {"admin": "adm1n-Secret-pw", "approver": "appr0ver-Secret-pw"}
USERS = f"admin:admin,approver:op,{deploy.READER}:viewer"


def clean_environ() -> dict[str, str]:
    """This process's environment without any Airflow or Fleet Doctor setting (the tests' own come on top)."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW", "_AIRFLOW", "FLEET_DOCTOR")) and k != "PYTHONPATH"
    } | {"PYTHONPATH": str(REPO / "plugins"), "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin')}"}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[fleet.LabState]:
    """A real 2-broker ZooKeeper lab: its inventory.json is the one the product reads."""
    lab_dir = tmp_path_factory.mktemp("deploy") / "lab"
    state = fleet.up(lab_dir, brokers=2)
    try:
        yield state
    finally:
        fleet.down(lab_dir)


def deployment(root: Path, lab: fleet.LabState) -> dict[str, str]:
    """The container's environment, its files under ``root``: the operator's passwords, a copy of the lab's SSH key
    where the container mounts it, the auth volume's passwords file, an Airflow home on SQLite."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "operator-passwords.json").write_text(json.dumps(OPERATOR))
    key = root / "ssh" / "id_key"
    key.parent.mkdir(exist_ok=True)
    shutil.copyfile(lab.path / "ssh" / "id_ed25519", key)
    key.chmod(0o600)
    home = root / "airflow"
    (root / "tmp").mkdir(exist_ok=True)
    return clean_environ() | {
        "TMPDIR": str(root / "tmp"),  # its own: another worker's init may have a temp file in /tmp meanwhile
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        deploy.USERS: USERS,
        deploy.OPERATOR_PASSWORDS: str(root / "operator-passwords.json"),
        deploy.PASSWORDS_FILE: str(root / "auth" / "passwords.json"),
        deploy.SSH_KEY: str(key),
        deploy.SPARK_MASTER: MASTER,
        deploy.API_BASE_URL: API,
        "FLEET_DOCTOR_INVENTORY": str(lab.inventory_path),
    }


def test_init_refuses_placeholder_or_short_secrets() -> None:
    """Issue 28 item 12: .env.example's change-me (or a short value) for the JWT secret, the API secret, the Fernet
    key or a password in the database or broker URL stops init before anything starts, naming the variable."""
    good = {
        "AIRFLOW__API_AUTH__JWT_SECRET": "j" * 43,
        "AIRFLOW__API__SECRET_KEY": "k" * 43,
        "AIRFLOW__CORE__FERNET_KEY": "f" * 44,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql+psycopg2://airflow:" + "p" * 22 + "@127.0.0.1:5432/airflow",
        "AIRFLOW__CELERY__BROKER_URL": "redis://:" + "r" * 22 + "@127.0.0.1:6379/0",
    }
    assert deploy.step_secrets(good).startswith("secrets: 5 checked")
    assert deploy.step_secrets({}) == "secrets: 0 checked (none set)"  # e.g. SQLite, one process
    for name, bad in (
        ("AIRFLOW__API_AUTH__JWT_SECRET", "change-me"),
        ("AIRFLOW__API__SECRET_KEY", "short"),
        ("AIRFLOW__CORE__FERNET_KEY", "change-me"),
        ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "postgresql+psycopg2://airflow:change-me@127.0.0.1:5432/airflow"),
        ("AIRFLOW__CELERY__BROKER_URL", "redis://:change-me@127.0.0.1:6379/0"),
    ):
        with pytest.raises(deploy.DeployError, match=name):
            deploy.step_secrets(good | {name: bad})


# ---- hostname
def test_secret_files_are_made_once_and_read_through_cmd_settings(tmp_path: Path) -> None:
    """Issue 28 item 12: ``deploy secrets`` makes each secret file once (0440); init resolves every secret setting
    through its ``_CMD`` as Airflow does, checks each file, and refuses a placeholder file (naming it) or a secret
    set literally in the environment."""
    secrets_dir = tmp_path / "secrets"
    assert deploy.write_secrets(secrets_dir) == list(deploy.SECRET_FILES)
    before = {p.name: p.read_bytes() for p in secrets_dir.iterdir()}
    assert all((secrets_dir / n).stat().st_mode & 0o777 == 0o440 for n in deploy.SECRET_FILES)
    assert deploy.write_secrets(secrets_dir) == [] and {p.name: p.read_bytes() for p in secrets_dir.iterdir()} == before
    read = lambda name: f"sh -c 'printf %s \"$(cat {secrets_dir / name})\"'"  # noqa: E731
    env = {
        deploy.SECRETS_DIR: str(secrets_dir),
        "AIRFLOW__CORE__FERNET_KEY_CMD": read("fernet_key"),
        "AIRFLOW__API_AUTH__JWT_SECRET_CMD": read("jwt_secret"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD": (
            'sh -c \'printf "postgresql+psycopg2://airflow:%s@127.0.0.1:1/airflow" '
            f'"$(cat {secrets_dir}/postgres_password)"\''
        ),
    }
    line = deploy.step_secrets(env)
    assert line.startswith("secrets: 9 checked") and "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" in line
    assert before["fernet_key"].decode().strip() not in line  # names, never a value
    (secrets_dir / "jwt_secret").chmod(0o640)
    (secrets_dir / "jwt_secret").write_text("change-me\n")
    with pytest.raises(deploy.DeployError, match=rf"{secrets_dir}/jwt_secret is a placeholder"):
        deploy.step_secrets(env)
    (secrets_dir / "jwt_secret").write_bytes(before["jwt_secret"])
    with pytest.raises(deploy.DeployError, match="AIRFLOW__API__SECRET_KEY set literally"):
        deploy.step_secrets(env | {"AIRFLOW__API__SECRET_KEY": "k" * 43})
    (secrets_dir / "redis_password").unlink()
    with pytest.raises(deploy.DeployError, match=rf"{secrets_dir}/redis_password: cannot read it"):
        deploy.step_secrets(env)


def test_hostname_is_the_containers_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.utils.net import getfqdn

    monkeypatch.setenv(deploy.HOSTNAME, "worker-2")
    assert deploy.hostname() == "worker-2"
    monkeypatch.setenv(deploy.HOSTNAME, " ")
    assert deploy.hostname() == getfqdn()
    monkeypatch.delenv(deploy.HOSTNAME)
    assert deploy.hostname() == getfqdn()


def test_airflow_records_the_hostname_callable() -> None:
    """Airflow's task SDK (what a worker's task reports as its hostname) imports the callable the compose file
    names."""
    env = clean_environ() | {
        "AIRFLOW__CORE__HOSTNAME_CALLABLE": "fleet_doctor.deploy.hostname",
        deploy.HOSTNAME: "worker-1",
    }
    code = "from airflow.sdk.api.client import get_hostname; print(get_hostname())"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "worker-1"


# ---- step 1: passwords
def test_passwords_step_writes_every_user_and_keeps_the_reader(tmp_path: Path, lab: fleet.LabState) -> None:
    env = deployment(tmp_path, lab)
    target = Path(env[deploy.PASSWORDS_FILE])
    line = deploy.step_passwords(env)
    first = json.loads(target.read_text())
    assert set(first) == {"admin", "approver", deploy.READER}
    assert {u: first[u] for u in OPERATOR} == OPERATOR
    assert len(first[deploy.READER]) >= 16 and first[deploy.READER] not in OPERATOR.values()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert "new password" in line and str(target) in line
    assert not any(pw in line for pw in first.values())

    # a second run (the next `docker-compose up`): the operator changed a password, the reader keeps its own
    Path(env[deploy.OPERATOR_PASSWORDS]).write_text(json.dumps(OPERATOR | {"admin": "rotated-Secret-pw"}))
    target.chmod(0o644)
    line = deploy.step_passwords(env)
    second = json.loads(target.read_text())
    assert second == first | {"admin": "rotated-Secret-pw"}
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert "kept password" in line and not any(pw in line for pw in second.values())
    assert sorted(p.name for p in target.parent.iterdir()) == ["passwords.json"]  # no temporary file left


def test_passwords_step_refuses_bad_input(tmp_path: Path, lab: fleet.LabState) -> None:
    env = deployment(tmp_path, lab)
    source = Path(env[deploy.OPERATOR_PASSWORDS])
    target = Path(env[deploy.PASSWORDS_FILE])

    def refused(match: str, **changes: str) -> None:
        with pytest.raises(deploy.DeployError, match=match):
            deploy.step_passwords(env | changes)
        assert not target.exists()

    refused(f"{tmp_path / 'nowhere.json'}: cannot read", **{deploy.OPERATOR_PASSWORDS: str(tmp_path / "nowhere.json")})
    source.write_text('{"admin": "x",')
    refused(f"{source}: the Airflow users' passwords: not JSON")
    source.write_text('["admin"]')
    refused(f"{source}: .*must be a JSON object")
    source.write_text(json.dumps({"admin": "", "approver": "y"}))
    refused(f"{source}: .*the password of admin must be a non-empty string")
    source.write_text(json.dumps({"admin": "adm1n-Secret-pw"}))
    refused(f"{source}: no password for the Airflow user\\(s\\) approver")
    source.write_text(json.dumps(OPERATOR))
    refused(f"must list the reader, {deploy.READER}:viewer", **{deploy.USERS: "admin:admin,approver:op"})
    refused("'approver' is not user:role", **{deploy.USERS: f"admin:admin,approver,{deploy.READER}:viewer"})
    refused(f"{deploy.USERS} is not set", **{deploy.USERS: ""})
    target.parent.mkdir()
    target.write_text("not json")
    with pytest.raises(deploy.DeployError, match=f"{target}: the simple auth manager's passwords file: not JSON"):
        deploy.step_passwords(env)


# ---- step 4: connections
def test_connections_are_the_inventorys_with_the_containers_key(tmp_path: Path, lab: fleet.LabState) -> None:
    env = deployment(tmp_path, lab)
    with pytest.raises(deploy.DeployError, match=f"no password for {deploy.READER} yet: run .* init"):
        deploy.environ_connections(env)
    deploy.step_passwords(env)
    reader = json.loads(Path(env[deploy.PASSWORDS_FILE]).read_text())[deploy.READER]
    conns = deploy.environ_connections(env)

    expected = load_inventory(lab.inventory_path).airflow_connections()
    ssh = [c for c, v in expected.items() if v["conn_type"] == "ssh"]
    assert sorted(ssh) == ["kafka_ssh_lab_1", "kafka_ssh_lab_2"]
    for cid in ssh:
        assert expected[cid]["extra"]["key_file"] == str(lab.path / "ssh" / "id_ed25519")  # the operator's path
        assert conns[cid]["extra"]["key_file"] == env[deploy.SSH_KEY]
        assert conns[cid]["extra"]["host_key"] == lab.broker(int(cid[-1])).host_key  # pinned keys kept
        rest = {k: v for k, v in conns[cid]["extra"].items() if k != "key_file"}
        assert rest == {k: v for k, v in expected[cid]["extra"].items() if k != "key_file"}
        assert {k: v for k, v in conns[cid].items() if k != "extra"} == {
            k: v for k, v in expected[cid].items() if k != "extra"
        }
    assert conns["kafka_zk_lab"] == expected["kafka_zk_lab"]
    assert conns["kafka_zk_lab"]["extra"]["connect"] == lab.zookeeper
    assert conns["spark_default"] == {"conn_type": "spark", "host": MASTER, "extra": {"deploy-mode": "client"}}
    assert conns["fleet_doctor_airflow_api"] == {
        "conn_type": "http",
        "host": API,
        "login": deploy.READER,
        "password": reader,
    }
    assert sorted(conns) == sorted([*expected, "spark_default", "fleet_doctor_airflow_api"])

    # the approvals connection is the one Settings names
    other = deploy.environ_connections(env | {"FLEET_DOCTOR_AIRFLOW_API_CONN": "approvals_api"})
    assert "approvals_api" in other and "fleet_doctor_airflow_api" not in other


def test_connections_command_writes_what_init_imports(
    tmp_path: Path, lab: fleet.LabState, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = deployment(tmp_path, lab)
    deploy.step_passwords(env)
    for k in [k for k in os.environ if k.startswith(("AIRFLOW", "FLEET_DOCTOR"))]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "review" / "connections.json"
    out.parent.mkdir()
    assert deploy.main(["connections", "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == deploy.environ_connections(env)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    said = capsys.readouterr()
    assert str(out) in said.out and said.err == ""
    assert not any(pw in said.out for pw in json.loads(Path(env[deploy.PASSWORDS_FILE]).read_text()).values())

    monkeypatch.setenv("FLEET_DOCTOR_INVENTORY", str(tmp_path / "missing.json"))
    assert deploy.main(["connections", "--out", str(out)]) == 1
    assert f"{tmp_path / 'missing.json'}: no such inventory file or directory" in capsys.readouterr().err


def test_a_missing_key_file_is_named(tmp_path: Path, lab: fleet.LabState) -> None:
    env = deployment(tmp_path, lab)
    deploy.step_passwords(env)
    gone = tmp_path / "ssh" / "id_missing"
    with pytest.raises(deploy.DeployError, match=f"{gone}: cannot read the SSH private key as uid 0 .*chown"):
        deploy.environ_connections(env | {deploy.SSH_KEY: str(gone)})


def test_a_key_the_containers_user_cannot_read_is_named(lab: fleet.LabState) -> None:
    """As the image's user (uid 50000), a key mounted 0600 for root: a clear error, exit 1."""
    python = shutil.which("python3", path="/usr/bin:/bin")
    if os.getuid() != 0 or not shutil.which("setpriv") or python is None:
        pytest.skip("needs root, setpriv and a system python3 to run as uid 50000")
    root = Path(tempfile.mkdtemp(prefix="fleet-doctor-deploy-"))  # the pytest tmp dir is root's only
    try:
        root.chmod(0o755)
        # uid 50000 reaches neither a checkout under a private directory (a clone in /root) nor the venv's interpreter
        # there: the library goes along in the world-readable dir, as the image holds it, run by the system's python3
        # (the command needs only the standard library)
        shutil.copytree(REPO / "plugins" / "fleet_doctor", root / "lib" / "fleet_doctor")
        env = deployment(root, lab) | {"HOME": str(root), "PYTHONPATH": str(root / "lib")}
        key = Path(env[deploy.SSH_KEY])
        key.parent.chmod(0o755)
        args = ["setpriv", "--reuid=50000", "--regid=50000", "--clear-groups", python]
        r = subprocess.run(
            [*args, "-m", "fleet_doctor.deploy", "connections", "--out", str(root / "c.json")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 1, r.stdout + r.stderr
        assert r.stderr.strip() == (
            f"fleet_doctor.deploy: {key}: cannot read the SSH private key as uid 50000 (Permission denied): mount it "
            "readable by the container's user (chown 50000 or chmod it; keep it 0600 for a private key)"
        )
        assert not (root / "c.json").exists()
    finally:
        shutil.rmtree(root)


def test_a_spark_master_with_spaces_is_refused(tmp_path: Path, lab: fleet.LabState) -> None:
    env = deployment(tmp_path, lab)
    deploy.step_passwords(env)
    with pytest.raises(deploy.DeployError, match=f"{deploy.SPARK_MASTER}: a Spark master URL has no spaces"):
        deploy.environ_connections(env | {deploy.SPARK_MASTER: "spark://a:7077 --conf x=y"})


# ---- the whole init against a real airflow CLI on SQLite
def airflow_json(env: dict[str, str], *args: str) -> Any:
    r = subprocess.run([str(VENV_BIN / "airflow"), *args, "-o", "json"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(r.stdout[r.stdout.index("[") :])


def run_init(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleet_doctor.deploy", "init"], env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def initialised(tmp_path_factory: pytest.TempPathFactory, lab: fleet.LabState) -> dict[str, Any]:
    """``init`` run twice on one environment (the second as on every later start), then once more with the key
    mounted elsewhere and the pool resized."""
    env = deployment(tmp_path_factory.mktemp("init"), lab)
    runs = [run_init(env), run_init(env)]
    after_two = {
        "passwords": Path(env[deploy.PASSWORDS_FILE]).read_text(),
        "connections": airflow_json(env, "connections", "list"),
        "pools": airflow_json(env, "pools", "list"),
    }
    moved = Path(env[deploy.SSH_KEY]).with_name("moved_key")
    shutil.copyfile(env[deploy.SSH_KEY], moved)
    env3 = env | {deploy.SSH_KEY: str(moved), "FLEET_DOCTOR_AUDIT_POOL_SLOTS": "8"}
    runs.append(run_init(env3))
    return {"env": env, "env3": env3, "runs": runs, "after_two": after_two}


@pytest.mark.slow
def test_init_runs_every_step_and_says_so(initialised: dict[str, Any]) -> None:
    secrets = [*OPERATOR.values(), json.loads(initialised["after_two"]["passwords"])[deploy.READER]]
    for r in initialised["runs"]:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        lines = r.stdout.strip().splitlines()
        assert [line.split(":")[0] for line in lines] == ["secrets", "passwords", "database", "pool", "connections"], (
            lines
        )
        assert not any(pw in r.stdout + r.stderr for pw in secrets)
    first, second, third = (r.stdout.strip().splitlines() for r in initialised["runs"])
    assert "new password" in first[1] and "kept password" in second[1]
    assert first[3] == second[3] == "pool: kafka_fleet_audit with 32 slots" and third[3].endswith("with 8 slots")
    assert first[4] == (
        f"connections: imported 5 (2 SSH with key {initialised['env'][deploy.SSH_KEY]}, kafka_zk_lab, spark_default, "
        "fleet_doctor_airflow_api)"
    )
    assert not list(Path(initialised["env"]["TMPDIR"]).glob("fleet-doctor-connections-*"))  # the temp file is gone


@pytest.mark.slow
def test_init_is_idempotent(initialised: dict[str, Any]) -> None:
    env = initialised["env"]
    before = initialised["after_two"]
    conns = {c["conn_id"]: c for c in before["connections"]}
    assert sorted(conns) == sorted(
        ["fleet_doctor_airflow_api", "kafka_ssh_lab_1", "kafka_ssh_lab_2", "kafka_zk_lab", "spark_default"]
    )
    pools = {p["pool"]: p for p in before["pools"]}
    assert pools["kafka_fleet_audit"]["slots"] == "32"
    assert pools["kafka_fleet_audit"]["description"] == deploy.POOL_DESCRIPTION
    stored = json.loads(before["passwords"])
    assert set(stored) == {"admin", "approver", deploy.READER}
    assert stat.S_IMODE(Path(env[deploy.PASSWORDS_FILE]).stat().st_mode) == 0o600


@pytest.mark.slow
def test_a_later_init_replaces_the_connections_and_the_pool(initialised: dict[str, Any]) -> None:
    env3 = initialised["env3"]
    (pool,) = airflow_json(env3, "pools", "get", "kafka_fleet_audit")
    assert pool["slots"] == "8"
    for cid in ("kafka_ssh_lab_1", "kafka_ssh_lab_2"):
        (conn,) = airflow_json(env3, "connections", "get", cid)
        assert conn["extra_dejson"]["key_file"] == env3[deploy.SSH_KEY]
    assert json.loads(Path(env3[deploy.PASSWORDS_FILE]).read_text()) == json.loads(
        initialised["after_two"]["passwords"]
    )


@pytest.mark.slow
def test_the_imported_connections_resolve_as_the_tasks_read_them(
    initialised: dict[str, Any], lab: fleet.LabState
) -> None:
    """Through the providers' hooks, reading Airflow's database as a server process does: the detect task's
    master, a probe's SSH settings, the approvals connection's URL and user."""
    env = initialised["env3"] | {"_AIRFLOW_PROCESS_CONTEXT": "server"}
    code = (
        "import json\n"
        "from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook\n"
        "from airflow.providers.ssh.hooks.ssh import SSHHook\n"
        "from airflow.sdk import Connection\n"
        "from fleet_doctor.repair.approval import api_base\n"
        "spark = SparkSubmitHook(conn_id='spark_default')._connection\n"
        "ssh = SSHHook(ssh_conn_id='kafka_ssh_lab_2')\n"
        "api = Connection.get('fleet_doctor_airflow_api')\n"
        "print(json.dumps({'master': spark['master'], 'deploy_mode': spark['deploy_mode'], 'key_file': ssh.key_file,"
        " 'host': ssh.remote_host, 'port': ssh.port, 'user': ssh.username, 'host_key': ssh.host_key.get_base64(),"
        " 'check': not ssh.no_host_key_check, 'api': api_base(api), 'login': api.login, 'password': api.password}))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    broker = lab.broker(2)
    reader = json.loads(Path(env[deploy.PASSWORDS_FILE]).read_text())[deploy.READER]
    assert got == {
        "master": MASTER,
        "deploy_mode": "client",
        "key_file": env[deploy.SSH_KEY],
        "host": "127.0.0.1",
        "port": broker.ssh_port,
        "user": lab.user,
        "host_key": broker.host_key.split()[1],
        "check": True,
        "api": API,
        "login": deploy.READER,
        "password": reader,
    }


def test_init_stops_at_the_first_bad_step(tmp_path: Path, lab: fleet.LabState) -> None:
    """A missing operator passwords file: the first step fails, naming it; Airflow is not touched."""
    env = deployment(tmp_path, lab) | {deploy.OPERATOR_PASSWORDS: str(tmp_path / "absent.json")}
    r = run_init(env)
    assert r.returncode == 1 and r.stdout.splitlines() == ["secrets: 0 checked (none set)"]  # SQLite: none to check
    assert r.stderr.startswith(f"fleet_doctor.deploy: {tmp_path / 'absent.json'}: cannot read the Airflow users'")
    assert not Path(env["AIRFLOW_HOME"]).exists()


def test_inventory_errors_name_the_file(tmp_path: Path, lab: fleet.LabState) -> None:
    env = deployment(tmp_path, lab)
    deploy.step_passwords(env)
    bad = tmp_path / "inventory.json"
    bad.write_text("{}")
    with pytest.raises(InventoryError, match=f"{bad}: missing field 'inventory_version'"):
        deploy.environ_connections(env | {"FLEET_DOCTOR_INVENTORY": str(bad)})


def test_a_fleets_connections_are_every_clusters_a_broken_inventory_said(
    tmp_path: Path, lab: fleet.LabState, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory of inventories: every cluster's connections (the lab's and a second cluster's), and a broken file
    named on stderr without hiding the others."""
    from harness import inventories

    env = deployment(tmp_path, lab)
    deploy.step_passwords(env)
    fleet_dir = tmp_path / "fleet"
    fleet_dir.mkdir()
    (fleet_dir / "lab.json").symlink_to(Path(lab.dir) / "inventory.json")
    inventories.write(fleet_dir / "other.json", inventories.inventory("other", brokers=2))
    inventories.write(fleet_dir / "broken.json", "{")
    conns = deploy.environ_connections(env | {"FLEET_DOCTOR_INVENTORY": str(fleet_dir)})
    assert {f"kafka_ssh_lab_{b.id}" for b in lab.brokers} | {"kafka_ssh_other_1", "kafka_ssh_other_2"} <= set(conns)
    assert {c["extra"]["key_file"] for k, c in conns.items() if k.startswith("kafka_ssh_")} == {env[deploy.SSH_KEY]}
    assert f"no connections for {fleet_dir / 'broken.json'}: not JSON" in capsys.readouterr().err
