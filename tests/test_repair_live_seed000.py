"""The repair DAG's acceptance on seed-000 (Kafka 0.8.2.2: a broker that refuses to start on a corrupt index) plus an
index-size incident on a second broker, on the session's live Airflow; each test starts from the audited lab,
restored (harness.shared):

1. a broker that does not come back (its listener port is taken when the repair starts it) -> the chain halts,
   the later broker is untouched, the lock is kept (files were changed), the result says what was and was not
   done; the restore DAG (its own plan, approved) takes the lock over and puts the backup back, byte for byte;
2. a plan approved -> re-verified, the corrupt indexes quarantined (never deleted), the broker starts and rebuilds
   them, the other broker is repaired after it.
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor.repair.plan import QUARANTINE_DIR
from fleet_doctor.zookeeper.lock import LOCK_ROOT
from fleet_lab import fleet as lab
from fleet_lab.incidents import inject
from harness.live_stack import FAST, REPAIR, RESTORE, attempt_of, events, fleet_snapshot, plan_dir, zk_json
from harness.shared import live

pytestmark = pytest.mark.timeout(2400)
SEED_BROKER, OTHER = 1, 2


def second_incident(state: lab.LabState) -> None:
    inject(state, "index-bad-size", broker=OTHER, topic="orders")


@pytest.fixture
def fleet(shared: Any) -> dict[str, Any]:
    return live(shared, shared.snapshot("seed-000", "0.8.2.2", second_incident))


def digests(paths: list[str]) -> dict[str, str | None]:
    return {p: hashlib.sha256(Path(p).read_bytes()).hexdigest() if Path(p).exists() else None for p in paths}


def quarantined_copies(path: str) -> list[str]:
    pdir, name = path.rsplit("/", 1)
    return [hashlib.sha256(k.read_bytes()).hexdigest() for k in Path(pdir, QUARANTINE_DIR).glob(f"*/{name}*")]


def test_broker_that_does_not_come_back_halts_the_chain_and_restore_puts_the_backup_back(
    fleet: dict[str, Any],
) -> None:
    state: lab.LabState = fleet["state"]
    af = fleet["af"]
    run = af.trigger(REPAIR, FAST)
    request = af.wait_for_approval(REPAIR, run, "approve")
    pdir = plan_dir(fleet["data"], request)
    plan = json.loads((pdir / "plan.json").read_text())
    order = [b["broker_id"] for b in plan["brokers"] if b["restart"]]
    assert order == [SEED_BROKER, OTHER]
    assert "killed mid-load" in request["body"]  # the preview does not trust seed-000's clean-shutdown marker
    quarantined = [a["path"] for b in plan["brokers"] for a in b["actions"]]
    assert all(a["action"] == "quarantine" for b in plan["brokers"] for a in b["actions"])
    original = digests(quarantined)
    assert all(original.values())
    before = fleet_snapshot(state)
    port = state.broker(SEED_BROKER).listener_port
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", port))  # something else took the broker's port: Kafka cannot bind, stays down
    squatter.listen(1)
    try:
        af.approve(REPAIR, run, "approve")
        assert af.wait_run(REPAIR, run) == "failed"
    finally:
        squatter.close()
    adir = attempt_of(fleet["data"], request, run)
    result = json.loads((adir / "result.json").read_text())
    assert result["status"] == "halted" and not result["lock_released"] and "lock_kept" in result
    assert list(result["failed"]) == [str(SEED_BROKER)]
    assert "Socket server failed to bind" in result["failed"][str(SEED_BROKER)]  # the start's error, reported
    assert result["untouched"] == [OTHER] and result["done"] == []
    # files changed, the broker down: the lock stays until a human acts (here: the restore takes it over)
    assert zk_json(state, f"{LOCK_ROOT}/{state.cluster_id}")["run_id"] == run
    after = fleet_snapshot(state)
    assert after["stops"][OTHER] == before["stops"][OTHER] and after["starts"][OTHER] == before["starts"][OTHER]
    other_before = {k: v for k, v in before["files"].items() if f"/broker-{OTHER}/" in k}
    other_after = {k: v for k, v in after["files"].items() if f"/broker-{OTHER}/" in k}
    assert other_after == other_before  # the later broker: not one file touched, nothing quarantined
    # quarantined before the start: the original bytes are in the quarantine folder (the broker loaded its logs,
    # rebuilding those indexes, before it failed to bind its listener, as Kafka's startup order does)
    for path in (p for p in quarantined if f"/broker-{SEED_BROKER}/" in p):
        assert quarantined_copies(path) == [original[path]]

    # restore: the backup goes back, every file byte for byte; the broker stays stopped as it was
    r = af.trigger(RESTORE, {"plan": pdir.name[:16], "brokers": [SEED_BROKER], "start": False, **FAST})
    restore_request = af.wait_for_approval(RESTORE, r, "approve")
    assert "left stopped" in restore_request["body"] and "Plan hash: `" in restore_request["body"]
    (restore_option, reject) = restore_request["options"]  # the restore's own button: what goes back, which plan
    assert restore_option.startswith("Approve: put back ")
    assert "on 1 broker(s), left stopped (restore " in restore_option  # start=false: the button says so
    assert reject == "Reject"
    assert af.approve(RESTORE, r, "approve") == restore_option
    assert af.wait_run(RESTORE, r, 600) == "success", af.task_states(RESTORE, r)
    assert digests(quarantined) == original
    assert lab.running_pid(state.broker(SEED_BROKER).config()) is None
    assert zk_json(state, f"{LOCK_ROOT}/{state.cluster_id}") is None  # the restore took the lock over and released it
    journal = json.loads((adir / "journal.json").read_text())
    assert journal["status"] == "restored" and journal["brokers"][str(SEED_BROKER)]["state"] == "pending"


def test_seed_000_repair_quarantines_the_corrupt_index_and_the_broker_rebuilds_it(fleet: dict[str, Any]) -> None:
    state: lab.LabState = fleet["state"]
    af = fleet["af"]
    log = Path(state.broker(SEED_BROKER).run_dir) / "server.log"
    mark = log.stat().st_size
    t0 = time.time()
    run = af.trigger(REPAIR, FAST)
    request = af.wait_for_approval(REPAIR, run, "approve")
    pdir = plan_dir(fleet["data"], request)
    plan = json.loads((pdir / "plan.json").read_text())
    quarantined = [a["path"] for b in plan["brokers"] for a in b["actions"]]
    original = digests(quarantined)
    af.approve(REPAIR, run, "approve")
    assert af.wait_run(REPAIR, run) == "success", af.task_states(REPAIR, run)
    result = json.loads((attempt_of(fleet["data"], request, run) / "result.json").read_text())
    assert result["status"] == "done" and result["done"] == [SEED_BROKER, OTHER] and result["reverified_with"]
    # quarantined, never deleted: the very bytes are in the quarantine folder
    for path, digest in original.items():  # the broker restored and repaired again keeps both copies
        copies = quarantined_copies(path)
        assert copies and set(copies) == {digest}, path
    # the broker started (it refused to before) and rebuilt its indexes
    assert lab.running_pid(state.broker(SEED_BROKER).config()) is not None
    new_log = log.read_text(errors="replace")[mark:]
    assert "Corrupt index found" not in new_log and "started" in new_log
    for path in quarantined:
        p = Path(path)
        assert p.exists() and p.stat().st_size % 8 == 0, path  # rebuilt, whole entries
    lab.wait_healthy(state, timeout=60)
    starts = {b: [e["ts"] for e in es if e["event"] == "running" and e["ts"] > t0] for b, es in events(state).items()}
    assert len(starts[SEED_BROKER]) == 1 and len(starts[OTHER]) == 1 and starts[SEED_BROKER] < starts[OTHER]
    assert starts[3] == []  # not in the plan: never restarted
