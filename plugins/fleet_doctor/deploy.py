"""What a container deployment (docker/compose.yaml) runs once before Airflow starts, and the hostname it records.

    python -m fleet_doctor.deploy init                  # the airflow-init service: idempotent, one line per step
    python -m fleet_doctor.deploy connections --out FILE  # only the connections JSON, for an operator to review
    python -m fleet_doctor.deploy secrets --dir DIR       # the deployment's secret files, made once on the host

``init``, from the container's environment:

0. secrets: with ``FLEET_DOCTOR_SECRETS`` (the container's directory of secret files) every secret file is present
   and strong, and no secret setting is a literal in the environment (each comes through its ``_CMD``); every
   secret setting Airflow will read (the variable or its ``_CMD``) is neither a placeholder nor short.

1. passwords: every user of ``AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS`` but the reader (``READER``, a viewer the
   repair's acting tasks read approvals as) takes its password from the operator's file
   ``FLEET_DOCTOR_AIRFLOW_PASSWORDS`` (JSON ``{"user": "password"}``); the reader keeps the one the simple auth
   manager's file (``AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE``) already holds, else gets a random one.
   That file is written atomically, mode 0600 (the api-server finds every user there and generates none).
2. ``airflow db migrate``.
3. ``airflow pools set``: the audit's pool, named and sized by ``Settings`` (FLEET_DOCTOR_AUDIT_POOL[_SLOTS]).
4. connections: the inventory's (``FLEET_DOCTOR_INVENTORY``: an SSH connection per broker and controller-only node,
   ZooKeeper's) with every SSH key file replaced by ``FLEET_DOCTOR_SSH_KEY`` (the inventory names the operator's
   host paths; the key is mounted elsewhere in the container), ``spark_default`` (``FLEET_DOCTOR_SPARK_MASTER``,
   client deploy mode) and the approvals connection (``Settings.airflow_api_conn``: ``AIRFLOW__API__BASE_URL`` as
   the reader), imported with ``airflow connections import --overwrite`` from a 0600 temporary file.

No password is printed, put on a command line or left in a file other than the two 0600 ones above.
``hostname()`` is Airflow's ``[core] hostname_callable`` in the containers: they share the host's network and so its
hostname, and ``FLEET_DOCTOR_HOSTNAME`` (the compose service's name) makes a task instance's ``hostname`` say
which worker ran it.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fleet_doctor import inventory as inv
from fleet_doctor import spark_auth
from fleet_doctor.settings import Settings, SettingsError
from fleet_doctor.store import write_atomic

READER = "fleet_doctor_reader"  # a viewer: reads the repair's HITL details (repair.approval) through the REST API
HOSTNAME = "FLEET_DOCTOR_HOSTNAME"
USERS = "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"  # "user:role,..." (the simple auth manager's)
PASSWORDS_FILE = "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"  # the simple auth manager's file (written here)
OPERATOR_PASSWORDS = "FLEET_DOCTOR_AIRFLOW_PASSWORDS"  # the operator's file (read only)
SSH_KEY = "FLEET_DOCTOR_SSH_KEY"
SPARK_MASTER = "FLEET_DOCTOR_SPARK_MASTER"
API_BASE_URL = "AIRFLOW__API__BASE_URL"
SPARK_CONN = "spark_default"  # the audit DAG's detect task submits through it
POOL_DESCRIPTION = "Fleet Doctor: concurrent broker probes"


class DeployError(ValueError):
    """The deployment's environment or files are unusable (the message names the variable or file and the fix)."""


def hostname() -> str:
    """``FLEET_DOCTOR_HOSTNAME``, else the name Airflow records by default (its patched ``getfqdn``)."""
    name = (os.environ.get(HOSTNAME) or "").strip()
    if name:
        return name
    from airflow.utils.net import getfqdn  # only here: the deploy CLI itself needs no Airflow import

    return str(getfqdn())


def _require(env: Mapping[str, str], name: str) -> str:
    value = (env.get(name) or "").strip()
    if not value:
        raise DeployError(f"{name} is not set")
    return value


def configured_users(spec: str) -> list[str]:
    """The user names of the simple auth manager's ``user:role[:teams],...`` (in order)."""
    names = []
    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            continue
        name, _, role = entry.partition(":")
        if not name.strip() or not role.strip():
            raise DeployError(f"{USERS}: {entry!r} is not user:role")
        names.append(name.strip())
    return names


