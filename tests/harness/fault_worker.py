"""A repair worker that dies: ``python -m harness.fault_worker CONFIG.json`` runs an approved plan's broker chain as
the execute task does (the cluster lock with its liveness node, the real executor over SSH and ZooKeeper), and kills
itself with SIGKILL at the point CONFIG names, as a worker killed by the OOM killer or a lost node would die: no
``finally``, no journal entry, the ZooKeeper session left to expire.

Points: ``after-precheck``, ``after-stop``, ``mid-backup`` (the tarball made on the broker, not yet fetched),
``after-backup``, ``mid-change`` (the first file changed, not the others), ``after-start``.

CONFIG: {"inventory", "repairs", "plan_hash", "attempt", "point", "session_timeout_s"}; on a KRaft cluster also
"lock_dir" (where its repair lock lives) and "lease_s" (how long its liveness outlives it).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from fleet_doctor import inventory
from fleet_doctor.layout import RESULT, RepairsDir
from fleet_doctor.repair.broker import BrokerHost, ssh_hosts
from fleet_doctor.repair.executor import Executor, probe_and_detect
from fleet_doctor.repair.plan import BrokerPlan, Plan
from fleet_doctor.repair.session import cluster_lock
from harness.repair_lab import FAST
from harness.ssh import controller_connect, ssh_connect

POINTS = ("after-precheck", "after-stop", "mid-backup", "after-backup", "mid-change", "after-start")
GATES = replace(FAST, healthy_polls=2)


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class DyingExecutor(Executor):
    point = ""

    def stop(self, b: BrokerPlan, host: BrokerHost) -> str:
        if self.point == "after-precheck":
            die()
        return super().stop(b, host)

    def backup(self, b: BrokerPlan, host: BrokerHost) -> str:
        if self.point == "after-stop":
            die()
        if self.point == "mid-backup":
            host.remote.fetch = lambda *a, **k: die()  # type: ignore[method-assign]
        return super().backup(b, host)

    def change(self, b: BrokerPlan, host: BrokerHost) -> str:
        if self.point == "after-backup":
            die()
        if self.point == "mid-change":
            remove, quarantine = host.remove, host.quarantine

            def remove_then_die(path: str) -> Any:
                out = remove(path)
                die()  # one file removed, the rest not
                return out

            def quarantine_then_die(path: str, plan_hash: str) -> Any:
                out = quarantine(path, plan_hash)
                die()  # one file quarantined, the rest not
                return out

            host.remove = remove_then_die  # type: ignore[method-assign]
            host.quarantine = quarantine_then_die  # type: ignore[method-assign]
        return super().change(b, host)

    def healthy(self, b: BrokerPlan, host: BrokerHost) -> str:
        if self.point == "after-start":
            die()
        return super().healthy(b, host)


def run_attempt(
    inv: inventory.Inventory,
    plan: Plan,
    run_id: str,
    attempt: Path,
    cls: type[Executor] = Executor,
    gates: Any = GATES,
    **lock: Any,
) -> dict[str, Any]:
    """The broker chain of ``plan``'s attempt (the Airflow run ``run_id``, its dir ``attempt``) run by ``cls`` as
    the execute task runs it: under the cluster lock (``lock``: ``cluster_lock``'s keywords; a KRaft cluster's lock
    dir, controllers' connect, lease), with that lock's health gates and fence, the post-verify on the cluster's
    metadata. Returns the report the lock wrote."""
    owner = {"plan_hash": plan.hash, "step": "brokers", "run_id": run_id}
    report: dict[str, Any] = {}
    with cluster_lock(inv, owner, report, attempt / RESULT, **lock) as held:
        ex = cls(
            plan,
            attempt,
            inv,
            ssh_hosts(inv, ssh_connect(inv)),
            held.cluster({}),
            gates,
            fence=held.fence(),
            post_verify=probe_and_detect(inv, controller_connect),
        )
        held.keep_when(ex.journal.keeps_lock)
        ex.run()
    return report


def main(config_path: str) -> int:
    cfg = json.loads(Path(config_path).read_text())
    assert cfg["point"] in POINTS, cfg["point"]
    inv = inventory.load(cfg["inventory"])
    repairs = RepairsDir(Path(cfg["repairs"]))
    plan = Plan.from_json(repairs.plan(cfg["plan_hash"]).read_text())
    DyingExecutor.point = cfg["point"]
    timeout = float(cfg.get("session_timeout_s", 4))
    attempt = repairs.attempt(plan.hash, cfg["attempt"])
    kraft = (
        {"lock_dir": Path(cfg["lock_dir"]), "connect": controller_connect, "lease_s": cfg.get("lease_s")}
        if inv.kraft
        else {}
    )
    report = run_attempt(inv, plan, cfg["attempt"], attempt, DyingExecutor, session_timeout=timeout, **kraft)
    print(json.dumps({"survived": True, **report}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
