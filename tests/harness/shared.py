"""What the live tiers share, once per test session: audited labs kept as snapshots and restored, in turn, at one lab
path; and one live Airflow (api-server, scheduler, dag-processor, triggerer) over whichever lab is restored there.

A snapshot is a healthy lab stopped cleanly and copied (``fleet.snapshot``), the incident a test needs (a seed
scenario, one more incident) replayed on it after each restore, and one audit of the result (``steps.run_local``:
probe over SSH, ZooKeeper, Spark detection, published) made once and copied with it. The incident is replayed, not
restored: its state lives in running brokers (seed-004's drift shows only on the broker restarted after the
controller minted a new topic ID; seed-000's broker refuses to start again), which a stopped copy cannot keep. The
replay writes the same files and the same ISR as the audited one (only a minted topic ID differs, and a plan does
not hash IDs), so a module, or a test, gets the audited lab in that state whatever an earlier test did to it
(``restore``: a few seconds): no test depends on another having run first. Every snapshot lives at the same lab path, so
the live Airflow's inventory path and data root never change; only its SSH connections (ports, host keys: a lab's own)
are written again, through its REST API, when another lab's snapshot is restored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_doctor import inventory
from fleet_doctor.audit import steps
from fleet_doctor.settings import Settings
from fleet_doctor.store import write_atomic
from fleet_lab import demo, fleet
from fleet_lab.airflow_stack import AirflowLiveError, LiveAirflow
from fleet_lab.incidents import controller_failover, kraft_controller_failover, run_scenario
from harness.live_stack import AUDIT, PURGE, REPAIR, RESTORE
from harness.ssh import controller_connect, ssh_connect

AUDIT_RUN = "run1"  # the snapshot's audit run (the repair's "latest")
USERS = "admin:admin,alice:admin,bob:admin"  # admin triggers (the first), alice approves, bob is anyone else
APPROVER = "alice"
DAGS = (AUDIT, REPAIR, RESTORE, PURGE)  # the lab cluster's


@dataclass(frozen=True)
class Snapshot:
    """A healthy lab, stopped and copied (``lab``: ``fleet.snapshot``), the incident replayed on it after each restore
    (``scenario``, then ``after_start``), and its audit's store (``data``)."""

    name: str
    lab: Path
    data: Path
    scenario: str | None = None
    after_start: Callable[[fleet.LabState], None] | None = None
    controller: int | None = None  # the controller when it was audited (None: while it is being made)

    def replay(self, state: fleet.LabState) -> None:
        """The incident again on the restored lab, and the controller the audit saw (a plan restarts it last, and
        names it): an election is a race, so the controller fails over until the audited one wins it."""
        steps_ok = run_scenario(state, self.scenario) if self.scenario else []
        assert all(s.ok for s in steps_ok), steps_ok
        if self.after_start:
            self.after_start(state)
        for _ in range(30):
            if self.controller is None or current_controller(state) == self.controller:
                return
            if state.kraft:
                kraft_controller_failover(state)
            else:
                controller_failover(state)
        raise AssertionError(f"{self.name}: broker {self.controller} did not win an election in 30 tries")


