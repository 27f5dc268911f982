"""The repair DAG's acceptance on seed-004, on a live Airflow (api-server + scheduler + dag-processor as processes,
SQLite) over a 3-broker fleet lab (real sshd, ZooKeeper 3.8, Spark local). Approvals are answered through the
REST API's HITL endpoint, as the UI's buttons do. Each test starts from the session's audited seed-004 lab, restored
(harness.shared), on the session's live Airflow:

1. reject -> nothing changed on disk or in ZooKeeper, no broker restarted;
2. the fleet changes between approval and execution (the controller moved) -> abort, nothing touched;
3. min.insync.replicas would be broken by the first stop -> the pre-check halts the chain, nothing touched;
4. approve, the worker is killed mid-repair, the task is cleared -> the repair resumes without repeating the
   finished broker and ends with every broker in ISR, partition.metadata everywhere equal to ZooKeeper's topic ID,
   the controller restarted last (from the lab's own event record), backups present and verified;
5. the preventive ZooKeeper repair (its own approval) keeps a dropped topic ID through a controller failover.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor.zookeeper.lock import LOCK_ROOT
from fleet_lab import fleet as lab
from fleet_lab.fleet import run_service
from fleet_lab.incidents import controller_failover, inject
from harness.live_stack import AUDIT, FAST, REPAIR, attempt_of, events, fleet_snapshot, plan_dir, zk_json
from harness.shared import live

pytestmark = pytest.mark.timeout(2400)
TOPIC = "seed-004"


@pytest.fixture
def fleet(shared: Any) -> dict[str, Any]:
    return live(shared, shared.snapshot("seed-004"))


def lock_free(state: lab.LabState) -> bool:
    return zk_json(state, f"{LOCK_ROOT}/{state.cluster_id}") is None


def test_reject_changes_nothing(fleet: dict[str, Any]) -> None:
    state: lab.LabState = fleet["state"]
    af = fleet["af"]
    before = fleet_snapshot(state)
    run = af.trigger(REPAIR, FAST)
    request = af.wait_for_approval(REPAIR, run, "approve")
    assert "restart 3 broker(s)" in request["subject"] and "partition.metadata" in request["body"]
    assert "est. recovery" in request["body"] and "controller" in request["body"]
    plan_hash = plan_dir(fleet["data"], request).name  # the buttons name the destructive choice, for this plan
    assert request["options"][0].startswith("Approve: restart 3 brokers, change ") and request["options"][1] == "Reject"
    assert request["options"][0].endswith(f"(plan {plan_hash[:12]})") and len(request["options"]) == 2
    assert f"Plan hash: `{plan_hash}`" in request["body"].splitlines()  # in the summary, before the files
    assert request["body"].index("Plan hash:") < request["body"].index("partition.metadata`")
    af.reject(REPAIR, run, "approve")
    assert af.wait_run(REPAIR, run) == "success"
    states = af.task_states(REPAIR, run)
    assert states["execute"] == "skipped" and states["zookeeper_to_repair"] == "success"
    assert states["approve_zookeeper"] == "skipped"  # seed-004 leaves no topic without an ID in ZooKeeper
    assert fleet_snapshot(state) == before
    assert not (attempt_of(fleet["data"], request, run) / "journal.json").exists()
    assert lock_free(state)


def test_stale_plan_aborts_untouched(fleet: dict[str, Any]) -> None:
    state: lab.LabState = fleet["state"]
    af = fleet["af"]
    run = af.trigger(REPAIR, FAST)
    request = af.wait_for_approval(REPAIR, run, "approve")
    # between the plan and the approval the fleet changes: the controller is restarted by someone else, so
    # another broker is controller now (the approved order, controller last, is no longer right)
    controller = zk_json(state, "/controller")["brokerid"]
    for cmd in ("stop", "start"):
        assert run_service(state.broker(controller), cmd).returncode == 0
    deadline = time.monotonic() + 30
    while (zk_json(state, "/controller") or {}).get("brokerid") in (None, controller) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert zk_json(state, "/controller")["brokerid"] != controller
    time.sleep(3)  # the restarted broker settles (out of ISR for the partitions whose partition.metadata is old)
    before = fleet_snapshot(state)
    af.approve(REPAIR, run, "approve")
    assert af.wait_run(REPAIR, run) == "failed"
    assert af.task_states(REPAIR, run)["execute"] == "failed"
    result = json.loads((attempt_of(fleet["data"], request, run) / "result.json").read_text())
    assert "stale plan" in result["error"] and result["status"] == "aborted"
    assert result["done"] == [] and sorted(result["untouched"]) == [1, 2, 3] and result["lock_released"]
    assert fleet_snapshot(state) == before
    assert lock_free(state)
    # the re-verification was never published: the latest audit is still the one the stale plan came from, and the
    # plan the fleet gives now is written beside it for the operator to compare
    fresh = result["error"].split("fleet now gives ")[1].rstrip(")")
    assert [d for d in plan_dir(fleet["data"], request).parent.iterdir() if d.name.startswith(fresh)]
    assert not any("verify" in r["audit_run"] for r in _history(fleet["data"]))


def _history(data: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (data / "history" / "runs.jsonl").read_text().splitlines() if line.strip()]


def test_precheck_refuses_to_take_a_partition_below_min_isr(fleet: dict[str, Any]) -> None:
    """Strimzi's rule, through the DAG: with min.insync.replicas 3 on a 3-replica topic, stopping any broker in
    ISR would take its partitions below it: the first broker's pre-check halts the chain before any stop."""
    state: lab.LabState = fleet["state"]
    af = fleet["af"]
    zk = state.zk_client()
    try:
        zk.set(f"/config/topics/{TOPIC}", json.dumps({"version": 1, "config": {"min.insync.replicas": "3"}}).encode())
        before = fleet_snapshot(state)
        run = af.trigger(REPAIR, FAST)
        request = af.wait_for_approval(REPAIR, run, "approve")
        af.approve(REPAIR, run, "approve")
        assert af.wait_run(REPAIR, run) == "failed"
    finally:
        zk.set(f"/config/topics/{TOPIC}", json.dumps({"version": 1, "config": {}}).encode())
        zk.stop()
        zk.close()
    result = json.loads((attempt_of(fleet["data"], request, run) / "result.json").read_text())
    (first, error), *_ = result["failed"].items()
    assert "would take below min ISR" in error and f"{TOPIC}-" in error and "min.insync.replicas 3" in error
    assert result["done"] == [] and result["lock_released"] and int(first) not in result["untouched"]
    assert fleet_snapshot(state) == before  # nothing stopped, nothing changed
    assert lock_free(state)