def read_passwords(path: Path, what: str) -> dict[str, str]:
    """A passwords file: a JSON object of user name -> non-empty password string."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise DeployError(f"{path}: cannot read {what}: {e.strerror or e}") from e
    except ValueError as e:
        raise DeployError(f"{path}: {what}: not JSON ({e})") from e
    if not isinstance(data, dict):
        raise DeployError(f'{path}: {what} must be a JSON object {{"user": "password", ...}}')
    bad = sorted(u for u, p in data.items() if not isinstance(p, str) or not p)
    if bad:
        raise DeployError(f"{path}: {what}: the password of {', '.join(bad)} must be a non-empty string")
    return dict(data)


def passwords(
    users: Sequence[str], given: Mapping[str, str], current: Mapping[str, str], source: Path
) -> dict[str, str]:
    """Every configured user's password: the operator's (``given``, read from ``source``) for each but the reader;
    the reader keeps its ``current`` one, else gets a random one."""
    if READER not in users:
        raise DeployError(f"{USERS} must list the reader, {READER}:viewer (the repair reads approvals as it)")
    missing = [u for u in users if u != READER and u not in given]
    if missing:
        raise DeployError(f"{source}: no password for the Airflow user(s) {', '.join(missing)} (from {USERS})")
    out = {u: given[u] for u in users if u != READER}
    out[READER] = current.get(READER) or secrets.token_urlsafe(18)
    return out


def write_passwords(path: Path, table: Mapping[str, str]) -> None:
    """The simple auth manager's passwords file, replaced atomically, mode 0600 (the owner's only)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, (json.dumps(dict(table)) + "\n").encode("utf-8"), mode=0o600)
    except OSError as e:
        raise DeployError(f"{path}: cannot write the Airflow passwords file: {e.strerror or e}") from e


# the deployment's shared secrets as Airflow reads them: each container must get the same strong value
SECRETS = {
    "AIRFLOW__API_AUTH__JWT_SECRET": 32,  # signs every UI and API token: a guessable one mints an admin's
    "AIRFLOW__API__SECRET_KEY": 32,
    "AIRFLOW__CORE__FERNET_KEY": 44,  # 32 bytes, url-safe base64
}
# the passwords inside URLs, at least this long
URL_SECRETS = {
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": 16,
    "AIRFLOW__CELERY__BROKER_URL": 16,
    "AIRFLOW__CELERY__RESULT_BACKEND": 16,
}
PLACEHOLDERS = frozenset({"change-me", "changeme", "secret", "password", "airflow", "admin", "redis", "postgres"})
SECRETS_DIR = "FLEET_DOCTOR_SECRETS"  # the container's directory of secret files (airflow-init's: all of them)
# the deployment's secret files (docker/compose.yaml mounts each where its role needs it): name -> a fresh value
SECRET_FILES: dict[str, Callable[[], str]] = {
    "postgres_password": lambda: secrets.token_urlsafe(24),
    "redis_password": lambda: secrets.token_urlsafe(24),
    "fernet_key": lambda: base64.urlsafe_b64encode(os.urandom(32)).decode(),
    "jwt_secret": lambda: secrets.token_urlsafe(32),
    "api_secret_key": lambda: secrets.token_urlsafe(32),
    "spark_secret": lambda: secrets.token_urlsafe(32),
}
SECRET_FILE_LEAST = 16  # characters, any of the files


def write_secrets(directory: Path) -> list[str]:
    """Each of ``SECRET_FILES`` missing in ``directory`` made with a fresh value (0440, the root group's: the
    containers read them as members of group 0); one that exists is kept (to rotate one, remove it first). The
    names written."""
    directory.mkdir(mode=0o750, parents=True, exist_ok=True)
    st = directory.stat()
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise DeployError(
            f"{directory}: not this user's, or writable by others: the secrets' directory must be neither"
        )
    written = []
    for name, fresh in SECRET_FILES.items():
        path = directory / name
        if path.exists():
            continue
        write_atomic(path, (fresh() + "\n").encode("ascii"), mode=0o440)
        if os.geteuid() == 0:
            os.chown(path, 0, 0)
        written.append(name)
    return written


def secret_value(env: Mapping[str, str], name: str) -> str | None:
    """Airflow's setting ``name`` as Airflow resolves it: the variable itself, else its ``_CMD`` run (no shell but
    the one it names; its output is never printed), else None."""
    if name in env:
        return env[name]
    command = env.get(f"{name}_CMD")
    if command is None:
        return None
    r = subprocess.run(shlex.split(command), capture_output=True, text=True, check=False, env=dict(env))
    if r.returncode != 0:
        raise DeployError(f"{name}_CMD exited {r.returncode}: {r.stderr.strip()[-300:]}")
    return r.stdout