@dataclass
class SharedLabs:
    """The session's lab path and its audited snapshots, made on first use."""

    root: Path
    snapshots: dict[str, Snapshot] = field(default_factory=dict)
    current: str | None = None  # the snapshot restored at the lab path now (the Airflow's connections are its)
    airflow: LiveAirflow | None = None

    @property
    def lab_dir(self) -> Path:
        return self.root / "lab"

    def snapshot(
        self,
        scenario: str | None,
        version: str = "2.8.2",
        after_start: Callable[[fleet.LabState], None] | None = None,
        metadata: str = "zookeeper",
    ) -> Snapshot:
        """The audited snapshot of a 3-broker lab at Kafka ``version`` after ``scenario`` (None: none, a healthy
        lab) and ``after_start``, both replayed on each restore (``Snapshot``); ``metadata``: "kraft" for 3 combined
        KRaft nodes (the lab cluster's name, so the live Airflow's DAGs are the same)."""
        name = f"{scenario or 'healthy'}-{version}" + (f"-{after_start.__name__}" if after_start else "")
        name += "-kraft" if metadata == "kraft" else ""
        if name in self.snapshots:
            return self.snapshots[name]
        if (self.lab_dir / "lab.json").is_file():
            fleet.down(self.lab_dir)
        where = self.root / "snapshots" / name
        started = fleet.up(self.lab_dir, brokers=3, kafka_version=version, metadata=metadata)
        if started.kraft:
            fleet.wait_healthy(started, timeout=60)
        else:
            fleet.wait_in_sync(started)  # healthy when taken
        try:
            lab = fleet.snapshot(self.lab_dir, where / "lab")
            snap = Snapshot(name, lab, where / "data", scenario, after_start)
            state = fleet.restore(lab, self.lab_dir)  # what a restore gives, audited
            snap.replay(state)
            settings = Settings(inventory=state.inventory_path, data_root=where / "data")
            inv = inventory.load(state.inventory_path)
            steps.run_local(settings, AUDIT_RUN, ssh_connect(inv), connect_controller=controller_connect)
            snap = dataclasses.replace(snap, controller=current_controller(state))
        except BaseException:
            with contextlib.suppress(Exception):
                fleet.down(self.lab_dir)
            raise
        self.current = None
        self.snapshots[name] = snap
        return snap

    def restore(self, snap: Snapshot, data: Path) -> fleet.LabState:
        """``snap``'s lab back at the lab path and started as it was, its audit's store copied to ``data``; the live
        Airflow (if one runs) pointed at it."""
        if data.exists():
            remove_tree(data)
        shutil.copytree(snap.data, data)
        state = fleet.restore(snap.lab, self.lab_dir)
        snap.replay(state)
        if self.airflow is not None and self.current != snap.name:
            self.airflow.set_connections(json.loads((self.lab_dir / "airflow-connections.json").read_text()))
            self.publish_inventory()
        self.current = snap.name
        return state

    @property
    def fleet_dir(self) -> Path:
        """The live Airflow's FLEET_DOCTOR_INVENTORY: a fleet directory holding the lab's inventory, kept outside the
        lab dir (a restore replaces that dir: the DAG files, parsed every few seconds, must never find no inventory,
        or the lab's DAGs would leave Airflow until the next parse), and rewritten atomically after each restore."""
        return self.root / "fleet"

    def publish_inventory(self) -> None:
        self.fleet_dir.mkdir(exist_ok=True)
        write_atomic(self.fleet_dir / "lab.json", (self.lab_dir / "inventory.json").read_bytes())

    def live_airflow(self) -> LiveAirflow:
        """The session's live Airflow over the lab path, its data root ``<root>/data``: started on first use."""
        if self.airflow is None:
            home = self.root / "airflow"
            env = demo.airflow_environ(home, self.lab_dir, self.data)
            if not (self.lab_dir / "inventory.json").is_file():  # the lab cluster's DAGs need its inventory
                self.restore(self.snapshot(None), self.data)
            self.publish_inventory()
            env["FLEET_DOCTOR_INVENTORY"] = str(self.fleet_dir)
            env = {k: v for k, v in env.items() if not k.startswith("AIRFLOW_CONN_KAFKA_")}  # set through the API
            # a killed worker's task instances are reset within 5 s of its scheduler job counting as dead rather than
            # within 300 s (a dead scheduler job is one without a heartbeat for scheduler_health_check_threshold,
            # left at 30 s: lower, a busy scheduler resets its own running tasks). A new scheduler never fails them
            # for a missing heartbeat: it only looks at the task instances it queued itself
            env["AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL"] = "5"
            env["FLEET_DOCTOR_STAGE_RETRY_DELAY"] = "1"
            env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] = USERS
            env["FLEET_DOCTOR_APPROVERS"] = APPROVER
            demo.prepare(env)
            af = LiveAirflow(env, approver=APPROVER)
            af.start()
            for dag in DAGS:
                af.wait_dag(dag)
            self.airflow = af
            if self.current is not None:
                af.set_connections(json.loads((self.lab_dir / "airflow-connections.json").read_text()))
        return self.airflow

    @property
    def data(self) -> Path:
        """The live Airflow's data root (a restore for the live Airflow copies the audit's store here)."""
        return self.root / "data"

    def finish_runs(self) -> None:
        """Every approval still pending is rejected and every run of the live Airflow's DAGs that has not finished is
        marked failed (a run left waiting for an approval would hold ``max_active_runs``: the next test's run would
        queue behind it, and the fleet view would count its request)."""
        af = self.airflow
        if af is None:
            return
        for request in af.pending_approvals():
            ti = request["task_instance"]
            with contextlib.suppress(AirflowLiveError):
                af.respond(ti["dag_id"], ti["dag_run_id"], ti["task_id"], "Reject")
        for dag in DAGS:
            for r in af.runs(dag):
                if r["state"] not in ("success", "failed"):
                    with contextlib.suppress(AirflowLiveError):
                        af.api("PATCH", f"/api/v2/dags/{dag}/dagRuns/{r['dag_run_id']}", {"state": "failed"})
        # a run marked failed has its running tasks killed a little later: until then one may still write into the
        # data root the next restore empties ("Directory not empty", seen once in a full run)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with contextlib.suppress(AirflowLiveError):
                busy = af.api("GET", "/api/v2/dags/~/dagRuns/~/taskInstances?state=running&state=queued&limit=1")
                if not busy["total_entries"]:
                    return
            time.sleep(0.5)

    def stop_airflow(self) -> None:
        """The live Airflow stopped (``live_airflow`` starts it again, on the same home and data root)."""
        if self.airflow is not None:
            self.airflow.stop()
            self.airflow = None

    def close(self) -> None:
        self.stop_airflow()
        if (self.lab_dir / "lab.json").is_file():
            fleet.down(self.lab_dir)


