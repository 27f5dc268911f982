"""A repair worker that dies: ``python -m harness.fault_worker CONFIG.json`` runs an approved plan's broker chain as
the execute task does (the cluster lock with its liveness node, the real executor over SSH and ZooKeeper), and kills
itself with SIGKILL at the point CONFIG names, as a worker killed by the OOM killer or a lost node would die: no
``finally``, no journal entry, the ZooKeeper session left to expire.

Points: ``after-precheck``, ``after-stop``, ``mid-backup`` (the tarball made on the broker, not yet fetched),
``after-backup``, ``mid-change`` (the first file changed, not the others), ``after-start``.

CONFIG: {"inventory", "repairs", "plan_hash", "attempt", "point", "session_timeout_s"}.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from fleet_doctor import inventory
from fleet_doctor.remote import Remote
from fleet_doctor.repair.executor import Executor, Gates
from fleet_doctor.repair.plan import BrokerPlan, Plan
from fleet_doctor.repair.tasks import finish, lock_fence
from fleet_doctor.zookeeper import cluster_session
from fleet_doctor.zookeeper.cluster import Cluster
from fleet_doctor.zookeeper.lock import acquire_lock
from harness.ssh import ssh_connect

POINTS = ("after-precheck", "after-stop", "mid-backup", "after-backup", "mid-change", "after-start")
GATES = Gates(stop_timeout_s=60, start_timeout_s=60, healthy_polls=2, poll_interval_s=0.5, isr_timeout_s=60)


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class DyingExecutor(Executor):
    point = ""

    def stop(self, b: BrokerPlan, remote: Remote) -> str:
        if self.point == "after-precheck":
            die()
        return super().stop(b, remote)

    def backup(self, b: BrokerPlan, remote: Remote) -> str:
        if self.point == "after-stop":
            die()
        if self.point == "mid-backup":
            remote.fetch = lambda *a, **k: die()  # type: ignore[method-assign]
        return super().backup(b, remote)

    def change(self, b: BrokerPlan, remote: Remote) -> str:
        if self.point == "after-backup":
            die()
        if self.point == "mid-change":
            run = remote.run

            def run_then_die(command: str, *a: Any, **k: Any) -> Any:
                out = run(command, *a, **k)
                if "rm -f --" in command:
                    die()  # one file removed, the rest not
                return out

            remote.run = run_then_die  # type: ignore[method-assign]
        return super().change(b, remote)

    def healthy(self, b: BrokerPlan, remote: Remote) -> str:
        if self.point == "after-start":
            die()
        return super().healthy(b, remote)


def main(config_path: str) -> int:
    cfg = json.loads(Path(config_path).read_text())
    assert cfg["point"] in POINTS, cfg["point"]
    inv = inventory.load(cfg["inventory"])
    repairs = Path(cfg["repairs"])
    plan = Plan.from_json((repairs / cfg["plan_hash"] / "plan.json").read_text())
    owner = {"plan_hash": plan.hash, "step": "brokers", "run_id": cfg["attempt"]}
    DyingExecutor.point = cfg["point"]
    timeout = float(cfg.get("session_timeout_s", 4))
    with cluster_session(inv, timeout=timeout, start_timeout=15) as zk:
        acquire_lock(zk, inv.cluster, owner)
        ex = DyingExecutor(
            plan,
            repairs,
            inv,
            ssh_connect(inv),
            Cluster(zk),
            GATES,
            attempt=cfg["attempt"],
            fence=lock_fence(zk, inv.cluster, owner),
        )
        report: dict[str, Any] = {}
        try:
            ex.run()
        finally:
            finish(zk, inv, owner, ex.journal, report)
    print(json.dumps({"survived": True, **report}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