def step_secrets(env: Mapping[str, str]) -> str:
    """Step 0: refuse a placeholder (``.env.example``'s ``change-me``) or a short secret before anything starts;
    returns its line (names, never a value)."""
    from urllib.parse import urlsplit

    problems, checked = [], []
    files = env.get(SECRETS_DIR)
    if files:  # a container deployment: secrets come from files, never a literal in the environment
        literal = [n for n in (*SECRETS, *URL_SECRETS) if n in env]
        if literal:
            problems.append(f"{', '.join(literal)} set literally: set {literal[0]}_CMD reading a file of {files}")
        for name in SECRET_FILES:
            path = Path(files) / name
            if name == "spark_secret":  # as the Spark daemons read it (fleet_doctor.spark_auth): 32+ characters
                try:
                    spark_auth.read_secret(path)
                    checked.append(str(path))
                except spark_auth.SparkAuthError as e:
                    problems.append(str(e))
                continue
            try:
                value = path.read_text(encoding="ascii").strip()
            except (OSError, UnicodeDecodeError) as e:
                problems.append(f"{path}: cannot read it ({getattr(e, 'strerror', None) or e})")
                continue
            checked.append(str(path))
            if value.lower() in PLACEHOLDERS or len(value) < SECRET_FILE_LEAST or not value.isascii():
                problems.append(f"{path} is a placeholder or shorter than {SECRET_FILE_LEAST} characters")
    for name, least in SECRETS.items():
        value = secret_value(env, name)
        if value is None:
            continue
        checked.append(name)
        if value.strip().lower() in PLACEHOLDERS or len(value.strip()) < least:
            problems.append(f"{name} is a placeholder or shorter than {least} characters")
    for name, least in URL_SECRETS.items():
        url = secret_value(env, name)
        password = urlsplit(url.strip()).password if url and "://" in url else None
        if password is None:
            continue
        checked.append(name)
        if password.lower() in PLACEHOLDERS or len(password) < least:
            problems.append(f"the password in {name} is a placeholder or shorter than {least} characters")
    if problems:
        raise DeployError("secrets: " + "; ".join(problems) + ": make strong ones (docker/README.md, Secrets)")
    return f"secrets: {len(checked)} checked ({', '.join(checked) or 'none set'})"


def step_passwords(env: Mapping[str, str]) -> str:
    """Step 1; returns its line (user names, never a password)."""
    users = configured_users(_require(env, USERS))
    source = Path(_require(env, OPERATOR_PASSWORDS))
    target = Path(_require(env, PASSWORDS_FILE))
    given = read_passwords(source, "the Airflow users' passwords")
    current = read_passwords(target, "the simple auth manager's passwords file") if target.exists() else {}
    table = passwords(users, given, current, source)
    write_passwords(target, table)
    kept = "kept" if current.get(READER) else "new"
    return f"passwords: {target} (0600) holds {', '.join(users)} ({READER}: {kept} password)"


def check_readable(path: Path, what: str) -> None:
    """``path`` can be opened and read by this process (uid ``os.getuid()``), else a DeployError saying how."""
    try:
        with path.open("rb") as f:
            f.read(1)
    except OSError as e:
        raise DeployError(
            f"{path}: cannot read {what} as uid {os.getuid()} ({e.strerror or e}): mount it readable by the "
            f"container's user (chown {os.getuid()} or chmod it; keep it 0600 for a private key)"
        ) from e


def connections(
    inventories: Iterable[inv.Inventory],
    key_file: str,
    spark_master: str,
    api_base: str,
    api_conn: str,
    reader_password: str,
) -> dict[str, dict[str, Any]]:
    """The connections in ``airflow connections import`` JSON form: every inventory's (each cluster's connection ids
    name it), each SSH one's ``key_file``
    replaced by ``key_file``; ``spark_default`` on ``spark_master`` (the whole master URL as host: the Spark
    provider takes a host with ``://`` as the master as is, so ``spark://h:7077``, ``local[2]`` or a list of
    masters come out unchanged); ``api_conn`` for the reader on ``api_base``."""
    out: dict[str, dict[str, Any]] = {}
    for inventory in inventories:
        out.update(inventory.airflow_connections())
    for conn in out.values():
        if conn["conn_type"] == "ssh":
            conn["extra"] = {**conn["extra"], "key_file": key_file}
    out[SPARK_CONN] = {"conn_type": "spark", "host": spark_master, "extra": {"deploy-mode": "client"}}
    out[api_conn] = {"conn_type": "http", "host": api_base.rstrip("/"), "login": READER, "password": reader_password}
    return out


