"""The cluster inventory: which brokers Fleet Doctor audits and repairs, and how it reaches them.

One JSON file per cluster (docs/inventory.md). Production inventories are written by hand or generated
from a CMDB; the fleet lab writes one for itself. Every field that ends up in a remote command is
validated here, once: a broker is reached over SSH with a pinned host key and controlled through the
three service commands (``stop``, ``start``, ``status``), e.g. ``sudo systemctl stop kafka``.

A cluster's metadata lives in ZooKeeper (``metadata_mode`` ``zookeeper``, the default: the ``zookeeper`` connect
string) or, in KRaft (``kraft``), in the ``__cluster_metadata`` log of its controllers: ``controllers`` lists them in
the order the audit tries them, each a broker of the inventory (combined mode, reached through that broker's entry)
or a controller-only node with SSH fields of its own.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fleet_doctor.store import write_atomic

INVENTORY_VERSION = 1
SERVICE_COMMANDS = ("stop", "start", "status")
# optional, for a roll: a command printing Kafka's BrokerState gauge (and, in recovery, LogManager's
# remainingLogsToRecover / remainingSegmentsToRecover), and kafka-leader-election.sh with its connection options (the
# roll adds --election-type PREFERRED --path-to-json-file <file>) (docs/inventory.md)
OPTIONAL_SERVICE_COMMANDS = ("broker_state", "leader_election")
METADATA_MODES = ("zookeeper", "kraft")
CLUSTER_METADATA_DIR = "__cluster_metadata-0"  # the metadata log's partition dir inside metadata.log.dir
SSH_FIELDS = ("host", "ssh_port", "ssh_user", "ssh_key_file", "host_key")
_HOST_RE = re.compile(r"[A-Za-z0-9._:-]+")  # names and keys: fullmatch ($ lets "x\n" through)
_CLUSTER_RE = re.compile(r"[A-Za-z0-9_.-]+")
MAX_CLUSTER_NAME = 64  # the DAGs' tag cluster:<name> may have 100 characters, their ids 250
_CLUSTER_ID_RE = re.compile(r"[A-Za-z0-9_-]{22}")  # a Kafka Uuid, base64url without padding
_USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
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
    # the user the broker runs as; when set (an SSH user that is not Kafka's), every read and change of Kafka's files
    # runs as it through ``sudo -n -u <kafka_user> --`` (docs/inventory.md, "A least-privilege SSH user")
    kafka_user: str = ""

    def service_command(self, name: str) -> str:
        return self.service[name]


@dataclass(frozen=True)
class ControllerEntry:
    """A KRaft controller whose metadata log the audit reads. Combined mode (``process.roles=broker,controller``):
    ``id`` is a broker of the inventory and the SSH fields are None (that broker's entry is used); a controller-only
    node carries its own."""

    id: int  # node.id
    metadata_log_dir: str  # Kafka's metadata.log.dir: the log dir that holds __cluster_metadata-0 and meta.properties
    host: str | None = None
    ssh_port: int | None = None
    ssh_user: str | None = None
    ssh_key_file: str | None = None
    host_key: str | None = None  # pinned, as a broker's

    @property
    def combined(self) -> bool:
        return self.host is None


@dataclass(frozen=True)
class Inventory:
    cluster: str
    zookeeper: str  # Kafka's zookeeper.connect, chroot included ("" in KRaft)
    brokers: list[BrokerEntry]
    inventory_version: int = INVENTORY_VERSION
    extra: dict[str, Any] = field(default_factory=dict)
    # the brokers' static min.insync.replicas (server.properties), which ZooKeeper does not hold; None: Kafka's 1
    min_insync_replicas: int | None = None
    metadata_mode: str = "zookeeper"  # or "kraft": the metadata is read from the controllers' metadata log
    controllers: list[ControllerEntry] = field(default_factory=list)  # KRaft: in the order the audit tries them
    # the Kafka cluster's id (ZooKeeper's /cluster/id, KRaft's cluster.id): when set, a repair refuses a cluster
    # whose live id differs (a wrong ensemble or chroot); None: not checked against the inventory
    cluster_id: str | None = None
    # a repair acts on ZooKeeper (its lock, a topic-ID write) only as an identity (the Airflow connection
    # kafka_zk_<cluster>'s credentials), unless this says an anonymous session is meant (an open ZooKeeper)
    allow_anonymous_zookeeper: bool = False
    # when this cluster's nightly audit runs (a cron expression or an Airflow preset such as "@daily"); None: the
    # fleet's schedule, spread over its window (fleet_doctor.fleet_dags)
    schedule: str | None = None
    # this cluster's own notifiers, besides the fleet's (FLEET_DOCTOR_NOTIFIERS): [{"class": ..., "kwargs": {...}}]
    notifiers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def kraft(self) -> bool:
        return self.metadata_mode == "kraft"

    def broker(self, broker_id: int) -> BrokerEntry:
        found = next((b for b in self.brokers if b.id == broker_id), None)
        if found is None:
            raise KeyError(f"broker {broker_id} is not in the inventory of cluster {self.cluster}")
        return found

    def controller(self, controller_id: int) -> ControllerEntry:
        found = next((c for c in self.controllers if c.id == controller_id), None)
        if found is None:
            raise KeyError(f"controller {controller_id} is not in the inventory of cluster {self.cluster}")
        return found

    def to_dict(self) -> dict[str, Any]:
        """The inventory file's form: a ZooKeeper inventory without the KRaft fields, controllers without the SSH
        fields they take from their broker."""
        data = asdict(self)
        for b in data["brokers"]:
            if not b["kafka_user"]:
                del b["kafka_user"]  # optional: an inventory without it reads as before
        if self.kraft:
            data["controllers"] = [{k: v for k, v in asdict(c).items() if v is not None} for c in self.controllers]
        else:
            del data["metadata_mode"], data["controllers"]
        for optional in ("schedule", "notifiers"):  # an inventory without them reads as before
            if not data[optional]:
                del data[optional]
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def save(self, path: Path) -> None:
        write_atomic(path, self.to_json().encode("utf-8"))

    def ssh_connection_id(self, broker_id: int) -> str:
        return f"kafka_ssh_{self.cluster}_{broker_id}"

    def controller_connection_id(self, controller_id: int) -> str:
        """A combined controller's SSH connection is its broker's; a controller-only node has its own."""
        c = self.controller(controller_id)
        return self.ssh_connection_id(c.id) if c.combined else f"kafka_ssh_{self.cluster}_controller_{c.id}"

    def controller_endpoint(self, controller_id: int) -> dict[str, Any]:
        """How the audit reaches a controller (JSON-able, for XCom): SSH fields (a combined controller's from its
        broker), the pinned host key, the connection id and the metadata log dir."""
        c = self.controller(controller_id)
        ssh = self.broker(c.id) if c.combined else c
        return {
            "controller_id": c.id,
            "combined": c.combined,
            **{k: getattr(ssh, k) for k in SSH_FIELDS},
            "ssh_conn_id": self.controller_connection_id(c.id),
            "metadata_log_dir": c.metadata_log_dir,
        }

    @property
    def zookeeper_connection_id(self) -> str:
        return f"kafka_zk_{self.cluster}"

    def airflow_connections(self) -> dict[str, dict[str, Any]]:
        """Connections in ``airflow connections import`` JSON form: one SSH connection per broker and per
        controller-only node (the SSH provider's extras: key_file, pinned host_key, host key checking on), and one
        for ZooKeeper (none in KRaft)."""
        conns: dict[str, dict[str, Any]] = {}
        for b in self.brokers:
            conns[self.ssh_connection_id(b.id)] = _ssh_connection(b)
        for c in self.controllers:
            if not c.combined:
                conns[self.controller_connection_id(c.id)] = _ssh_connection(c)
        if self.kraft:
            return conns
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


def _ssh_connection(node: BrokerEntry | ControllerEntry) -> dict[str, Any]:
    return {
        "conn_type": "ssh",
        "host": node.host,
        "port": node.ssh_port,
        "login": node.ssh_user,
        "extra": {
            "key_file": node.ssh_key_file,
            "host_key": node.host_key,
            "no_host_key_check": False,
            "allow_host_key_change": False,
            "conn_timeout": 10,
        },
    }


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


def _kafka_user(b: dict[str, Any], where: str) -> str:
    user = b.get("kafka_user", "")
    if not isinstance(user, str) or (user and not _USER_RE.fullmatch(user)):
        raise InventoryError(f"{where}: kafka_user must be a user name of [a-z_][a-z0-9_-]* ({user!r})")
    return user


def _host(obj: dict[str, Any], where: str) -> str:
    host = _req(obj, "host", str, where)
    if not _HOST_RE.fullmatch(host):
        raise InventoryError(f"{where}: invalid host {host!r}")
    return host


def _host_key(obj: dict[str, Any], where: str) -> str:
    host_key = _req(obj, "host_key", str, where)
    if not _HOST_KEY_RE.fullmatch(host_key):
        raise InventoryError(f"{where}: host_key must be '<type> <base64>' (a pinned public host key)")
    return host_key


def _metadata_log_dir(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\n" in value:
        raise InventoryError(f"{where}: metadata_log_dir must be an absolute path (Kafka's metadata.log.dir)")
    if value.rstrip("/").rsplit("/", 1)[-1] == CLUSTER_METADATA_DIR:
        raise InventoryError(
            f"{where}: metadata_log_dir is the log dir that holds {CLUSTER_METADATA_DIR} (Kafka's metadata.log.dir), "
            f"not {CLUSTER_METADATA_DIR} itself: {value!r}"
        )
    return value.rstrip("/") or "/"


def _controllers(data: dict[str, Any], brokers: list[BrokerEntry], source: str) -> list[ControllerEntry]:
    """KRaft: every controller once, in the file's order (the order the audit tries them); a broker's id means
    combined mode (its metadata_log_dir defaults to the broker's first log dir, as Kafka's metadata.log.dir does),
    any other id a controller-only node with its own SSH fields."""
    by_id = {b.id: b for b in brokers}
    raw = _req(data, "controllers", list, source)
    if not raw:
        raise InventoryError(f"{source}: metadata_mode kraft needs at least one entry in controllers")
    out: list[ControllerEntry] = []
    for i, c in enumerate(raw):
        where = f"{source}: controllers[{i}]"
        if not isinstance(c, dict):
            raise InventoryError(f"{where}: not an object")
        cid = _req(c, "id", int, where)
        if any(o.id == cid for o in out):
            raise InventoryError(f"{where}: duplicate controller id {cid}")
        unknown = set(c) - {"id", "metadata_log_dir", *SSH_FIELDS}
        if unknown:
            raise InventoryError(f"{where}: unknown field(s) {sorted(unknown)}")
        if cid in by_id:
            given = sorted(set(c) & set(SSH_FIELDS))
            if given:
                raise InventoryError(
                    f"{where}: controller {cid} is broker {cid} of the inventory (combined mode, reached through "
                    f"that broker's entry): drop {given}, or give a controller-only node an id no broker has"
                )
            log_dir = c.get("metadata_log_dir", by_id[cid].log_dirs[0])
            out.append(ControllerEntry(id=cid, metadata_log_dir=_metadata_log_dir(log_dir, where)))
            continue
        if "host" not in c:
            raise InventoryError(
                f"{where}: controller {cid} is no broker of the inventory: a controller-only node needs "
                f"{', '.join(SSH_FIELDS)} and metadata_log_dir"
            )
        out.append(
            ControllerEntry(
                id=cid,
                metadata_log_dir=_metadata_log_dir(_req(c, "metadata_log_dir", str, where), where),
                host=_host(c, where),
                ssh_port=_req(c, "ssh_port", int, where),
                ssh_user=_req(c, "ssh_user", str, where),
                ssh_key_file=_req(c, "ssh_key_file", str, where),
                host_key=_host_key(c, where),
            )
        )
    return out


def parse(data: dict[str, Any], source: str = "inventory") -> Inventory:
    if _req(data, "inventory_version", int, source) != INVENTORY_VERSION:
        raise InventoryError(f"{source}: unsupported inventory_version {data['inventory_version']}")
    cluster = _req(data, "cluster", str, source)
    if not _CLUSTER_RE.fullmatch(cluster) or cluster.startswith(".") or len(cluster) > MAX_CLUSTER_NAME:
        raise InventoryError(
            f"{source}: cluster name {cluster!r} must match {_CLUSTER_RE.pattern}, not start with '.' and have at most "
            f"{MAX_CLUSTER_NAME} characters (it names the cluster's DAGs and their tag, its Airflow connections and "
            "its place in the data store)"
        )
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
        host, host_key = _host(b, where), _host_key(b, where)
        service = _req(b, "service", dict, where)
        for name in SERVICE_COMMANDS:
            if not isinstance(service.get(name), str) or not service[name].strip():
                raise InventoryError(f"{where}: service.{name} must be a non-empty command")
        for name in OPTIONAL_SERVICE_COMMANDS:
            if name in service and (not isinstance(service[name], str) or not service[name].strip()):
                raise InventoryError(f"{where}: service.{name}, when given, must be a non-empty command")
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
                kafka_user=_kafka_user(b, where),
            )
        )
    min_isr = data.get("min_insync_replicas")
    if min_isr is not None and (not isinstance(min_isr, int) or isinstance(min_isr, bool) or min_isr < 1):
        raise InventoryError(f"{source}: min_insync_replicas must be a positive integer (the brokers' static default)")
    mode = data.get("metadata_mode", "zookeeper")
    if mode not in METADATA_MODES:
        raise InventoryError(f"{source}: metadata_mode must be one of {', '.join(METADATA_MODES)} ({mode!r})")
    if mode == "kraft":
        zookeeper = data.get("zookeeper") or ""  # a KRaft cluster has none (or one it migrated from: unused)
        if not isinstance(zookeeper, str):
            raise InventoryError(f"{source}: field 'zookeeper' has the wrong type ({type(zookeeper).__name__})")
        controllers = _controllers(data, brokers, source)
    else:
        zookeeper = _req(data, "zookeeper", str, source)
        if data.get("controllers"):
            raise InventoryError(f"{source}: controllers are for metadata_mode kraft (this inventory's is {mode})")
        controllers = []
    cluster_id = data.get("cluster_id")
    if cluster_id is not None and (not isinstance(cluster_id, str) or not _CLUSTER_ID_RE.fullmatch(cluster_id)):
        raise InventoryError(
            f"{source}: cluster_id must be Kafka's cluster id (22 base64url characters): {cluster_id!r}"
        )
    anonymous = data.get("allow_anonymous_zookeeper", False)
    if not isinstance(anonymous, bool):
        raise InventoryError(f"{source}: allow_anonymous_zookeeper must be true or false ({anonymous!r})")
    schedule = data.get("schedule")
    if schedule is not None and (not isinstance(schedule, str) or not schedule.strip()):
        raise InventoryError(f"{source}: schedule must be a cron expression or an Airflow preset ({schedule!r})")
    notifiers = data.get("notifiers") or []
    if not isinstance(notifiers, list) or not all(
        isinstance(n, dict) and isinstance(n.get("class"), str) and isinstance(n.get("kwargs", {}), dict)
        for n in notifiers
    ):
        raise InventoryError(f'{source}: notifiers must be a list of {{"class": ..., "kwargs": {{...}}}}')
    return Inventory(
        cluster=cluster,
        cluster_id=cluster_id,
        schedule=schedule.strip() if schedule else None,
        notifiers=[dict(n) for n in notifiers],
        allow_anonymous_zookeeper=anonymous,
        zookeeper=zookeeper,
        brokers=sorted(brokers, key=lambda b: b.id),
        extra=dict(data.get("extra") or {}),
        min_insync_replicas=min_isr,
        metadata_mode=mode,
        controllers=controllers,
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


# ---- a fleet: one inventory file, or a directory of them (one cluster each; docs/inventory.md, "A fleet of clusters")
INVENTORY_SUFFIX = ".json"


@dataclass(frozen=True)
class InventoryProblem:
    """An inventory file of the fleet that gives no cluster, and why (the message names the file and the field)."""

    path: str
    message: str


@dataclass(frozen=True)
class Fleet:
    """The clusters of a fleet by name (sorted), the file each came from, and the files that gave none: a broken
    inventory never hides the others."""

    clusters: dict[str, Inventory]
    sources: dict[str, Path]
    problems: list[InventoryProblem]


def inventory_files(path: str | Path) -> list[Path]:
    """The inventory files ``path`` names: itself (a file), or every ``*.json`` in it (a directory; not its
    subdirectories' files, nor hidden ones such as an editor's ``.x.json.swp`` or ``.#x.json``), sorted by name.
    InventoryError when ``path`` is neither or cannot be listed."""
    p = Path(path)
    if not p.is_dir():
        if not p.exists():
            raise InventoryError(f"{p}: no such inventory file or directory")
        return [p]
    try:
        names = sorted(e.name for e in os.scandir(p))
    except OSError as e:
        raise InventoryError(f"{p}: cannot list the inventory directory: {e.strerror or e}") from e
    return [p / n for n in names if n.endswith(INVENTORY_SUFFIX) and not n.startswith(".")]


def load_fleet(path: str | Path) -> Fleet:
    """Every cluster's inventory from ``path`` (``inventory_files``). A file that cannot be read, is not JSON or
    fails validation is a problem of its own; so is every file of a cluster that two files name, by name or by
    ``cluster_id`` (which one is meant cannot be told: neither is used until one is gone). A directory without an
    inventory is a problem too. InventoryError only when ``path`` itself cannot be read."""
    files = inventory_files(path)
    problems: list[InventoryProblem] = []
    loaded: list[tuple[Path, Inventory]] = []
    for f in files:
        try:
            loaded.append((f, load(f)))
        except InventoryError as e:
            problems.append(InventoryProblem(str(f), str(e)))
    if not files:
        problems.append(InventoryProblem(str(path), f"{path}: no inventory (*{INVENTORY_SUFFIX}) in the directory"))
    ambiguous: set[Path] = set()
    for what in ("cluster", "cluster_id"):  # a cluster's name (its connection ids) and Kafka's id for it
        by_key: dict[str, list[Path]] = {}
        for f, inv in loaded:
            if getattr(inv, what) is not None:
                by_key.setdefault(getattr(inv, what), []).append(f)
        for value, named in sorted(by_key.items()):
            if len(named) > 1:
                for f in named:
                    if f not in ambiguous:
                        others = ", ".join(str(o) for o in named if o != f)
                        problems.append(
                            InventoryProblem(
                                str(f),
                                f"{f}: {what} {value!r} is also in {others}: which inventory is meant cannot be told, "
                                "so none of them is used (remove or rename all but one)",
                            )
                        )
                ambiguous.update(named)
    used = sorted(((f, inv) for f, inv in loaded if f not in ambiguous), key=lambda fi: fi[1].cluster)
    problems.sort(key=lambda p: p.path)
    return Fleet({inv.cluster: inv for _, inv in used}, {inv.cluster: f for f, inv in used}, problems)