def test_approved_repair_survives_a_killed_worker_and_fixes_seed_004(fleet: dict[str, Any]) -> None:
    state: lab.LabState = fleet["state"]
    af = fleet["af"]
    zk_topic_id = zk_json(state, f"/brokers/topics/{TOPIC}")["topic_id"]
    controller = zk_json(state, "/controller")["brokerid"]
    run = af.trigger(REPAIR, FAST)
    request = af.wait_for_approval(REPAIR, run, "approve")
    pdir = plan_dir(fleet["data"], request)
    plan = json.loads((pdir / "plan.json").read_text())
    order = [b["broker_id"] for b in plan["brokers"] if b["restart"]]
    assert order[-1] == controller and sorted(order) == [1, 2, 3]
    t0 = time.time()
    af.approve(REPAIR, run, "approve")

    # kill the worker (the scheduler, its executor and the task process) once the first broker is done
    adir = attempt_of(fleet["data"], request, run)
    journal = adir / "journal.json"

    def first_done() -> bool:
        return journal.is_file() and json.loads(journal.read_text())["brokers"][str(order[0])]["state"] == "done"

    deadline = time.monotonic() + 600
    while not first_done():
        assert time.monotonic() < deadline, af.task_states(REPAIR, run)
        time.sleep(0.2)
    af.kill_component("scheduler")
    at_kill = json.loads(journal.read_text())
    assert at_kill["status"] == "running"
    assert zk_json(state, f"{LOCK_ROOT}/{state.cluster_id}")["plan_hash"] == pdir.name  # the lock outlives the worker
    af.start_component("scheduler")
    # the killed attempt fails (no heartbeat) or is reset; either way it is run again by clearing it
    deadline = time.monotonic() + 900
    cleared = 0
    while True:
        assert time.monotonic() < deadline, af.task_states(REPAIR, run)
        st = af.task_states(REPAIR, run)["execute"]
        if st == "success":
            break
        if st == "failed":
            assert cleared < 2, af.log_tail("scheduler")
            af.clear_task(REPAIR, run, "execute")
            cleared += 1
        time.sleep(2)
    assert af.wait_run(REPAIR, run) == "success"

    # resumed, not repeated: each broker stopped and started exactly once by the repair, in plan order
    stops = {
        b: [e["ts"] for e in es if e["event"] == "stop-requested" and e["ts"] > t0] for b, es in events(state).items()
    }
    starts = {b: [e["ts"] for e in es if e["event"] == "running" and e["ts"] > t0] for b, es in events(state).items()}
    assert {b: len(v) for b, v in stops.items()} == {1: 1, 2: 1, 3: 1}
    assert {b: len(v) for b, v in starts.items()} == {1: 1, 2: 1, 3: 1}
    assert sorted(starts, key=lambda b: starts[b][0]) == order  # the controller last
    final = json.loads(journal.read_text())
    assert final["status"] == "done"
    first = [h["state"] for h in final["brokers"][str(order[0])]["history"]]
    assert len(first) == len(set(first))  # no step of the finished broker ran twice
    # every broker back in ISR, partition.metadata everywhere equal to ZooKeeper's topic ID
    lab.wait_healthy(state, timeout=60)
    ids = {k: v for k, v in lab.partition_topic_ids(state).items() if k[1] == TOPIC}
    assert ids and set(ids.values()) == {zk_topic_id}
    for p in range(6):
        st = zk_json(state, f"/brokers/topics/{TOPIC}/partitions/{p}/state")
        assigned = zk_json(state, f"/brokers/topics/{TOPIC}")["partitions"][str(p)]
        assert sorted(st["isr"]) == sorted(assigned)
    # backups present and verified: exactly the planned files, the manifest's checksums match the tarball's
    for b in plan["brokers"]:
        d = adir / f"broker-{b['broker_id']}"
        planned = sorted({a["path"] for a in b["actions"]})
        with tarfile.open(d / "backup-1.tar.gz") as tar:
            assert sorted("/" + n.lstrip("/") for n in tar.getnames()) == planned
            sums = {"/" + m.name.lstrip("/"): hashlib.sha256(tar.extractfile(m).read()).hexdigest() for m in tar}
        manifest = dict(reversed(line.split(None, 1)) for line in (d / "manifest-1.sha256").read_text().splitlines())
        assert {k: v for k, v in manifest.items()} == sums
        assert (
            hashlib.sha256((d / "backup-1.tar.gz").read_bytes()).hexdigest()
            == (d / "backup-1.sha256").read_text().split()[0]
        )
    result = json.loads((adir / "result.json").read_text())
    assert result["status"] == "done" and sorted(result["done"]) == [1, 2, 3] and result["lock_released"]
    assert lock_free(state)


