"""A live Airflow on 127.0.0.1: api-server, scheduler and dag-processor (``bin/dev ui`` adds the triggerer) as
separate processes (``LiveAirflow``), and a small REST client (``AirflowRest``, which ``LiveAirflow`` is) for what
the repair's acceptance tests and the operator's scripts do through the API: trigger a DAG, watch task states,
answer a human-in-the-loop request (approve / reject), clear a task to rerun it, each as a given user of the simple
auth manager (``AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS``, default ``admin:admin``). ``AirflowRest`` alone talks to
any Airflow by its URL, e.g. the container deployment's (docker/e2e.py).

    with LiveAirflow(env) as af:                       # env: fleet_lab.demo.airflow_environ(...)
        run = af.trigger("kafka_fleet_repair__lab", {"healthy_polls": 3})
        af.wait_task("kafka_fleet_repair__lab", run, "approve", {"awaiting_input"})
        af.approve("kafka_fleet_repair__lab", run, "approve")   # the request's own "Approve: ..." option
        af.wait_run("kafka_fleet_repair__lab", run)

Never ``airflow standalone`` (platform-notes: it binds 0.0.0.0 and survives SIGTERM). Nothing listens beyond
127.0.0.1: the api-server binds it, and the log server the scheduler and triggerer would start (it binds every
interface, with no setting to change that) is not started. Every process gets its
own session; ``stop()`` ends each by PID (SIGTERM, then SIGKILL for the process group and anything it forked).

The users' passwords are written before the api-server starts (the simple auth manager keeps those it finds in its
passwords file), together with a viewer, ``fleet_doctor_reader``, whose credentials go into the connection the
repair's acting tasks read approvals through (``fleet_doctor_airflow_api``, fleet_doctor.repair.approval).
``passwords`` sets chosen ones (``bin/dev ui``'s ``FLEET_DOCTOR_UI_PASSWORD``).

``start()`` waits until ``/api/v2/monitor/health`` says "healthy" for every component started: the UI's home page
shows a component green only then (a triggerer that never ran is ``null`` there, and red).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from fleet_doctor.deploy import READER
from fleet_lab.fleet import descendants
from fleet_lab.zk_server import free_port, pid_alive

COMPONENTS = ("api-server", "scheduler", "dag-processor")
SERVES_LOGS = ("scheduler", "triggerer")  # components that start Airflow's log server unless told not to
TRIGGERER = "triggerer"  # only for the UI's health badges (and deferrable operators): HITL needs none in 3.3
UI_COMPONENTS = (*COMPONENTS, TRIGGERER)
# each component's entry in /api/v2/monitor/health (the api-server answers it; its database check is "metadatabase")
HEALTH_KEYS = {
    "api-server": "metadatabase",
    "scheduler": "scheduler",
    "dag-processor": "dag_processor",
    TRIGGERER: "triggerer",
}
FINISHED = frozenset({"success", "failed"})
POLL_S = 0.5  # a wait for a run, a task or a request polls the REST API this often (a few ms a call)
USERS = "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"
PASSWORDS = "simple_auth_manager_passwords.json.generated"
# without a scheduler log to read, how long wait_for_approval waits after the request is listed (the scheduler took up
# to 6 s to receive the executor's report of the paused attempt on a busy 2-CPU machine)
REPORT_WAIT_S = 8.0
# user -> password: a mapping, a JSON file of it, or a callable returning it
Passwords = Mapping[str, str] | str | os.PathLike[str] | Callable[[], Mapping[str, str]]


class AirflowLiveError(RuntimeError):
    """The live stack did not come up, or an API call failed (the message says which and why; ``code``: the HTTP
    status of a refused call)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


