"""The roll DAG end to end on the session's live Airflow (harness.shared), through the approval, on a ZooKeeper lab and
on a KRaft lab (3 combined nodes: voters), each with one broker killed beforehand (an unclean stop) whose logs take
their time to recover at its start.

What the tests read back is the lab's own record and the cluster's metadata (ZooKeeper, the decoder), never the
product's word: the killed broker goes first and is waited for through its recovery, never restarted again; every
other broker is stopped and started once, the active controller last; after each broker, it leads its preferred
partitions again (the journal's timestamps against the lab's event record); at the end every partition is led by its
preferred replica and in full ISR; the lock is free.

The operator's word goes through ``bin/fleet-doctor roll-control`` as a person would type it: a broker held before the
approval blocks its step (the roll status says the gate, ``held``, and since when; the broker is not stopped) until
it is released; on ZooKeeper another broker is skipped and never stopped."""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor import layout, roll_status
from fleet_doctor.airflow_links import roll_dag
from fleet_doctor.cluster_metadata import read_cluster_metadata
from fleet_doctor.settings import Settings
from fleet_lab import fleet as lab
from fleet_lab.broker import BrokerConfig
from harness.corpus import REPO
from harness.kraft_repair import VICTIM
from harness.kraft_repair import snapshot as kraft_snapshot
from harness.live_stack import FAST, LAB_CLUSTER, events, plan_dir
from harness.roll_watch import past_recovery_point
from harness.shared import current_controller, live

pytestmark = pytest.mark.timeout(1800)
ROLL = roll_dag(LAB_CLUSTER)
RECOVERY_S = 6.0  # the killed broker's log recovery takes about this long (its rate set from its bytes to recover)


def leaders(state: lab.LabState) -> dict[str, tuple[int, int, list[int], list[int]]]:
    """topic-partition -> (preferred replica, leader, replicas, isr), from the cluster's metadata."""
    if state.kraft:
        records = lab.read_metadata(state)
        assigned = {r["topic"]: r["partitions"] for r in records if r["kind"] == "topic"}
        return {
            f"{r['topic']}-{r['partition']}": (
                assigned[r["topic"]][str(r["partition"])][0],
                r["leader"],
                assigned[r["topic"]][str(r["partition"])],
                r["isr"],
            )
            for r in records
            if r["kind"] == "partition_state"
        }
    out = {}
    with state.zk_session() as zk:
        for t in zk.get_children("/brokers/topics"):
            znode = json.loads(zk.get(f"/brokers/topics/{t}")[0])
            for p, replicas in znode["partitions"].items():
                st = json.loads(zk.get(f"/brokers/topics/{t}/partitions/{p}/state")[0])
                out[f"{t}-{p}"] = (replicas[0], st["leader"], replicas, st["isr"])
    return out


def roll_control(af: Any, *args: str) -> None:
    """``bin/fleet-doctor roll-control <lab cluster> ...`` with the live Airflow's data root and inventories."""
    env = {**af.env, "PATH": af.env.get("PATH", "/usr/bin:/bin")}
    done = subprocess.run(
        [str(REPO / "bin" / "fleet-doctor"), "roll-control", LAB_CLUSTER, *args],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def wait_status(store: Any, holds: Any, timeout: float = 120) -> roll_status.RollStatus:
    """The roll status once ``holds(status)``."""
    deadline = time.monotonic() + timeout
    while True:
        status = roll_status.read_status(store)
        if status is not None and holds(status):
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.2)


def registered(state: lab.LabState) -> set[int]:
    with state.zk_session() as zk:
        return {int(b) for b in zk.get_children("/brokers/ids")}


def slow_recovery(state: lab.LabState, broker: int) -> None:
    """``broker`` (down after an unclean stop) configured to take about ``RECOVERY_S`` recovering its logs."""
    b = state.broker(broker)
    total = sum(past_recovery_point(Path(d)) for d in b.log_dirs)
    assert total > 0, b.log_dirs
    BrokerConfig(**{**b.config().__dict__, "recovery_bytes_per_s": total / RECOVERY_S}).save(b.config_path)