def test_preventive_zookeeper_repair_keeps_the_topic_id_through_a_failover(shared: Any) -> None:
    """On a healthy lab, an old admin tool drops payments' topic_id from its znode; the audit finds it, the repair
    offers to write the ID every replica holds back, as its own approval; once written, a controller failover keeps
    it (without the repair it would mint a new one and every replica would leave ISR: seed-004)."""
    fleet = live(shared, shared.snapshot(None))
    state: lab.LabState = fleet["state"]
    af = fleet["af"]
    topic = "payments"
    before_id = zk_json(state, f"/brokers/topics/{topic}")["topic_id"]
    inject(state, "old-client-add-partitions", topic=topic, partitions=4)
    assert "topic_id" not in zk_json(state, f"/brokers/topics/{topic}")
    audit_run = af.trigger(AUDIT)
    assert af.wait_run(AUDIT, audit_run, 900) == "success"
    snap = fleet_snapshot(state)
    run = af.trigger(REPAIR, FAST)
    request = af.wait_for_approval(REPAIR, run, "approve_zookeeper")
    assert topic in request["body"] and before_id in request["body"]
    states = af.task_states(REPAIR, run)
    assert states["brokers_to_repair"] == "success" and states["approve"] == "skipped"  # no broker to restart
    af.approve(REPAIR, run, "approve_zookeeper")
    assert af.wait_run(REPAIR, run) == "success", af.task_states(REPAIR, run)
    znode = zk_json(state, f"/brokers/topics/{topic}")
    assert znode["topic_id"] == before_id and znode["version"] == 3 and len(znode["partitions"]) == 4
    after = fleet_snapshot(state)
    for k in ("starts", "stops", "registrations"):
        assert after[k] == snap[k], k  # no broker stopped, started or re-registered
    # no file changed; partition.metadata appears for the added partitions (the brokers write it, as Kafka's do,
    # once ZooKeeper has the ID again)
    assert {p: after["files"].get(p) for p in snap["files"]} == snap["files"]
    assert {p for p in after["files"].keys() - snap["files"].keys()} <= {
        p for p in after["files"] if p.endswith("/partition.metadata") and f"/{topic}-" in p
    }
    controller_failover(state)
    assert zk_json(state, f"/brokers/topics/{topic}")["topic_id"] == before_id
    lab.wait_healthy(state, timeout=60)
    ids = {k: v for k, v in lab.partition_topic_ids(state).items() if k[1] == topic}
    assert set(ids.values()) == {before_id}  # the new partitions took it from ZooKeeper too