def remove_tree(path: Path, tries: int = 20) -> None:
    """``path`` removed; a file appearing in it meanwhile (a task killed a moment late) is removed at the next try."""
    for _ in range(tries - 1):
        try:
            shutil.rmtree(path)
            return
        except OSError:
            time.sleep(0.25)
    shutil.rmtree(path)


def audited(shared: SharedLabs, snap: Snapshot, tmp: Path) -> dict[str, Any]:
    """``snap`` restored, its store at ``tmp/data``: the context the repair tests that drive the plan and the
    executor directly use (state, settings, inventory, summary, tmp)."""
    state = shared.restore(snap, tmp / "data")
    settings = Settings(inventory=state.inventory_path, data_root=tmp / "data")
    summary = settings.store.read_json(f"reports/{AUDIT_RUN}.json")
    return {
        "state": state,
        "settings": settings,
        "inv": inventory.load(state.inventory_path),
        "summary": summary,
        "tmp": tmp,
        "snapshot": snap,
    }


def live(shared: SharedLabs, snap: Snapshot) -> dict[str, Any]:
    """``snap`` restored for the session's live Airflow (its store the Airflow's data root, unfinished runs ended):
    the context of the live repair tests (state, af, data, root)."""
    af = shared.live_airflow()
    shared.finish_runs()
    state = shared.restore(snap, shared.data)
    return {"state": state, "af": af, "data": shared.data, "root": shared.root}


def current_controller(state: fleet.LabState) -> int | None:
    if state.kraft:
        leader = fleet.quorum_leader(state)
        return leader[0] if leader else None
    with state.zk_session() as zk:
        return json.loads(zk.get("/controller")[0])["brokerid"] if zk.exists("/controller") else None