@pytest.mark.parametrize("metadata", ["zookeeper", "kraft"])
def test_a_roll_through_the_approval_waits_out_a_recovery_and_gives_leadership_back(shared: Any, metadata: str) -> None:
    snap = kraft_snapshot(shared) if metadata == "kraft" else shared.snapshot(None)
    ctx = live(shared, snap)
    state: lab.LabState = ctx["state"]
    af = ctx["af"]
    # down after an unclean stop: on KRaft the snapshot's node 3 (seed-000's kill -9), on ZooKeeper broker 2, killed
    killed = VICTIM if state.kraft else 2
    if not state.kraft:
        assert lab.run_service(state.broker(killed), "kill").returncode == 0
        deadline = time.monotonic() + 30  # its ZooKeeper session expires: the cluster sees it down
        while killed in registered(state):
            assert time.monotonic() < deadline, "the killed broker's registration did not go"
            time.sleep(0.1)
    assert lab.running_pid(state.broker(killed).config()) is None
    slow_recovery(state, killed)
    t0 = max(e["ts"] for es in events(state).values() for e in es)
    params = {"reason_kind": "config-change", "reason": "num.io.threads 16", **FAST, "leadership_timeout_s": 60}
    run = af.trigger(ROLL, params)
    request = af.wait_for_approval(ROLL, run, "approve")
    assert request["subject"].startswith(f"Kafka roll `{LAB_CLUSTER}` plan ")
    body = request["body"]
    assert "num.io.threads 16" in body and "| step | brokers | racks | why | predicted |" in body
    assert "kafka-leader-election.sh" in body  # the lab's inventory has the election tool on every broker
    pdir = plan_dir(ctx["data"], request)
    plan = json.loads((pdir / "plan.json").read_text())
    order = [b["broker_id"] for b in plan["brokers"]]
    controller = current_controller(state)
    assert order[0] == killed and order[-1] == controller, (order, controller)
    assert plan["scope"]["batches"][0]["why"].startswith("down already")
    held = order[1]  # the first running broker: its step waits for the operator
    skipped = None if state.kraft else order[2]  # never stopped
    store = Settings.from_env(af.env).for_cluster(LAB_CLUSTER).store
    store.delete(layout.ROLL_STATUS)
    store.delete(layout.ROLL_CONTROL)
    roll_control(af, "hold", str(held), "--by", "alice", "--why", "swap a disk first")
    if skipped is not None:
        roll_control(af, "skip", str(skipped), "--by", "bob")

    try:
        af.approve(ROLL, run, "approve")
        status = wait_status(store, lambda s: s.blocked is not None and s.blocked.gate == roll_status.HELD)
        assert status.brokers == (held,) and status.state == roll_status.BLOCKED and status.done == (killed,), status
        assert "held by alice" in status.blocked.items[0] and "swap a disk first" in status.blocked.items[0]
        time.sleep(1.5)  # two more of the step's polls (1 s apart): still blocked, the held broker still running
        assert roll_status.read_status(store).blocked.gate == roll_status.HELD
        assert not [e for e in events(state)[held] if e["ts"] > t0 and e["event"] == "stop-requested"]
        roll_control(af, "release", str(held))
        assert af.wait_run(ROLL, run, 1200) == "success", af.task_states(ROLL, run)
    finally:  # standing until released: the next roll of the lab would honour them too
        store.delete(layout.ROLL_CONTROL)
    attempt = next((pdir / "attempts").iterdir())
    result = json.loads((attempt / "result.json").read_text())
    rolled = [b for b in order if b != skipped]
    assert result["status"] == "done" and result["done"] == rolled and result["lock_released"] is True, result
    assert list(result["skipped"]) == ([] if skipped is None else [str(skipped)]), result
    final_status = roll_status.read_status(store)
    assert final_status is not None and final_status.state == roll_status.DONE and final_status.blocked is None
    assert result["leadership_left"] == {}, result
    journal = json.loads((attempt / "journal.json").read_text())
    started = next(h for h in journal["brokers"][str(killed)]["history"] if h["state"] == "started")
    assert "recovering its logs" in started["detail"], started
    log = af.task_log(ROLL, run, "roll")
    assert f"broker {killed}: started, waiting for its" in log and "recovering its logs" in log
    assert f"broker {held}: blocked: held since" in log and "no longer blocked (held)" in log

    # the lab's own record: the killed broker started once (never restarted during its recovery), the others
    # stopped and started once each, in the plan's order
    ev = {b: [e for e in es if e["ts"] > t0] for b, es in events(state).items()}
    runs = {b: [e["ts"] for e in es if e["event"] == "running"] for b, es in ev.items()}
    stops = {b: [e["ts"] for e in es if e["event"] == "stop-requested"] for b, es in ev.items()}
    assert all(len(runs[b]) == 1 for b in rolled), runs
    assert stops[killed] == [] and all(len(stops[b]) == 1 for b in rolled if b != killed), stops
    if skipped is not None:
        assert stops[skipped] == [] and runs[skipped] == [], ev[skipped]
    assert sorted(rolled, key=lambda b: runs[b][0]) == rolled
    # leadership back after each broker, before the next one stopped: its verified step came before that stop
    verified = {
        b: next(h["ts"] for h in journal["brokers"][str(b)]["history"] if h["state"] == "verified") for b in rolled
    }
    for before, after in itertools.pairwise(rolled):
        if stops[after]:
            assert verified[before] < stops[after][0], (before, after)
    lab.wait_healthy(state, timeout=60)
    final = leaders(state)
    assert all(lead == pref for pref, lead, _r, _i in final.values()), {n: v for n, v in final.items() if v[0] != v[1]}
    assert all(sorted(isr) == sorted(replicas) for _p, _l, replicas, isr in final.values())
    if state.kraft:  # the voters' metadata logs agree with the leader's image
        assert read_cluster_metadata(str(Path(state.broker(1).log_dirs[0]) / "__cluster_metadata-0"))