def _kill(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class AirflowRest:
    """The REST client of an Airflow at ``base`` (its api-server's URL), acting as the simple auth manager's
    ``users`` (the first is the default) with ``passwords``: a mapping of user -> password, or a JSON file of it or
    a callable returning it, read when a user's token is first fetched (a file the api-server fills in later works)."""

    def __init__(self, base: str, passwords: Passwords, users: Sequence[str], approver: str | None = None) -> None:
        if not users:
            raise AirflowLiveError(f"no user to call {base} as")
        self.base = base.rstrip("/")
        self.users = list(users)
        self.approver = approver  # who answers approvals by default (None: the first user)
        self._passwords = passwords
        self._tokens: dict[str, str] = {}

    def password(self, user: str) -> str:
        """``user``'s password, read from the source now."""
        source = self._passwords
        if isinstance(source, str | os.PathLike):
            table: Mapping[str, str] = json.loads(Path(source).read_text())
            where = f" in {source}"
        else:
            table, where = (source() if callable(source) else source), ""
        if user not in table:
            raise AirflowLiveError(f"no password for the Airflow user {user!r}{where}")
        return table[user]

    def log_tail(self, name: str, n: int = 30) -> str:
        """The last ``n`` lines of a component's log ("" when the client sees none: override to read them)."""
        return ""

    def token(self, user: str | None = None) -> str:
        """A JWT of ``user`` (default: the first configured user)."""
        user = user or self.users[0]
        if user not in self._tokens:
            body = {"username": user, "password": self.password(user)}
            self._tokens[user] = self.api("POST", "/auth/token", body, auth=False)["access_token"]
        return self._tokens[user]

    def api(self, method: str, path: str, body: Any = None, auth: bool = True, user: str | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if auth:
            req.add_header("Authorization", f"Bearer {self.token(user)}")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")[:500]
            raise AirflowLiveError(f"{method} {path} as {user or self.users[0]} -> {e.code}: {text}", e.code) from e
        return json.loads(raw) if raw else None

    def wait_dag(self, dag_id: str, timeout: float = 120.0) -> None:
        """Until the dag-processor has parsed the DAG (and it has no import error)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            errors = self.api("GET", "/api/v2/importErrors").get("import_errors", [])
            bad = [e for e in errors if dag_id in json.dumps(e)]
            if bad:
                raise AirflowLiveError(f"{dag_id} has an import error: {bad[0].get('stack_trace', '')[-1500:]}")
            try:
                self.api("GET", f"/api/v2/dags/{dag_id}")
                return
            except AirflowLiveError:
                time.sleep(2)
        raise AirflowLiveError(f"{dag_id} not parsed within {timeout:.0f} s:\n{self.log_tail('dag-processor')}")

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None, user: str | None = None) -> str:
        """A manual run (its ``triggering_user_name``: ``user``, default the first configured user)."""
        self.wait_dag(dag_id)
        body = {"logical_date": None, "conf": conf or {}}
        run = self.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", body, user=user)
        return str(run["dag_run_id"])

    def run_state(self, dag_id: str, run_id: str) -> str:
        q = urllib.parse.quote(run_id, safe="")
        return str(self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{q}")["state"])

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        q = urllib.parse.quote(run_id, safe="")
        tis = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{q}/taskInstances")["task_instances"]
        return {t["task_id"]: t["state"] for t in tis}

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """Every task instance of a run, mapped ones included (task_id, map_index, state, start_date, end_date, ...)."""
        q = urllib.parse.quote(run_id, safe="")
        out: list[dict[str, Any]] = []
        while True:
            page = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{q}/taskInstances?limit=100&offset={len(out)}")
            out += page["task_instances"]
            if not page["task_instances"] or len(out) >= page["total_entries"]:
                return out

    def wait_task(self, dag_id: str, run_id: str, task_id: str, states: set[str], timeout: float = 600.0) -> str:
        deadline = time.monotonic() + timeout
        state: str | None = None
        while time.monotonic() < deadline:
            state = self.task_states(dag_id, run_id).get(task_id)
            if state in states:
                return state
            if state in {"failed", "upstream_failed", "skipped"} - states:
                raise AirflowLiveError(f"{dag_id}/{run_id}/{task_id} is {state}, waited for {sorted(states)}")
            time.sleep(POLL_S)
        raise AirflowLiveError(f"{dag_id}/{run_id}/{task_id} still {state} after {timeout:.0f} s")

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 900.0) -> str:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.run_state(dag_id, run_id)
            if state in FINISHED:
                return state
            time.sleep(POLL_S)
        raise AirflowLiveError(f"{dag_id}/{run_id} still {state} after {timeout:.0f} s")

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        return list(self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns?order_by=-run_after&limit=50")["dag_runs"])

    def wait_for_approval(self, dag_id: str, run_id: str, task_id: str, timeout: float = 600.0) -> dict[str, Any]:
        """Until the task waits for a human and its request is listed; returns the request (subject, body, options).

        Then until the scheduler has received the executor's report of the paused attempt: an answer that comes
        first makes the scheduler fail the task ("finished with state success, but the task instance's state
        attribute is queued", seen on 3.3.2; the report took up to 6 s on a busy 2-CPU machine). That is the
        scheduler's log line saying so, read through ``log_tail("scheduler")``; a client that sees no scheduler log
        (``log_tail`` gives "") waits a fixed ``REPORT_WAIT_S`` seconds after the request is listed instead."""
        self.wait_task(dag_id, run_id, task_id, {"awaiting_input"}, timeout)
        deadline = time.monotonic() + 60
        request = None
        while time.monotonic() < deadline and request is None:
            mine = [
                h
                for h in self.pending_approvals()
                if h["task_instance"]["dag_run_id"] == run_id and h["task_instance"]["task_id"] == task_id
            ]
            request = mine[0] if mine else None
            if request is None:
                time.sleep(POLL_S)
        if request is None:
            raise AirflowLiveError(f"{dag_id}/{run_id}/{task_id} awaits input but its request is not listed")
        reported = (
            f"Received executor event with state success for task instance TaskInstanceKey(dag_id='{dag_id}', "
            f"task_id='{task_id}', run_id='{run_id}'"
        )
        if not self.log_tail("scheduler", 2000):
            time.sleep(REPORT_WAIT_S)
            return dict(request)
        while time.monotonic() < deadline and reported not in self.log_tail("scheduler", 2000):
            time.sleep(POLL_S)
        time.sleep(1)
        return dict(request)

    def pending_approvals(self) -> list[dict[str, Any]]:
        return list(self.api("GET", "/api/v2/dags/~/dagRuns/~/hitlDetails?response_received=false")["hitl_details"])

    def respond(
        self, dag_id: str, run_id: str, task_id: str, option: str, map_index: int = -1, user: str | None = None
    ) -> Any:
        """Answer a human-in-the-loop request as ``user`` (default: the approver, else the first configured user), as
        the UI's Approve / Reject buttons do."""
        path = self._hitl_path(dag_id, run_id, task_id, map_index)
        return self.api("PATCH", path, {"chosen_options": [option]}, user=user or self.approver)

    def approve(self, dag_id: str, run_id: str, task_id: str, user: str | None = None) -> str:
        """Answer with the request's own approving option, the one option that starts with "Approve" (the repair's
        are e.g. "Approve: restart 3 brokers, change 6 files (plan 1f2e3d4c5b6a)"); returns the option chosen."""
        options = self.hitl_detail(dag_id, run_id, task_id)["options"]
        approving = [o for o in options if o.startswith("Approve")]
        if len(approving) != 1:
            raise AirflowLiveError(f"{dag_id}/{run_id}/{task_id}: not one approving option in {options}")
        self.respond(dag_id, run_id, task_id, approving[0], user=user)
        return approving[0]

    def reject(self, dag_id: str, run_id: str, task_id: str, user: str | None = None) -> None:
        """Answer "Reject"."""
        self.respond(dag_id, run_id, task_id, "Reject", user=user)

    def hitl_detail(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[str, Any]:
        """Airflow's record of a human-in-the-loop request and its answer (who, which option, when)."""
        return dict(self.api("GET", self._hitl_path(dag_id, run_id, task_id, map_index)))

    @staticmethod
    def _hitl_path(dag_id: str, run_id: str, task_id: str, map_index: int) -> str:
        q = urllib.parse.quote(run_id, safe="")
        return f"/api/v2/dags/{dag_id}/dagRuns/{q}/taskInstances/{task_id}/{map_index}/hitlDetails"

    def set_connections(self, connections: Mapping[str, Mapping[str, Any]]) -> None:
        """Create or replace connections (``airflow connections import`` JSON: id -> fields) in Airflow's DB, as an
        admin does in the UI: every task that reads one from then on gets the new one."""
        for conn_id, fields in connections.items():
            body = {"connection_id": conn_id, **fields}
            if isinstance(body.get("extra"), dict):
                body["extra"] = json.dumps(body["extra"])
            try:
                self.api("DELETE", f"/api/v2/connections/{urllib.parse.quote(conn_id, safe='')}")
            except AirflowLiveError as e:
                if e.code != 404:
                    raise
            self.api("POST", "/api/v2/connections", body)

    def set_task_state(self, dag_id: str, run_id: str, task_id: str, state: str, user: str | None = None) -> Any:
        """Mark a task instance by hand (the UI's "Mark as success / failed")."""
        q = urllib.parse.quote(run_id, safe="")
        path = f"/api/v2/dags/{dag_id}/dagRuns/{q}/taskInstances/{task_id}"
        return self.api("PATCH", path, {"new_state": state}, user=user)

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """A task attempt's log, as text (the REST API's log endpoint)."""
        q = urllib.parse.quote(run_id, safe="")
        got = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{q}/taskInstances/{task_id}/logs/{try_number}")
        content = got.get("content") if isinstance(got, dict) else got
        if isinstance(content, list):
            return "\n".join(json.dumps(c) if not isinstance(c, str) else c for c in content)
        return str(content)

    def clear_task(self, dag_id: str, run_id: str, task_id: str) -> None:
        """Rerun one task of a finished run (the UI's Clear): the run goes back to running."""
        body = {
            "dag_run_id": run_id,
            "task_ids": [task_id],
            "dry_run": False,
            "only_failed": False,
            "reset_dag_runs": True,
        }
        self.api("POST", f"/api/v2/dags/{dag_id}/clearTaskInstances", body)


class LiveAirflow(AirflowRest):
    """The processes of a live Airflow on 127.0.0.1 (``AIRFLOW_HOME`` from ``env``) and its REST client."""

    def __init__(
        self,
        env: dict[str, str],
        port: int | None = None,
        components: tuple[str, ...] = COMPONENTS,
        passwords: dict[str, str] | None = None,
        approver: str | None = None,
        bin_dir: Path | None = None,
    ) -> None:
        """``bin_dir``: where the ``airflow`` command is (default: this interpreter's, the repository's venv)."""
        unknown = sorted(set(components) - set(HEALTH_KEYS))
        if unknown:
            raise AirflowLiveError(f"unknown Airflow component(s) {unknown}: known {sorted(HEALTH_KEYS)}")
        self.components = components
        self.airflow_exe = str((bin_dir or Path(sys.executable).parent) / "airflow")
        self.port = port or free_port()
        base = f"http://127.0.0.1:{self.port}"
        self.env = dict(env)
        self.env.update(
            {
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__API__BASE_URL": base,  # tasks reach the execution API through it
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base}/execution/",
                "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": self.env.get(
                    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT", "60"
                ),
            }
        )
        self.home = Path(self.env["AIRFLOW_HOME"])
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        # the passwords file is read again for each new token: the simple auth manager adds to it as it starts
        super().__init__(base, self.passwords_file, self._users(passwords or {}, base), approver)

    @property
    def passwords_file(self) -> Path:
        """The simple auth manager's passwords file (JSON: user -> password)."""
        return self.home / PASSWORDS

    def _users(self, chosen: dict[str, str], base: str) -> list[str]:
        """The configured users plus the reader, each with a password in the simple auth manager's file (kept
        across restarts; ``chosen`` ones replace theirs), and the approvals connection for the reader; returns the
        user names, reader last."""
        users = [u.split(":")[0] for u in (self.env.get(USERS) or "admin:admin").split(",") if u.strip()]
        if READER not in users:
            self.env[USERS] = ",".join([self.env.get(USERS) or "admin:admin", f"{READER}:viewer"])
            users.append(READER)
        self.home.mkdir(parents=True, exist_ok=True)
        file = self.passwords_file
        passwords = json.loads(file.read_text()) if file.is_file() else {}
        passwords.update({u: secrets.token_urlsafe(12) for u in users if u not in passwords})
        passwords.update({u: pw for u, pw in chosen.items() if u in users})
        file.touch(mode=0o600)
        file.chmod(0o600)  # passwords: the owner's only
        file.write_text(json.dumps(passwords) + "\n")
        conn = {"conn_type": "http", "host": base, "login": READER, "password": passwords[READER]}
        self.env.setdefault("AIRFLOW_CONN_FLEET_DOCTOR_AIRFLOW_API", json.dumps(conn))
        return [u for u in users if u != READER] + [READER]

    # ---- processes
    def start(self, timeout: float = 180.0) -> LiveAirflow:
        for name in self.components:
            self.start_component(name)
        self._wait_healthy(timeout)
        return self

    def start_component(self, name: str) -> None:
        args = [self.airflow_exe, name]
        if name == "api-server":
            args += ["--host", "127.0.0.1", "--port", str(self.port)]
        elif name in SERVES_LOGS:
            # Airflow's log server binds every interface (no host setting): not started. The api-server reads task
            # and trigger logs from the same AIRFLOW_HOME/logs; a running task's log view notes the missing server.
            args.append("--skip-serve-logs")
        log = open(self.home / f"{name}.out", "ab")  # the child has its own copy of the fd
        try:
            self.procs[name] = subprocess.Popen(
                args,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()

    def pids(self) -> dict[str, list[int]]:
        """Each running component's process and everything it forked now (task runners, gunicorn workers)."""
        return {name: [p.pid, *descendants(p.pid)] for name, p in self.procs.items()}

    def kill_component(self, name: str) -> list[int]:
        """SIGKILL a component and everything it forked (a crashed worker: task runners included)."""
        proc = self.procs.pop(name)
        pids = [proc.pid, *descendants(proc.pid)]
        _kill(pids)
        proc.wait(timeout=30)
        return pids

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise AirflowLiveError(f"airflow {name} exited {p.returncode}:\n{self.log_tail(name)}")
            try:
                with urllib.request.urlopen(f"{self.base}/api/v2/monitor/health", timeout=5) as r:
                    health = json.loads(r.read())
                waiting = {
                    HEALTH_KEYS[name]: (health.get(HEALTH_KEYS[name]) or {}).get("status") for name in self.components
                }
                if all(status == "healthy" for status in waiting.values()):
                    return
                last = ", ".join(f"{key} {status}" for key, status in waiting.items() if status != "healthy")
            except (OSError, ValueError) as e:
                last = str(e)
            time.sleep(1)
        raise AirflowLiveError(f"Airflow on {self.base} not healthy within {timeout:.0f} s: {last}")

    def log_tail(self, name: str, n: int = 30) -> str:
        """The last ``n`` lines of a component's output (``<AIRFLOW_HOME>/<name>.out``)."""
        try:
            return "\n".join((self.home / f"{name}.out").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        for name in list(self.procs):
            p = self.procs[name]
            family = [p.pid, *descendants(p.pid)]
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
            _kill(pid for pid in family if pid_alive(pid))
            if p.poll() is None:
                p.wait(timeout=10)
            del self.procs[name]

    def __enter__(self) -> LiveAirflow:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
