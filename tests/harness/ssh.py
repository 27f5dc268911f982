"""SSH to a lab broker the way the product does (paramiko, the inventory's pinned host key), without Airflow."""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

import paramiko

from fleet_doctor import inventory


def ssh_client(
    entry: inventory.BrokerEntry, host_key: str | None = None, trust_any_host_key: bool = False
) -> paramiko.SSHClient:
    """A connected client for the broker ``entry``; ``host_key`` pins another key than the inventory's (a test of a
    changed host key); ``trust_any_host_key`` pins none (a test of a check that must refuse a wrong key itself)."""
    client = paramiko.SSHClient()
    if trust_any_host_key:
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    else:
        kind, b64 = (host_key or entry.host_key).split()
        client.get_host_keys().add(
            f"[{entry.host}]:{entry.ssh_port}", kind, paramiko.Ed25519Key(data=base64.b64decode(b64))
        )
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(
            entry.host,
            port=entry.ssh_port,
            username=entry.ssh_user,
            key_filename=entry.ssh_key_file,
            look_for_keys=False,
            allow_agent=False,
            timeout=10,
        )
    except BaseException:
        client.close()  # a refused host key leaves the transport (its thread and socket) running otherwise
        raise
    return client


def ssh_connect(inv: inventory.Inventory) -> Any:
    """``connect(broker) -> client`` for the product's steps (a broker id, or a discovered broker's dict)."""

    def connect(broker: Any) -> paramiko.SSHClient:
        return ssh_client(inv.broker(broker if isinstance(broker, int) else broker["broker_id"]))

    return connect


def controller_connect(endpoint: dict[str, Any]) -> paramiko.SSHClient:
    """``connect(endpoint) -> client`` for a KRaft controller (``Inventory.controller_endpoint``), as the product's
    ``audit.kraft.Connect``: its SSH fields, without Airflow."""
    return ssh_client(SimpleNamespace(**{k: endpoint[k] for k in inventory.SSH_FIELDS}))  # type: ignore[arg-type]
