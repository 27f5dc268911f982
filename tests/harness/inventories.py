"""Inventory files as an operator writes them (docs/inventory.md), for the tests that need a fleet without a lab:
the DAG files' parsing, the fleet's inventories, the Kafka fleet view."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def inventory(cluster: str, *, brokers: int = 1, kraft: bool = False, **extra: Any) -> dict[str, Any]:
    """One cluster's inventory: ``brokers`` brokers (ids from 1); KRaft: the first broker a combined controller."""
    entries = [
        {
            "id": i,
            "host": f"kafka-{i}.{cluster}.example",
            "ssh_port": 22,
            "ssh_user": "kafka",
            "ssh_key_file": "/keys/id",
            "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA",
            "log_dirs": ["/var/lib/kafka"],
            "kafka_version": "3.9.0",
            "service": {"stop": "sudo systemctl stop kafka", "start": "sudo systemctl start kafka", "status": "true"},
        }
        for i in range(1, brokers + 1)
    ]
    data: dict[str, Any] = {"inventory_version": 1, "cluster": cluster, "brokers": entries}
    if kraft:
        data.update(metadata_mode="kraft", controllers=[{"id": 1}])
    else:
        data["zookeeper"] = "zk:2181/kafka"
    return {**data, **extra}


def write(path: Path, data: Any) -> Path:
    """An inventory file (``data`` as JSON, or a string as it is)."""
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def fleet_dir(root: Path, *clusters: dict[str, Any]) -> Path:
    """A directory of inventories, one ``<cluster>.json`` each."""
    root.mkdir(parents=True, exist_ok=True)
    for data in clusters:
        write(root / f"{data['cluster']}.json", data)
    return root
