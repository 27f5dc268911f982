"""Undoing a repair: a broker's backup (the tarball and sha256 manifest the executor fetched before changing anything)
put back over its files while it is stopped (dags/kafka_fleet_restore.py). The plan's journal then marks the broker
pending again, so a later run of the same plan starts over with a fresh re-verification."""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

from fleet_doctor import inventory
from fleet_doctor.remote import Remote
from fleet_doctor.repair.executor import Journal, RepairError, wait_until
from fleet_doctor.repair.plan import Plan
from fleet_doctor.repair.tasks import repairs_dir, ssh_connect
from fleet_doctor.settings import Settings, safe_run_id
from fleet_doctor.store import write_atomic
from fleet_doctor.zookeeper import session
from fleet_doctor.zookeeper.cluster import Cluster
from fleet_doctor.zookeeper.lock import acquire_lock, release_lock


def restore_broker(workdir: Path, plan_hash: str, broker_id: int, remote: Remote) -> str:
    """Put a broker's backup back (the broker must be stopped): the tarball holds absolute paths."""
    local = workdir / plan_hash / f"broker-{broker_id}" / "backup.tar.gz"
    if not local.is_file():
        raise RepairError(f"no backup for broker {broker_id} in {local.parent}")
    remote_tar = f"/tmp/fleet-doctor-restore-{plan_hash[:16]}-{broker_id}.tar.gz"
    remote.put(local, remote_tar)
    remote.run(f"tar -xzf {shlex.quote(remote_tar)} --absolute-names")
    manifest = (local.parent / "manifest.sha256").read_text()
    paths = " ".join(shlex.quote(line.split(None, 1)[1]) for line in manifest.splitlines() if line.strip())
    sums = remote.run(f"sha256sum -- {paths}").stdout
    if sorted(sums.split("\n")) != sorted(manifest.split("\n")):
        raise RepairError(f"broker {broker_id}: restored files do not match the backup manifest")
    journal = workdir / plan_hash / "journal.json"
    if journal.is_file():  # the broker is back where the plan found it: a rerun starts it over, re-verified
        Journal(journal, Plan.from_json((workdir / plan_hash / "plan.json").read_text())).restored(broker_id)
    return f"restored {len(manifest.splitlines())} file(s) from {os.path.basename(local)}"


def restore_backup(
    settings: Settings,
    plan_hash: str,
    broker_ids: list[int],
    start: bool,
    run_id: str,
    connect: Any = None,
    timeout_s: float = 600.0,
) -> list[str]:
    """Put a repair's backups back: per broker (every broker with a backup when none is named) stop it, untar the
    backup over its files, check them against the manifest, and start it again unless ``start`` is false."""
    known = [d for d in repairs_dir(settings).glob(f"{plan_hash}*") if (d / "plan.json").is_file()]
    if len(known) != 1:
        raise RepairError(f"{len(known)} repair plans match {plan_hash!r} in {repairs_dir(settings)}")
    workdir = known[0]
    plan_hash = workdir.name
    with_backup = sorted(
        int(d.name.split("-", 1)[1]) for d in workdir.glob("broker-*") if (d / "backup.tar.gz").is_file()
    )
    targets = broker_ids or with_backup
    missing = sorted(set(targets) - set(with_backup))
    if missing:
        raise RepairError(f"plan {plan_hash[:12]} has no backup for broker(s) {missing}")
    inv = inventory.load(settings.inventory)
    connect = connect or ssh_connect(inv)
    owner = {"plan_hash": plan_hash, "step": "restore", "run_id": run_id, "since": time.time()}
    out = []
    with session(inv.zookeeper, timeout=10, start_timeout=15) as zk:
        acquire_lock(zk, inv.cluster, owner)
        try:
            cluster = Cluster(zk)
            for bid in targets:
                remote = Remote(connect(bid), bid)
                try:
                    remote.run(inv.broker(bid).service_command("stop"), timeout=timeout_s)
                    wait_until(lambda b=bid: b not in cluster.registered(), timeout_s, f"broker {bid} did not stop")
                    out.append(f"broker {bid}: " + restore_broker(repairs_dir(settings), plan_hash, bid, remote))
                    if start:
                        remote.run(inv.broker(bid).service_command("start"), timeout=timeout_s, check=False)
                        wait_until(lambda b=bid: b in cluster.registered(), timeout_s, f"broker {bid} did not register")
                        out[-1] += ", started and registered"
                finally:
                    remote.close()
        finally:
            release_lock(zk, inv.cluster, owner)
    write_atomic(workdir / f"restore-{safe_run_id(run_id)}.json", json.dumps(out, indent=2).encode())
    return out
