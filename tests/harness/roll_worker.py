"""A roll worker that dies mid-batch: ``python -m harness.roll_worker CONFIG.json`` runs an approved roll as the roll
task does (``repair.roll_tasks.roll``: the cluster lock with its liveness node, the real executor over SSH and
ZooKeeper) and kills itself with SIGKILL once a step of several brokers has stopped them all, before any is started
again: no ``finally``, no journal entry, the ZooKeeper session left to expire.

CONFIG: {"inventory", "data", "repairs", "planned", "params", "run_id"}.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from fleet_doctor import inventory
from fleet_doctor.repair import roll_tasks
from fleet_doctor.repair.broker import BrokerHost
from fleet_doctor.repair.plan import BrokerPlan
from fleet_doctor.repair.roll import RollExecutor
from fleet_doctor.settings import Settings
from harness.ssh import ssh_connect


class DiesMidBatch(RollExecutor):
    def _start_batch(self, bs: list[BrokerPlan], hosts: dict[int, BrokerHost]) -> dict[int, str]:
        if len(bs) > 1:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return super()._start_batch(bs, hosts)


def main(config_path: str) -> int:
    cfg: dict[str, Any] = json.loads(Path(config_path).read_text())
    settings = Settings(inventory=Path(cfg["inventory"]), data_root=cfg["data"], repair_dir=Path(cfg["repairs"]))
    roll_tasks.RollExecutor = DiesMidBatch  # type: ignore[misc]
    inv = inventory.load(cfg["inventory"])
    report = roll_tasks.roll(settings, cfg["planned"], cfg["params"], cfg["run_id"], connect=ssh_connect(inv))
    print(json.dumps({"survived": True, **report}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
