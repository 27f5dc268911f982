"""The cluster inventory: which brokers Fleet Doctor audits and repairs, and how it reaches them.

One JSON file per cluster (docs/inventory.md). Production inventories are written by hand or generated
from a CMDB; the fleet lab writes one for itself. Every field that ends up in a remote command is
validated here, once: a broker is reached over SSH with a pinned host key and controlled through the
three service commands (``stop``, ``start``, ``status``), e.g. ``sudo systemctl stop kafka``.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fleet_doctor.store import write_atomic

INVENTORY_VERSION = 1
SERVICE_COMMANDS = ("stop", "start", "status")
_HOST_RE = re.compile(r"[A-Za-z0-9._:-]+")  # names and keys: fullmatch ($ lets "x\n" through)
_CLUSTER_RE = re.compile(r"[A-Za-z0-9_.-]+")
_TMP_DIR_RE = re.compile(r"/[A-Za-z0-9._/-]*")
_HOST_KEY_RE = re.compile(r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]+")


class InventoryError(ValueError):
    """The inventory file is missing, not JSON, or fails validation (the message names the file and field)."""


@dataclass(frozen=True)
class BrokerEntry:
    id: int
    host: str
    ssh_port: int
    ssh_user: str
    ssh_key_file: str
    host_key: str  # "<type> <base64>", pinned: the connection fails on any other key
    log_dirs: list[str]
    kafka_version: str
    service: dict[str, str]  # stop/start/status: shell commands run over SSH on the broker
    tmp_dir: str = "/tmp"  # where a repair makes its private (mktemp -d, 0700) dirs for backups on the broker

    def service_command(self, name: str) -> str:
        return self.service[name]


@dataclass(frozen=True)
class Inventory:
    cluster: str
    zookeeper: str  # Kafka's zookeeper.connect, chroot included
    brokers: list[BrokerEntry]
    inventory_version: int = INVENTORY_VERSION
    extra: dict[str, Any] = field(default_factory=dict)
    # the brokers' static min.insync.replicas (server.properties), which ZooKeeper does not hold; None: Kafka's 1
    min_insync_replicas: int | None = None

    def broker(self, broker_id: int) -> BrokerEntry:
        found = next((b for b in self.brokers if b.id == broker_id), None)
        if found is None:
            raise KeyError(f"broker {broker_id} is not in the inventory of cluster {self.cluster}")
        return found

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    def save(self, path: Path) -> None:
        write_atomic(path, self.to_json().encode("utf-8"))

    def ssh_connection_id(self, broker_id: int) -> str:
        return f"kafka_ssh_{self.cluster}_{broker_id}"

    @property
    def zookeeper_connection_id(self) -> str:
        return f"kafka_zk_{self.cluster}"

    def airflow_connections(self) -> dict[str, dict[str, Any]]:
        """Connections in ``airflow connections import`` JSON form: one SSH connection per broker (the SSH
        provider's extras: key_file, pinned host_key, host key checking on) and one for ZooKeeper."""
        conns: dict[str, dict[str, Any]] = {}
        for b in self.brokers:
            conns[self.ssh_connection_id(b.id)] = {
                "conn_type": "ssh",
                "host": b.host,
                "port": b.ssh_port,
                "login": b.ssh_user,
                "extra": {
                    "key_file": b.ssh_key_file,
                    "host_key": b.host_key,
                    "no_host_key_check": False,
                    "allow_host_key_change": False,
                    "conn_timeout": 10,
                },
            }
        zk_hosts, _, chroot = self.zookeeper.partition("/")
        first = zk_hosts.split(",")[0]
        host, _, port = first.rpartition(":")
        conns[self.zookeeper_connection_id] = {
            "conn_type": "generic",
            "host": host,
            "port": int(port),
            "extra": {"connect": self.zookeeper, "chroot": "/" + chroot if chroot else ""},
        }
        return conns


def _req(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise InventoryError(f"{where}: missing field {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise InventoryError(f"{where}: field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _tmp_dir(b: dict[str, Any], where: str) -> str:
    tmp = b.get("tmp_dir", "/tmp")
    if not isinstance(tmp, str) or not _TMP_DIR_RE.fullmatch(tmp) or "/../" in tmp + "/":
        raise InventoryError(f"{where}: tmp_dir must be an absolute path of [A-Za-z0-9._/-] ({tmp!r})")
    return tmp.rstrip("/") or "/"


def parse(data: dict[str, Any], source: str = "inventory") -> Inventory:
    if _req(data, "inventory_version", int, source) != INVENTORY_VERSION:
        raise InventoryError(f"{source}: unsupported inventory_version {data['inventory_version']}")
    cluster = _req(data, "cluster", str, source)
    if not _CLUSTER_RE.fullmatch(cluster):
        raise InventoryError(f"{source}: cluster name {cluster!r} must match {_CLUSTER_RE.pattern}")
    brokers = []
    seen = set()
    for i, b in enumerate(_req(data, "brokers", list, source)):
        where = f"{source}: brokers[{i}]"
        if not isinstance(b, dict):
            raise InventoryError(f"{where}: not an object")
        bid = _req(b, "id", int, where)
        if bid in seen:
            raise InventoryError(f"{where}: duplicate broker id {bid}")
        seen.add(bid)
        host = _req(b, "host", str, where)
        if not _HOST_RE.fullmatch(host):
            raise InventoryError(f"{where}: invalid host {host!r}")
        host_key = _req(b, "host_key", str, where)
        if not _HOST_KEY_RE.fullmatch(host_key):
            raise InventoryError(f"{where}: host_key must be '<type> <base64>' (a pinned public host key)")
        service = _req(b, "service", dict, where)
        for name in SERVICE_COMMANDS:
            if not isinstance(service.get(name), str) or not service[name].strip():
                raise InventoryError(f"{where}: service.{name} must be a non-empty command")
        log_dirs = _req(b, "log_dirs", list, where)
        if not log_dirs or not all(isinstance(d, str) and d.startswith("/") for d in log_dirs):
            raise InventoryError(f"{where}: log_dirs must be a non-empty list of absolute paths")
        brokers.append(
            BrokerEntry(
                id=bid,
                host=host,
                ssh_port=_req(b, "ssh_port", int, where),
                ssh_user=_req(b, "ssh_user", str, where),
                ssh_key_file=_req(b, "ssh_key_file", str, where),
                host_key=host_key,
                log_dirs=list(log_dirs),
                kafka_version=_req(b, "kafka_version", str, where),
                service=dict(service),
                tmp_dir=_tmp_dir(b, where),
            )
        )
    min_isr = data.get("min_insync_replicas")
    if min_isr is not None and (not isinstance(min_isr, int) or isinstance(min_isr, bool) or min_isr < 1):
        raise InventoryError(f"{source}: min_insync_replicas must be a positive integer (the brokers' static default)")
    return Inventory(
        cluster=cluster,
        zookeeper=_req(data, "zookeeper", str, source),
        brokers=sorted(brokers, key=lambda b: b.id),
        extra=dict(data.get("extra") or {}),
        min_insync_replicas=min_isr,
    )


def load(path: str | Path) -> Inventory:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise InventoryError(f"{p}: cannot read inventory: {e.strerror or e}") from e
    except ValueError as e:
        raise InventoryError(f"{p}: not JSON: {e}") from e
    if not isinstance(data, dict):
        raise InventoryError(f"{p}: the inventory must be a JSON object")
    return parse(data, str(p))
