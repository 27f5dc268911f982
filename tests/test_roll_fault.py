"""The roll's fault row: its worker SIGKILLed mid-batch (a step of several brokers all stopped, none started again),
on a 6-broker ZooKeeper lab in 3 racks, then the task run again (harness.roll_worker; the real lock, executor, SSH and
ZooKeeper). ZooKeeper's partition states are sampled all along by the test itself (harness.roll_watch).

After the death: the journal says the step's brokers were stopped (they count as down), they are down, and the lock
is held for that run. The rerun resumes the attempt: the brokers left down go first, together, then the rest of the
roll; it ends done, every broker started exactly once after its stop, every partition led by its preferred replica,
and at no moment was any partition below its min ISR."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_doctor import inventory
from fleet_doctor.repair import roll_tasks
from fleet_doctor.settings import Settings
from fleet_doctor.zookeeper.lock import lock_holder
from fleet_lab import fleet
from harness.detect_service import bare_env
from harness.roll_watch import Watcher
from harness.ssh import ssh_connect

pytestmark = [pytest.mark.timeout(900), pytest.mark.live]
ROOT = Path(__file__).resolve().parents[1]
PARAMS = {
    "reason_kind": "os-patch",
    "reason": "kernel 6.1.119",
    "batching": "partition-disjoint",
    "healthy_polls": 2,
    "poll_interval_s": 1,
    "isr_timeout_s": 120,
    "pause_between_brokers_s": 0,
    "leadership_timeout_s": 30,
}


@pytest.fixture(scope="module")
def rack_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[fleet.LabState, Path]]:
    d = tmp_path_factory.mktemp("roll-fault")
    state = fleet.up(d / "lab", brokers=6, racks=3)
    try:
        fleet.wait_in_sync(state, timeout=60)
        yield state, d
    finally:
        fleet.down(d / "lab")


def test_a_worker_killed_mid_batch_leaves_the_batch_down_under_the_lock_and_the_rerun_finishes(
    rack_lab: tuple[fleet.LabState, Path],
) -> None:
    state, d = rack_lab
    settings = Settings(inventory=state.inventory_path, data_root=d / "data", repair_dir=d / "repairs")
    planned = roll_tasks.plan(settings, PARAMS)
    plan = json.loads((d / "repairs" / planned["hash"] / "plan.json").read_text())
    batch = next(b["brokers"] for b in plan["scope"]["batches"] if len(b["brokers"]) > 1)
    run_id = "manual__roll-killed-mid-batch"
    cfg = d / "worker.json"
    cfg.write_text(
        json.dumps(
            {
                "inventory": str(state.inventory_path),
                "data": str(d / "data"),
                "repairs": str(d / "repairs"),
                "planned": planned,
                "params": PARAMS,
                "run_id": run_id,
            }
        )
    )
    watcher = Watcher(state, 0.1)
    watcher.start()
    try:
        env_path = f"{ROOT / 'plugins'}:{ROOT / 'lab'}:{ROOT / 'tests'}"
        proc = subprocess.run(
            [sys.executable, "-m", "harness.roll_worker", str(cfg)],
            env=bare_env(PATH="/usr/bin:/bin", PYTHONPATH=env_path, HOME=str(d)),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == -9, proc.stdout + proc.stderr[-3000:]  # killed where it was told to die
        attempt = d / "repairs" / planned["hash"] / "attempts"
        (adir,) = attempt.iterdir()
        journal = json.loads((adir / "journal.json").read_text())
        for b in batch:
            assert journal["brokers"][str(b)]["state"] == "stopped" and journal["brokers"][str(b)]["down"], b
            assert fleet.running_pid(state.broker(b).config()) is None, b
        with state.zk_session() as zk:
            holder = lock_holder(zk, state.cluster_id)
        assert holder is not None and holder["run_id"] == run_id, holder  # a dead worker's lock stays

        inv = inventory.load(state.inventory_path)
        report = roll_tasks.roll(settings, planned, PARAMS, run_id, connect=ssh_connect(inv))  # the task cleared
    finally:
        watcher.done.set()
        watcher.join()
    assert report["status"] == "done" and sorted(report["done"]) == sorted(plan["scope"]["brokers"]), report
    assert report["lock_released"] is True and report["leadership_left"] == {}, report
    journal = json.loads((adir / "journal.json").read_text())
    resumed = journal["brokers"][str(batch[0])]["step"]
    assert resumed["why"].startswith("down already") and sorted(resumed["brokers"]) == sorted(batch), resumed
    events = fleet.broker_events(state)
    for b in plan["scope"]["brokers"]:  # one start after its one stop: never started twice, never left down
        runs = [e for e in events[b] if e["event"] == "running"]
        assert len(runs) == 2, (b, runs)  # the lab's start, the roll's
    assert watcher.below_min_isr() == [], watcher.below_min_isr()[:3]
    final = watcher.samples[-1][2]
    assert {n: v for n, v in final.items() if v[0] != v[1]} == {}  # (preferred, leader) of any other