def environ_connections(env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """``connections()`` from the deployment's environment (the reader's password from the simple auth manager's
    file, which step 1 wrote); the SSH key must be readable here."""
    key = Path(_require(env, SSH_KEY))
    check_readable(key, "the SSH private key")
    master = _require(env, SPARK_MASTER)
    if any(c.isspace() for c in master):
        raise DeployError(f"{SPARK_MASTER}: a Spark master URL has no spaces ({master!r})")
    base = _require(env, API_BASE_URL)
    target = Path(_require(env, PASSWORDS_FILE))
    reader = read_passwords(target, "the simple auth manager's passwords file").get(READER) if target.exists() else None
    if not reader:
        raise DeployError(f"{target}: no password for {READER} yet: run `python -m fleet_doctor.deploy init` first")
    try:
        settings = Settings.from_env(env)
    except (SettingsError, ValueError) as e:
        raise DeployError(str(e)) from e
    fleet = inv.load_fleet(settings.inventory)
    if fleet.problems and not fleet.clusters:  # nothing to deploy: say why
        raise inv.InventoryError("; ".join(p.message for p in fleet.problems))
    for problem in fleet.problems:  # the other clusters' connections still go in (the fleet page shows it too)
        print(f"fleet-doctor deploy: no connections for {problem.message}", file=sys.stderr)
    return connections(fleet.clusters.values(), str(key), master, base, settings.airflow_api_conn, reader)


def write_connections(path: Path, conns: Mapping[str, Any]) -> None:
    """The connections JSON, mode 0600 (it holds the reader's password)."""
    try:
        write_atomic(path, (json.dumps(dict(conns), indent=2) + "\n").encode("utf-8"), mode=0o600)
    except OSError as e:
        raise DeployError(f"{path}: cannot write the connections file: {e.strerror or e}") from e


def airflow_exe() -> str:
    """The ``airflow`` next to this interpreter (the image's venv), else the one on PATH."""
    beside = Path(sys.executable).parent / "airflow"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("airflow")
    if not found:
        raise DeployError(f"no airflow command next to {sys.executable} nor on PATH")
    return found


def airflow(env: Mapping[str, str], *args: str) -> str:
    """Run ``airflow <args>`` (never with a secret among them); its output, or a DeployError with its tail."""
    r = subprocess.run(
        [airflow_exe(), *args], env=dict(env), stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-30:])
        raise DeployError(f"airflow {' '.join(args)} exited {r.returncode}:\n{tail}")
    return r.stdout


def step_migrate(env: Mapping[str, str]) -> str:
    airflow(env, "db", "migrate")
    return "database: airflow db migrate done"


def step_pool(env: Mapping[str, str]) -> str:
    try:
        settings = Settings.from_env(env)
    except (SettingsError, ValueError) as e:
        raise DeployError(str(e)) from e
    airflow(env, "pools", "set", settings.pool, str(settings.pool_slots), POOL_DESCRIPTION)
    return f"pool: {settings.pool} with {settings.pool_slots} slots"


def step_connections(env: Mapping[str, str]) -> str:
    conns = environ_connections(env)
    fd, name = tempfile.mkstemp(prefix="fleet-doctor-connections-", suffix=".json")  # 0600
    os.close(fd)
    try:
        write_connections(Path(name), conns)
        airflow(env, "connections", "import", "--overwrite", name)
    finally:
        Path(name).unlink(missing_ok=True)
    ssh = sum(c["conn_type"] == "ssh" for c in conns.values())
    return (
        f"connections: imported {len(conns)} ({ssh} SSH with key {env[SSH_KEY]}, "
        f"{', '.join(c for c, v in conns.items() if v['conn_type'] != 'ssh')})"
    )


def init(env: Mapping[str, str], say: Callable[[str], None] = print) -> None:
    """The steps in order, each saying what it did."""
    for step in (step_secrets, step_passwords, step_migrate, step_pool, step_connections):
        say(step(env))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fleet_doctor.deploy", description="Prepare Airflow in a container deployment (docker/)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("init", help="passwords file, airflow db migrate, the audit pool, the connections (idempotent)")
    conns = sub.add_parser("connections", help="only write the connections JSON init imports (mode 0600)")
    conns.add_argument("--out", required=True, type=Path, help="where to write it")
    made = sub.add_parser("secrets", help="make the deployment's secret files that are missing (0440, root group)")
    made.add_argument(
        "--dir", required=True, type=Path, help="FLEET_DOCTOR_SECRETS_DIR, e.g. /etc/kafka-fleet-doctor/secrets"
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "init":
            init(os.environ)
        elif args.command == "secrets":
            if os.geteuid() != 0:
                print(
                    "fleet_doctor.deploy: not root: the files are not the root group's (the containers read them "
                    "as group 0): run it as root",
                    file=sys.stderr,
                )
            written = write_secrets(args.dir)
            kept = [n for n in SECRET_FILES if n not in written]
            print(f"secrets: made {', '.join(written) or 'none'}; kept {', '.join(kept) or 'none'} (in {args.dir})")
        else:
            write_connections(args.out, environ_connections(os.environ))
            print(f"connections: wrote {args.out} (0600; it holds the {READER}'s password)")
    except (DeployError, inv.InventoryError) as e:
        print(f"fleet_doctor.deploy: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
