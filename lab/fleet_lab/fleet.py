"""The fleet lab: a Kafka cluster on one machine where only the broker JVM is a stand-in.

``up`` starts, all on 127.0.0.1 with free ports: one ZooKeeper 3.8 server (Debian package, private data
dir, admin server off), one real ``sshd`` per broker (own port and host key; the lab's client key and the
pinned host keys are written for the product), and one lab broker (``fleet_lab.broker``) per host,
controlled through a ``kafka-service`` command like a systemd unit. Before the brokers start, their log
dirs are written as a cleanly stopped Kafka of the chosen version leaves them: topics with real record
batches (the formats of ``fleet_doctor.probe``), replicas on several brokers, and, where it fits, the
genuine ``my-topic`` partitions of the corpus's 3-broker cluster. ``down`` stops every process it
started, by PID. Labs in different directories run side by side.

Layout of a lab dir::

    lab.json                   state: ports, PIDs, brokers
    inventory.json             the cluster inventory the product reads (docs/inventory.md)
    airflow-connections.json   the matching Airflow connections (``airflow connections import``)
    airflow-connections.env    the same as AIRFLOW_CONN_* variables
    ssh/id_ed25519[.pub]       the lab's client key; ssh/known_hosts: the pinned host keys
    zookeeper/                 the ZooKeeper server's config, data and log
    broker-<id>/               sshd config, host key and log; broker.json, kafka-service, server.log
    broker-<id>/data-<k>/      the broker's log dirs
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fleet_doctor import inventory as inv
from fleet_doctor.probe import (
    LEADER_EPOCH_CHECKPOINT,
    PARTITION_METADATA,
    parse_leader_epoch_checkpoint,
    parse_partition_dir_name,
    parse_partition_metadata,
)
from fleet_doctor.remote import as_user
from fleet_lab import kraft, python_path
from fleet_lab.broker import BrokerConfig, running_pid
from fleet_lab.kafka_files import (
    KafkaFeatures,
    PartitionLogWriter,
    Record,
    encode_offset_checkpoint,
    log_end_offset,
    random_topic_id,
    recover_segment,
    segment_bases,
    write_atomic,
    write_clean_shutdown,
    write_meta_properties,
    write_partition_metadata,
)
from fleet_lab.zk_server import ZooKeeperServer, free_ports, pid_alive, proc_stat, process_mentions

DEFAULT_CLUSTER = "lab"  # the lab cluster's name (its inventory, its DAGs kafka_fleet_<kind>__lab)

REPO = Path(__file__).resolve().parents[2]
CORPUS = Path(os.environ.get("FLEET_DOCTOR_CORPUS", REPO.parent / "shared" / "kafka-real-data"))
DEFAULT_DIR = REPO / ".lab"
DEFAULT_VERSION = "3.6.2"
DEFAULT_KRAFT_VERSION = "3.7.1"  # a KRaft lab writes Kafka 3.7's metadata (fleet_lab.kraft)
METADATA_MODES = ("zookeeper", "kraft")
# KRaft: the metadata log's segment.bytes (Kafka's minimum is 8 MiB outside tests; small here, like the partitions' 16
# KiB, so that a lab's metadata log has several segments), metadata.log.max.record.bytes.between.snapshots (20 MiB)
METADATA_SEGMENT_BYTES = 4096
METADATA_SNAPSHOT_BYTES = 8192
METADATA_IDLE_INTERVAL_MS = 500  # metadata.max.idle.interval.ms, Kafka's default: the leader's NoOpRecord (3.3+)
CHROOT = "/kafka"
SSHD = "/usr/sbin/sshd"
SYSTEM_PYTHON = "/usr/bin/python3"  # a broker host's python3: what a lab broker run as the Kafka user runs on
LAB_SEGMENT_BYTES = 16384  # small segments: every partition has several
ZK_TICK_MS = 500  # sessions of 1-10 s: a killed broker's ephemeral znodes go within seconds
BROKER_SESSION_TIMEOUT_S = 3.0
# (name, partitions, replication factor cap, min.insync.replicas cap, appends per partition)
LAB_TOPICS = (
    ("orders", 6, 3, 2, 160),
    ("payments", 3, 3, 2, 120),
    ("clickstream", 4, 2, 1, 200),
    ("__consumer_offsets", 3, 3, 2, 40),
)
THILLAI = "zk-3.9-3broker-thillai"  # a genuine 3-broker ZooKeeper cluster (Kafka 3.9): MANIFEST.md
THILLAI_TOPIC = "my-topic"
THILLAI_TOPIC_ID = "KheAqUg2T_C_ZwEhjgxjzw"
THILLAI_ASSIGNMENT = {0: [2, 1, 0], 1: [1, 0, 2], 2: [0, 2, 1]}  # thillai broker ids


class LabError(RuntimeError):
    """A lab command could not do what it was asked (the message says why)."""


@dataclass
class LabBrokerState:
    id: int
    ssh_port: int
    listener_port: int
    sshd_pid: int | None
    run_dir: str
    log_dirs: list[str]
    host_key: str

    @property
    def config_path(self) -> Path:
        return Path(self.run_dir) / "broker.json"

    @property
    def service_script(self) -> Path:
        return Path(self.run_dir) / "kafka-service"

    def config(self) -> BrokerConfig:
        return BrokerConfig.load(self.config_path)


@dataclass
class LabState:
    dir: str
    cluster: str
    cluster_id: str
    kafka_version: str
    zk_port: int
    zk_pid: int | None
    user: str
    brokers: list[LabBrokerState] = field(default_factory=list)
    metadata_mode: str = "zookeeper"  # or "kraft": no ZooKeeper, every broker a combined KRaft node and voter
    # the user the brokers run as and own their log dirs ("": the lab's own); the SSH user (``user``) then reaches
    # its files through ``sudo -n -u <kafka_user>`` as a least-privilege SSH user does in production
    kafka_user: str = ""
    racks: int = 0  # broker.rack: broker i of n in rack-(i mod racks) (0: no racks)
    recovery_bytes_per_s: float = 0.0  # the brokers' log recovery rate after an unclean stop (0: instant)
    # Kafka's timing of a restart, where a roll waits on it (0: as fast as the lab goes): a ZooKeeper broker's
    # controlled shutdown, and the load of each log at start
    controlled_shutdown_ms: int = 0
    log_load_delay_ms: int = 0

    @property
    def kraft(self) -> bool:
        return self.metadata_mode == "kraft"

    def rack(self, broker_id: int) -> str | None:
        """The broker's rack: consecutive brokers in different racks, so that the lab's assignment (each partition
        on consecutive brokers) spans racks whenever its replication factor is at most ``racks`` and ``racks``
        divides the broker count (Kafka's rack-aware assignment interleaves brokers by rack the same way)."""
        if not self.racks:
            return None
        i = [b.id for b in self.brokers].index(broker_id)
        return f"rack-{i % self.racks}"

    @property
    def zookeeper(self) -> str:
        return "" if self.kraft else f"127.0.0.1:{self.zk_port}{CHROOT}"

    @property
    def path(self) -> Path:
        return Path(self.dir)

    def broker(self, broker_id: int) -> LabBrokerState:
        for b in self.brokers:
            if b.id == broker_id:
                return b
        raise LabError(f"no broker {broker_id} in the lab at {self.dir} (brokers: {[b.id for b in self.brokers]})")

    def save(self) -> None:
        write_atomic(self.path / "lab.json", (json.dumps(asdict(self), indent=2) + "\n").encode())

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> LabState:
        p = Path(directory) / "lab.json"
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except OSError as e:
            raise LabError(f"no fleet lab at {directory} ({p}: {e.strerror})") from e
        data["brokers"] = [LabBrokerState(**b) for b in data["brokers"]]
        return cls(**data)

    @property
    def inventory_path(self) -> Path:
        return self.path / "inventory.json"

    @property
    def features(self) -> KafkaFeatures:
        return KafkaFeatures.of(self.kafka_version)

    def zk_client(self, timeout: float = 10.0) -> Any:
        from kazoo.client import KazooClient

        zk = KazooClient(hosts=self.zookeeper, timeout=timeout)
        zk.start(timeout=timeout)
        return zk

    @contextlib.contextmanager
    def zk_session(self, timeout: float = 10.0) -> Iterator[Any]:
        """A ZooKeeper session of the lab's ensemble, closed on the way out (even when the body raises)."""
        zk = self.zk_client(timeout)
        try:
            yield zk
        finally:
            zk.stop()
            zk.close()


# --------------------------------------------------------------------------------------------
# processes
def _terminate(pid: int | None, needle: str, timeout: float = 15.0, group: bool = False) -> None:
    if not process_mentions(pid, needle):
        return
    assert pid is not None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM) if group else os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.05)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL) if group else os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _keygen(path: Path, comment: str) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    kind, b64 = path.with_name(path.name + ".pub").read_text().split()[:2]
    return f"{kind} {b64}"


SSHD_CONFIG = """\
# fleet lab sshd for broker {id}: loopback only, keys only
Port {port}
ListenAddress 127.0.0.1
HostKey {host_key}
PidFile {run_dir}/sshd.pid
AuthorizedKeysFile {authorized_keys}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
AllowUsers {user}
PrintMotd no
LogLevel INFO
MaxStartups 50:30:100
Subsystem sftp internal-sftp
# each broker host its own home (its run dir), as a separate host has: a command over SSH runs in a login shell that
# reads ~/.bashrc, and the tester's is not a broker host's (a developer's pyenv init there cost ~100 ms of CPU per
# command, measured, and put its shims first in PATH: python3 was the tester's, not the host's /usr/bin/python3)
SetEnv HOME={run_dir}
"""


def _start_sshd(b: LabBrokerState, lab_dir: Path, user: str) -> int:
    run = Path(b.run_dir)
    cfg = run / "sshd_config"
    cfg.write_text(
        SSHD_CONFIG.format(
            id=b.id,
            port=b.ssh_port,
            host_key=run / "ssh_host_ed25519_key",
            run_dir=run,
            authorized_keys=lab_dir / "ssh" / "authorized_keys",
            user=user,
        ),
        encoding="utf-8",
    )
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    proc = subprocess.Popen(
        [SSHD, "-D", "-f", str(cfg), "-E", str(run / "sshd.log")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return proc.pid


def _wait_ssh_banner(port: int, pid: int, log: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise LabError(f"sshd on port {port} exited at start:\n{tail}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            if s.recv(64).startswith(b"SSH-2.0"):
                return
        time.sleep(0.05)
    raise LabError(f"sshd on port {port} did not answer within {timeout:.0f} s")


# --------------------------------------------------------------------------------------------
# data
def _records(topic: str, partition: int, n_appends: int) -> list[list[Record]]:
    """Deterministic produce requests: 1-4 records each, increasing timestamps."""
    base_ts = 1_763_000_000_000 + partition * 1000
    out = []
    offset = 0
    for i in range(n_appends):
        batch = []
        for _ in range(1 + (i * 7 + partition) % 4):
            key = f"{topic}-key-{offset % 50}".encode()
            value = json.dumps({"seq": offset, "topic": topic, "partition": partition, "pad": "x" * (offset % 40)})
            batch.append(Record(base_ts + offset * 37, key, value.encode()))
            offset += 1
        out.append(batch)
    return out


def _build_partition(path: Path, topic: str, partition: int, appends: int, features: KafkaFeatures) -> int:
    w = PartitionLogWriter(path, features, segment_bytes=LAB_SEGMENT_BYTES)
    for batch in _records(topic, partition, appends):
        w.append(batch, leader_epoch=0)
    return w.close().log_end_offset


def _copy_partition(src: Path, dst: Path, features: KafkaFeatures) -> int:
    """Copy a genuine partition dir; indexes absent from the corpus (>= 4 MiB preallocated ones) are
    rebuilt from the .log as Kafka's recovery would. Returns the log end offset."""
    shutil.copytree(src, dst)
    for p in [dst, *dst.iterdir()]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    for base in segment_bases(dst):
        if not (dst / f"{base:020d}.index").exists():
            recover_segment(dst, base, features)
    return log_end_offset(dst)


def _topic_znode(assignment: dict[int, list[int]], topic_id: str | None, features: KafkaFeatures) -> dict[str, Any]:
    parts = {str(p): r for p, r in sorted(assignment.items())}
    if features.uses_topic_ids:
        return {"partitions": parts, "topic_id": topic_id, "adding_replicas": {}, "removing_replicas": {}, "version": 3}
    if features.at_least("2.4"):
        return {"partitions": parts, "adding_replicas": {}, "removing_replicas": {}, "version": 2}
    return {"version": 1, "partitions": parts}


@dataclass
class _Replica:
    broker: int
    log_dir: Path
    leo: int


def _layout(state: LabState, features: KafkaFeatures) -> tuple[list[tuple[str, dict[int, list[int]], str, int]], bool]:
    """(topic, assignment, topic id, min.insync.replicas) for each lab topic; whether the corpus topic fits."""
    ids = [b.id for b in state.brokers]
    n = len(ids)
    scale = -(-n // 3)  # a bigger lab has more partitions, so that every broker holds replicas
    topics = []
    for i, (name, base_parts, rf_cap, min_isr_cap, _) in enumerate(LAB_TOPICS):
        parts = base_parts * scale
        rf = min(rf_cap, n)
        assignment = {p: [ids[(p + i + k) % n] for k in range(rf)] for p in range(parts)}
        topics.append((name, assignment, random_topic_id(), max(1, min(min_isr_cap, rf - 1))))
    corpus_fits = n >= 3 and features.uses_topic_ids and (CORPUS / THILLAI).is_dir()
    if corpus_fits:
        assignment = {p: [ids[b] for b in r] for p, r in THILLAI_ASSIGNMENT.items()}
        topics.append((THILLAI_TOPIC, assignment, THILLAI_TOPIC_ID, 2))
    return topics, corpus_fits


def _corpus_leader_epoch(partition: int) -> int:
    """The newest leader epoch any replica of the corpus partition recorded: ZooKeeper's state carries at
    least that epoch (a lower one would be the leader-epoch-ahead damage, not a pristine cluster)."""
    epochs = [0]
    for tb in THILLAI_ASSIGNMENT[partition]:
        lec = CORPUS / THILLAI / f"kafka-logs-{tb}" / f"{THILLAI_TOPIC}-{partition}" / LEADER_EPOCH_CHECKPOINT
        with contextlib.suppress(OSError, ValueError):
            entries = parse_leader_epoch_checkpoint(lec.read_bytes(), str(lec))
            epochs += [e for e, _ in entries]
    return max(epochs)


def _write_data(state: LabState) -> list[tuple[str, dict[int, list[int]], str, int]]:
    """Write every broker's log dirs as a cleanly stopped broker leaves them; returns the topic layout."""
    return _write_log_dirs(state)[0]


def _write_log_dirs(
    state: LabState,
) -> tuple[list[tuple[str, dict[int, list[int]], str, int]], dict[tuple[str, int, int], str]]:
    """The topic layout, and the log dir of each replica ((topic, partition, broker) -> log dir). A KRaft lab's
    meta.properties and clean-shutdown markers are written with its metadata (``_write_kraft_metadata``)."""
    f = state.features
    topics, _ = _layout(state, f)
    replicas: dict[int, list[tuple[str, int, Path, int]]] = {b.id: [] for b in state.brokers}
    scratch = state.path / "scratch"
    appends = {name: a for name, _, _, _, a in LAB_TOPICS}
    for topic, assignment, topic_id, _ in topics:
        for p, brokers in assignment.items():
            if topic == THILLAI_TOPIC:
                sources = {
                    state.brokers[tb].id: CORPUS / THILLAI / f"kafka-logs-{tb}" / f"{topic}-{p}" for tb in range(3)
                }
            else:
                src = scratch / f"{topic}-{p}"
                _build_partition(src, topic, p, appends[topic], f)
                sources = {b: src for b in brokers}
            for b in brokers:
                bs = state.broker(b)
                log_dir = Path(bs.log_dirs[len(replicas[b]) % len(bs.log_dirs)])  # round-robin over its log dirs
                dst = log_dir / f"{topic}-{p}"
                if topic == THILLAI_TOPIC:
                    leo = _copy_partition(sources[b], dst, f)
                else:
                    shutil.copytree(sources[b], dst)
                    leo = log_end_offset(dst)
                    if f.uses_topic_ids:
                        write_partition_metadata(dst, topic_id)
                replicas[b].append((topic, p, log_dir, leo))
    shutil.rmtree(scratch, ignore_errors=True)
    for b in state.brokers:
        for d in map(Path, b.log_dirs):
            mine = sorted((t, p, leo) for t, p, ld, leo in replicas[b.id] if ld == d)
            if not state.kraft:
                write_meta_properties(d, b.id, state.cluster_id, f)
            write_atomic(d / "recovery-point-offset-checkpoint", encode_offset_checkpoint(mine))
            write_atomic(d / "replication-offset-checkpoint", encode_offset_checkpoint(mine))
            if f.has_log_start_offset_checkpoint:
                write_atomic(d / "log-start-offset-checkpoint", encode_offset_checkpoint([]))
            if not state.kraft:
                write_clean_shutdown(d, f, 0)
    placement = {(t, p, bid): str(ld) for bid, rs in replicas.items() for t, p, ld, _leo in rs}
    return topics, placement


def _topic_configs(topic: str, min_isr: int) -> dict[str, str]:
    cfg = {"min.insync.replicas": str(min_isr)}
    if topic == "__consumer_offsets":
        cfg.update({"cleanup.policy": "compact", "compression.type": "producer"})
    return cfg


def _write_kraft_metadata(
    state: LabState,
    topics: list[tuple[str, dict[int, list[int]], str, int]],
    placement: dict[tuple[str, int, int], str],
) -> dict[str, str]:
    """A KRaft lab's metadata as a cluster whose nodes all stopped together leaves it (fleet_lab.kraft
    .write_stopped_cluster): every node's __cluster_metadata-0 in its first log dir, meta.properties version 1 with a
    directory.id per log dir, the clean-shutdown markers with each broker's epoch. Returns {log dir: directory.id}."""
    f = state.features
    dir_ids = {d: kraft.random_directory_id() for b in state.brokers for d in b.log_dirs}
    nodes = [
        kraft.NodeFiles(
            b.id, Path(b.log_dirs[0]), b.listener_port, {d: dir_ids[d] for d in b.log_dirs}, rack=state.rack(b.id)
        )
        for b in state.brokers
    ]
    specs = [
        kraft.TopicSpec(
            topic,
            topic_id,
            assignment,
            _topic_configs(topic, min_isr),
            {p: [dir_ids[placement[(topic, p, r)]] for r in rs] for p, rs in assignment.items()},
            {p: _corpus_leader_epoch(p) for p in assignment} if topic == THILLAI_TOPIC else {},
        )
        for topic, assignment, topic_id, min_isr in topics
    ]
    written = kraft.write_stopped_cluster(nodes, specs, f, METADATA_SEGMENT_BYTES)
    for b in state.brokers:
        for d in map(Path, b.log_dirs):
            kraft.write_kraft_meta_properties(d, b.id, state.cluster_id, dir_ids[str(d)])
            write_clean_shutdown(d, f, written["broker_epochs"][b.id])
    return dir_ids


def _write_zookeeper(state: LabState, topics: list[tuple[str, dict[int, list[int]], str, int]]) -> None:
    f = state.features
    from kazoo.client import KazooClient

    root = KazooClient(hosts=f"127.0.0.1:{state.zk_port}", timeout=10)
    root.start(timeout=15)
    try:
        root.ensure_path(CHROOT)
    finally:
        root.stop()
        root.close()
    zk = state.zk_client()
    try:
        for path in (
            "/brokers/ids",
            "/brokers/topics",
            "/brokers/seqid",
            "/admin/delete_topics",
            "/config/topics",
            "/config/brokers",
            "/config/changes",
            "/isr_change_notification",
            "/latest_producer_id_block",
        ):
            zk.ensure_path(path)
        zk.create("/cluster/id", json.dumps({"version": "1", "id": state.cluster_id}).encode(), makepath=True)
        zk.create("/controller_epoch", b"0")
        tx = zk.transaction()
        for topic, assignment, topic_id, min_isr in topics:
            tx.create(f"/brokers/topics/{topic}", json.dumps(_topic_znode(assignment, topic_id, f)).encode())
            tx.create(f"/brokers/topics/{topic}/partitions")
            cfg = {"min.insync.replicas": str(min_isr)}
            if topic == "__consumer_offsets":
                cfg.update({"cleanup.policy": "compact", "compression.type": "producer"})
            tx.create(f"/config/topics/{topic}", json.dumps({"version": 1, "config": cfg}).encode())
            for p, replicas in assignment.items():
                tx.create(f"/brokers/topics/{topic}/partitions/{p}")
                epoch = _corpus_leader_epoch(p) if topic == THILLAI_TOPIC else 0
                state_json = {
                    "controller_epoch": 0,
                    "leader": replicas[0],
                    "version": 1,
                    "leader_epoch": epoch,
                    "isr": list(replicas),
                }
                tx.create(f"/brokers/topics/{topic}/partitions/{p}/state", json.dumps(state_json).encode())
        results = tx.commit()
        errors = [r for r in results if isinstance(r, Exception)]
        if errors:
            raise LabError(f"writing the lab's ZooKeeper state failed: {errors[0]!r}")
    finally:
        zk.stop()
        zk.close()


# --------------------------------------------------------------------------------------------
# commands
def _service_script(b: LabBrokerState, kafka_user: str = "") -> str:
    if not kafka_user:
        return (
            "#!/bin/sh\n"
            "# fleet lab broker service control: start | stop | status | kill (the lab's `systemctl ... kafka`)\n"
            f"exec env PYTHONPATH='{python_path()}' '{sys.executable}' -m fleet_lab.broker "
            f"--config '{b.config_path}' \"$@\"\n"
        )
    # the broker runs as the Kafka user, as systemd's User=kafka runs Kafka: root (the lab itself) drops to it first;
    # a broker's own python3, on the lab's copy of its code (broker_code: the repository may be out of its reach)
    path = str(Path(b.run_dir).parent / BROKER_CODE)
    return (
        "#!/bin/sh\n"
        f"# fleet lab broker service control: start | stop | status | kill, the broker run as {kafka_user}\n"
        f'if [ "$(id -u)" = 0 ]; then exec setpriv --reuid={kafka_user} --regid={kafka_user} --init-groups '
        '-- "$0" "$@"; fi\n'
        f"exec env PYTHONPATH='{path}' '{SYSTEM_PYTHON}' -m fleet_lab.broker --config '{b.config_path}' \"$@\"\n"
    )


BROKER_CODE = "broker-code"  # in the lab dir: what a lab broker run as the Kafka user imports


def broker_code(lab_dir: Path) -> Path:
    """``<lab>/broker-code``: a copy of what a lab broker imports (the lab, the product, kazoo: pure Python), for a
    broker run as the Kafka user, who may not reach the repository or the venv (a clone in a private dir)."""
    import importlib.util

    code = lab_dir / BROKER_CODE
    kazoo = importlib.util.find_spec("kazoo")
    if kazoo is None or not kazoo.submodule_search_locations:
        raise LabError("kazoo is not installed: the lab broker needs it (bin/dev setup)")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    lab_path, plugins_path = python_path().split(os.pathsep)
    kazoo_path = next(iter(kazoo.submodule_search_locations))
    for package in (Path(lab_path) / "fleet_lab", Path(plugins_path) / "fleet_doctor", Path(kazoo_path)):
        shutil.copytree(package, code / package.name, ignore=skip, dirs_exist_ok=True)
    for d in (code, *code.rglob("*")):
        d.chmod(0o755 if d.is_dir() else 0o644)
    return code


def _broker_tmp(b: LabBrokerState) -> str:
    """The broker host's ``tmp_dir``: ``<run dir>/tmp``, sticky and world-writable as /tmp is (the SSH user's backup
    dirs and the Kafka user's spool both go there), gone with the lab (not the machine's /tmp); /tmp itself when the
    lab's path has a character an inventory's tmp_dir may not."""
    tmp = Path(b.run_dir) / "tmp"
    if not re.fullmatch(r"/[A-Za-z0-9._/-]*", str(tmp)):
        return "/tmp"
    tmp.mkdir(exist_ok=True)
    tmp.chmod(0o1777)
    return str(tmp)


def _service_commands(state: LabState, b: LabBrokerState) -> dict[str, str]:
    """The inventory's service commands: the script itself, or through sudo as the Kafka user (``sudo -n -u kafka
    -- .../kafka-service stop``: production's ``sudo systemctl stop kafka``) when the brokers run as one."""
    commands = {name: as_user(state.kafka_user, f"{b.service_script} {name}") for name in inv.SERVICE_COMMANDS}
    # a roll's: Kafka's BrokerState and recovery gauges, and kafka-leader-election.sh (fleet_lab.admin)
    commands["broker_state"] = as_user(state.kafka_user, f"{b.service_script} state")
    commands["leader_election"] = as_user(
        state.kafka_user, f"{b.service_script} leader-election --bootstrap-server 127.0.0.1:{b.listener_port}"
    )
    return commands


# --------------------------------------------------------------------------------------------
# a least-privilege SSH user (fleet-lab up --ssh-user U --kafka-user K; root only)
def ensure_user(name: str) -> pwd.struct_passwd:
    """The system user ``name``, made when missing (a home, /bin/sh, no password but not locked: sshd without PAM
    refuses a locked account even for a key)."""
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    subprocess.run(["useradd", "--system", "--create-home", "--shell", "/bin/sh", name], check=True)
    subprocess.run(["usermod", "-p", "*", name], check=True)
    return pwd.getpwnam(name)


def _grant_sudo(ssh_user: str, kafka_user: str) -> None:
    """``/etc/sudoers.d/fleet-lab-<ssh user>``: the SSH user may run anything as the Kafka user and nothing as root
    (docs/inventory.md's sudoers lines, the lab's broker service run as Kafka's user), checked by visudo."""
    rule = f"# fleet lab: {ssh_user} acts on the brokers as {kafka_user} (never as root)\n"
    rule += f"{ssh_user} ALL=({kafka_user}) NOPASSWD: ALL\n"
    path = Path("/etc/sudoers.d") / f"fleet-lab-{ssh_user}"
    if path.exists() and path.read_text() == rule:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(rule)
    tmp.chmod(0o440)
    checked = subprocess.run(["visudo", "-cf", str(tmp)], capture_output=True, text=True)
    if checked.returncode != 0:
        tmp.unlink()
        raise LabError(f"visudo refused the lab's sudoers rule: {checked.stdout}{checked.stderr}")
    tmp.replace(path)


def _least_privilege(lab_dir: Path, ssh_user: str, kafka_user: str) -> None:
    if os.geteuid() != 0:
        raise LabError("--ssh-user and --kafka-user need root: the lab makes the users and their sudoers rule")
    if not shutil.which("sudo") or not Path(SYSTEM_PYTHON).exists():
        raise LabError(f"--kafka-user needs sudo and {SYSTEM_PYTHON} (bin/dev setup installs them)")
    for parent in lab_dir.parents:
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            raise LabError(f"{parent} is not searchable by others: {ssh_user} and {kafka_user} cannot reach {lab_dir}")
    for name in {ssh_user, kafka_user} - {getpass.getuser()}:
        ensure_user(name)
    _grant_sudo(ssh_user, kafka_user)
    lab_dir.chmod(0o755)
    broker_code(lab_dir)


def own_as_kafka(state: LabState) -> None:
    """Every log dir and what it holds, and each broker's run dir, owned by the Kafka user (a lab that runs its
    brokers as one): after the lab writes data or injects an incident as root, the files are Kafka's again."""
    if not state.kafka_user:
        return
    who = pwd.getpwnam(state.kafka_user)
    for b in state.brokers:
        os.chown(b.run_dir, who.pw_uid, who.pw_gid)
        for d in b.log_dirs:
            for root, dirs, files in os.walk(d):
                for name in (root, *(os.path.join(root, n) for n in (*dirs, *files))):
                    os.chown(name, who.pw_uid, who.pw_gid, follow_symlinks=False)


def write_inventory(state: LabState) -> inv.Inventory:
    key = str(state.path / "ssh" / "id_ed25519")
    brokers = [
        inv.BrokerEntry(
            id=b.id,
            host="127.0.0.1",
            ssh_port=b.ssh_port,
            ssh_user=state.user,
            ssh_key_file=key,
            host_key=b.host_key,
            log_dirs=list(b.log_dirs),
            kafka_version=state.kafka_version,
            service=_service_commands(state, b),
            kafka_user=state.kafka_user,
            tmp_dir=_broker_tmp(b),
        )
        for b in state.brokers
    ]
    extra = {"lab_dir": state.dir, "known_hosts": str(state.path / "ssh" / "known_hosts")}
    if state.kraft:  # combined nodes: each controller is a broker of the inventory, reached through its entry
        inventory = inv.Inventory(
            cluster=state.cluster,
            zookeeper="",
            brokers=brokers,
            extra=extra,
            metadata_mode="kraft",
            controllers=[inv.ControllerEntry(id=b.id, metadata_log_dir=b.log_dirs[0]) for b in state.brokers],
        )
    else:
        # the lab's ZooKeeper runs without authentication: its inventory says an anonymous repair is meant
        inventory = inv.Inventory(
            cluster=state.cluster,
            zookeeper=state.zookeeper,
            brokers=brokers,
            extra=extra,
            allow_anonymous_zookeeper=True,
        )
    if state.kraft:  # a KRaft cluster has no ZooKeeper: the file leaves the field out (docs/inventory.md)
        data = {k: v for k, v in inventory.to_dict().items() if k != "zookeeper"}
        write_atomic(state.inventory_path, (json.dumps(data, indent=2) + "\n").encode("utf-8"))
    else:
        inventory.save(state.inventory_path)
    conns = inventory.airflow_connections()
    write_atomic(state.path / "airflow-connections.json", (json.dumps(conns, indent=2) + "\n").encode())
    env = "".join(
        f"export AIRFLOW_CONN_{cid.upper()}='{json.dumps(c, separators=(',', ':'))}'\n" for cid, c in conns.items()
    )
    write_atomic(state.path / "airflow-connections.env", env.encode())
    known = "".join(f"[127.0.0.1]:{b.ssh_port} {b.host_key}\n" for b in state.brokers)
    write_atomic(state.path / "ssh" / "known_hosts", known.encode())
    return inventory


def kill_sshd(state: LabState, broker_id: int) -> None:
    """The broker's sshd and every session it serves, killed at once (SIGKILL): the host as seen over SSH is gone,
    mid-command, while the broker itself (started detached, not below sshd) is left alone."""
    b = state.broker(broker_id)
    if b.sshd_pid and process_mentions(b.sshd_pid, b.run_dir):
        doomed = [b.sshd_pid, *descendants(b.sshd_pid)]  # each connection's sshd runs in a session of its own
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(pid_alive(p) for p in doomed) and time.monotonic() < deadline:
            time.sleep(0.05)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc: children by parent pid, recursively; they may have left its session
    or process group)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        fields = proc_stat(entry) if entry.isdigit() else None
        if fields is not None and len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


# 127.0.0.1, ::1 and ::ffff:127.0.0.1 (a JVM's IPv6 socket bound to 127.0.0.1) as /proc/net/tcp{,6} write them
LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


def listening_sockets(pids: list[int]) -> dict[tuple[str, int], list[int]]:
    """Every socket listening among ``pids``' open files: (address as /proc/net writes it, port) -> the pids."""
    inodes: dict[str, list[int]] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes.setdefault(link[8:-1], []).append(pid)
    out: dict[tuple[str, int], list[int]] = {}
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            fields = line.split()
            addr, hexport = fields[1].split(":")
            if fields[3] == "0A" and fields[9] in inodes:
                out.setdefault((addr, int(hexport, 16)), []).extend(inodes[fields[9]])
    return out


def start_sshd(state: LabState, broker_id: int) -> None:
    """Start the broker's sshd again (after ``kill_sshd``), on its port and host key, and wait for its banner."""
    b = state.broker(broker_id)
    b.sshd_pid = _start_sshd(b, state.path, state.user)
    state.save()
    _wait_ssh_banner(b.ssh_port, b.sshd_pid, Path(b.run_dir) / "sshd.log")


def run_service(b: LabBrokerState, command: str, timeout: float = 90.0) -> subprocess.CompletedProcess[str]:
    """Run the broker's service command locally (the product runs the same command over SSH)."""
    return subprocess.run(
        [str(b.service_script), command], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def is_up(directory: Path) -> bool:
    try:
        state = LabState.load(directory)
    except LabError:
        return False
    return any(p for p in _lab_pids(state).values())


def _lab_pids(state: LabState) -> dict[str, int | None]:
    zk = state.zk_pid if not state.kraft and process_mentions(state.zk_pid, state.dir) else None
    pids: dict[str, int | None] = {"zookeeper": zk}
    for b in state.brokers:
        pids[f"sshd-{b.id}"] = b.sshd_pid if process_mentions(b.sshd_pid, b.run_dir) else None
        with contextlib.suppress(OSError, ValueError, TypeError):
            pids[f"broker-{b.id}"] = running_pid(b.config())
    return pids


@contextlib.contextmanager
def _down_on_failure(lab_dir: Path) -> Iterator[None]:
    """Whatever fails while a lab comes up (or Ctrl-C), everything started so far is stopped again."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            down(lab_dir)
        raise


def _fresh_lab_dir(lab_dir: Path, cluster: str) -> str:
    """An empty lab dir with the lab's SSH client key (refused while a lab is up there); the lab user."""
    if is_up(lab_dir):
        raise LabError(f"a fleet lab is already up at {lab_dir}: run `fleet-lab down --dir {lab_dir}` first")
    if lab_dir.exists():
        shutil.rmtree(lab_dir)
    (lab_dir / "ssh").mkdir(parents=True)
    client_pub = _keygen(lab_dir / "ssh" / "id_ed25519", f"fleet-doctor@{cluster}")
    (lab_dir / "ssh" / "authorized_keys").write_text(client_pub + "\n")
    return getpass.getuser()


def _add_hosts(state: LabState, brokers: int, log_dirs_per_broker: int) -> None:
    """One host per broker: its run dir, host key, empty log dirs, ports and running sshd."""
    lab_dir = Path(state.dir)
    # every port at once: a broker's listener is bound only when the broker starts, after every sshd, so ports chosen
    # one at a time could give a listener's port to a later sshd too ("Address already in use" at the start)
    ports = iter(free_ports(2 * brokers, taken=[state.zk_port] if state.zk_port else []))
    for bid in range(1, brokers + 1):
        run = lab_dir / f"broker-{bid}"
        run.mkdir()
        host_key = _keygen(run / "ssh_host_ed25519_key", f"broker-{bid}")
        log_dirs = [str(run / f"data-{k}") for k in range(log_dirs_per_broker)]
        for d in log_dirs:
            Path(d).mkdir()
        b = LabBrokerState(bid, next(ports), next(ports), None, str(run), log_dirs, host_key)
        state.brokers.append(b)
        b.sshd_pid = _start_sshd(b, lab_dir, state.user)
    state.save()


def _start_brokers(state: LabState) -> None:
    """Write the service scripts and the inventory, start every broker through its sshd's service command and wait
    until healthy."""
    for b in state.brokers:
        b.service_script.write_text(_service_script(b, state.kafka_user))
        b.service_script.chmod(0o755)
    own_as_kafka(state)
    write_inventory(state)
    for b in state.brokers:
        _wait_ssh_banner(b.ssh_port, b.sshd_pid or 0, Path(b.run_dir) / "sshd.log")
    with ThreadPoolExecutor(max_workers=len(state.brokers)) as pool:
        results = list(pool.map(lambda b: run_service(b, "start"), state.brokers))
    failed = [(b, r) for b, r in zip(state.brokers, results, strict=True) if r.returncode != 0]
    if failed:
        b, r = failed[0]
        raise LabError(f"broker {b.id} did not start: {r.stdout}{r.stderr}")
    wait_healthy(state, timeout=30)


def up(
    directory: str | os.PathLike[str] = DEFAULT_DIR,
    *,
    brokers: int = 3,
    kafka_version: str | None = None,
    log_dirs_per_broker: int = 1,
    cluster: str = DEFAULT_CLUSTER,
    metadata: str = "zookeeper",
    ssh_user: str = "",
    kafka_user: str = "",
    racks: int = 0,
    recovery_bytes_per_s: float = 0.0,
    controlled_shutdown_ms: int = 0,
    log_load_delay_ms: int = 0,
) -> LabState:
    lab_dir = Path(directory).resolve()
    if brokers < 1 or log_dirs_per_broker < 1:
        raise LabError("--brokers and --log-dirs-per-broker must be at least 1")
    if racks < 0 or recovery_bytes_per_s < 0:
        raise LabError("--racks and --recovery-rate must not be negative")
    if metadata not in METADATA_MODES:
        raise LabError(f"--metadata must be one of {', '.join(METADATA_MODES)} ({metadata!r})")
    if kafka_version is None:
        kafka_version = DEFAULT_KRAFT_VERSION if metadata == "kraft" else DEFAULT_VERSION
    features = KafkaFeatures.of(kafka_version)  # validates the version
    if metadata == "kraft":
        if not kraft.supports_kraft(features):
            raise LabError(f"the KRaft lab writes Kafka 3.7's metadata: --kafka-version 3.7.x ({kafka_version})")
        if ssh_user or kafka_user:
            raise LabError(
                "--ssh-user / --kafka-user: the KRaft lab runs as the lab's user (repairs on KRaft: issue 30)"
            )
        return _up_kraft(
            lab_dir, brokers, str(kafka_version), log_dirs_per_broker, cluster, racks, recovery_bytes_per_s
        )
    user = _fresh_lab_dir(lab_dir, cluster)
    if ssh_user and not kafka_user:
        raise LabError("--ssh-user needs --kafka-user: the user the brokers run as, which the SSH user acts as")
    if kafka_user:
        user = ssh_user or user
        _least_privilege(lab_dir, user, kafka_user)
    zk = ZooKeeperServer(lab_dir / "zookeeper", tick_time_ms=ZK_TICK_MS)
    state = LabState(
        str(lab_dir),
        cluster,
        random_topic_id(),
        str(kafka_version),
        0,
        None,
        user,
        kafka_user=kafka_user,
        racks=racks,
        recovery_bytes_per_s=recovery_bytes_per_s,
        controlled_shutdown_ms=controlled_shutdown_ms,
        log_load_delay_ms=log_load_delay_ms,
    )
    with _down_on_failure(lab_dir):
        zk.start()
        state.zk_port, state.zk_pid = zk.port or 0, zk.detach()
        _add_hosts(state, brokers, log_dirs_per_broker)
        topics = _write_data(state)
        _write_zookeeper(state, topics)
        for b in state.brokers:
            BrokerConfig(
                broker_id=b.id,
                zookeeper=state.zookeeper,
                log_dirs=b.log_dirs,
                kafka_version=state.kafka_version,
                listener_port=b.listener_port,
                run_dir=b.run_dir,
                cluster_id=state.cluster_id if features.meta_properties_has_cluster_id else None,
                session_timeout_s=BROKER_SESSION_TIMEOUT_S,
                rack=state.rack(b.id),
                recovery_bytes_per_s=state.recovery_bytes_per_s,
                controlled_shutdown_ms=state.controlled_shutdown_ms,
                log_load_delay_ms=state.log_load_delay_ms,
            ).save(b.config_path)
        _start_brokers(state)
    return state


def _up_kraft(
    lab_dir: Path,
    n: int,
    kafka_version: str,
    log_dirs_per_broker: int,
    cluster: str,
    racks: int = 0,
    recovery_bytes_per_s: float = 0.0,
) -> LabState:
    """``up --metadata kraft``: no ZooKeeper; every broker a combined node (process.roles=broker,controller) and a
    voter of the quorum (fleet_lab.quorum), its metadata log in its first log dir."""
    user = _fresh_lab_dir(lab_dir, cluster)
    state = LabState(
        str(lab_dir),
        cluster,
        random_topic_id(),
        kafka_version,
        0,
        None,
        user,
        metadata_mode="kraft",
        racks=racks,
        recovery_bytes_per_s=recovery_bytes_per_s,
    )
    with _down_on_failure(lab_dir):
        _add_hosts(state, n, log_dirs_per_broker)
        topics, placement = _write_log_dirs(state)
        dir_ids = _write_kraft_metadata(state, topics, placement)
        voters = [{"id": b.id, "run_dir": b.run_dir, "metadata_log_dir": b.log_dirs[0]} for b in state.brokers]
        for b in state.brokers:
            BrokerConfig(
                broker_id=b.id,
                zookeeper="",
                log_dirs=b.log_dirs,
                kafka_version=state.kafka_version,
                listener_port=b.listener_port,
                run_dir=b.run_dir,
                cluster_id=state.cluster_id,
                session_timeout_s=BROKER_SESSION_TIMEOUT_S,
                rack=state.rack(b.id),
                recovery_bytes_per_s=state.recovery_bytes_per_s,
                kraft={
                    "node_id": b.id,
                    "voters": voters,
                    "quorum_lock": str(lab_dir / "kraft-quorum.lock"),
                    "directory_ids": {d: dir_ids[d] for d in b.log_dirs},
                    "segment_bytes": METADATA_SEGMENT_BYTES,
                    "snapshot_bytes": METADATA_SNAPSHOT_BYTES,
                    "session_timeout_ms": int(BROKER_SESSION_TIMEOUT_S * 1000),
                    "idle_interval_ms": METADATA_IDLE_INTERVAL_MS,
                },
            ).save(b.config_path)
        _start_brokers(state)
    return state


def quorum_leader(state: LabState) -> tuple[int, int] | None:
    """(node id, epoch) of the KRaft quorum's leader: the running node that leads at the highest epoch, by the
    nodes' own views (fleet_lab.quorum); None when no running node leads."""
    from fleet_lab.quorum import alive_view

    leaders = []
    for b in state.brokers:
        view = alive_view(Path(b.run_dir))
        if view is not None and view.get("leader_id") == b.id:
            leaders.append((int(view["leader_epoch"]), b.id))
    if not leaders:
        return None
    epoch, node = max(leaders)
    return node, epoch


def read_metadata(state: LabState, broker_id: int | None = None) -> list[dict[str, Any]]:
    """The cluster metadata as the product's decoder reads it from a node's metadata log (the quorum leader's by
    default)."""
    from fleet_doctor.cluster_metadata import read_cluster_metadata

    if broker_id is None:
        leader = quorum_leader(state)
        if leader is None:
            raise LabError(f"the KRaft lab at {state.dir} has no quorum leader")
        broker_id = leader[0]
    return read_cluster_metadata(state.broker(broker_id).log_dirs[0])


def _kraft_health_problem(state: LabState, expect_down: frozenset[int]) -> str | None:
    from fleet_lab.quorum import alive_view

    if quorum_leader(state) is None:
        return "no quorum leader"
    records = read_metadata(state)
    views = {b.id: alive_view(Path(b.run_dir)) for b in state.brokers}
    registered = {r["broker_id"]: r for r in records if r["kind"] == "broker"}
    want = {b.id for b in state.brokers} - set(expect_down)
    for bid in sorted(want):
        view, reg = views[bid], registered.get(bid)
        if view is None:
            return f"broker {bid} is not running"
        if reg is None or reg["incarnation_id"] != view["incarnation_id"]:
            return f"broker {bid} is not registered (incarnation {view['incarnation_id']})"
        if reg["fenced"]:
            return f"broker {bid} is fenced"
    live = {bid for bid in want if not registered[bid]["fenced"]}
    for r in records:
        if r["kind"] != "partition_state":
            continue
        name = f"{r['topic']}-{r['partition']}"
        if r["leader"] not in live:
            return f"{name} has no live leader (leader {r['leader']}, ISR {r['isr']})"
        missing = {x for x in r["replicas"] if x in want} - set(r["isr"])
        if missing:
            return f"{name}: replicas {sorted(missing)} not in ISR {r['isr']}"
    return None


def wait_healthy(state: LabState, timeout: float = 30.0, expect_down: frozenset[int] = frozenset()) -> None:
    """Until every running broker is registered, a controller is elected and every partition has a
    leader and its full replica set in ISR (brokers in ``expect_down`` excepted). KRaft: read from the metadata log
    by the product's decoder (registered in its current incarnation and unfenced)."""
    deadline = time.monotonic() + timeout
    if state.kraft:
        problem: str | None = "not checked"
        while time.monotonic() < deadline:
            try:
                problem = _kraft_health_problem(state, expect_down)
            except (OSError, ValueError, LabError) as e:
                problem = str(e)
            if problem is None:
                return
            time.sleep(0.05)
        raise LabError(f"lab not healthy after {timeout:.0f} s: {problem}")
    zk = state.zk_client()
    problem = "not checked"
    try:
        while time.monotonic() < deadline:
            problem = _health_problem(zk, state, expect_down)
            if problem is None:
                return
            time.sleep(0.1)
    finally:
        zk.stop()
        zk.close()
    raise LabError(f"lab not healthy after {timeout:.0f} s: {problem}")


def _health_problem(zk: Any, state: LabState, expect_down: frozenset[int]) -> str | None:
    live = {int(i) for i in zk.get_children("/brokers/ids")}
    want = {b.id for b in state.brokers} - set(expect_down)
    if not want <= live:
        return f"brokers not registered: {sorted(want - live)}"
    if not zk.exists("/controller"):
        return "no controller"
    for topic in zk.get_children("/brokers/topics"):
        znode = json.loads(zk.get(f"/brokers/topics/{topic}")[0])
        for p, replicas in znode["partitions"].items():
            raw = zk.exists(f"/brokers/topics/{topic}/partitions/{p}/state")
            if raw is None:
                return f"{topic}-{p} has no state"
            st = json.loads(zk.get(f"/brokers/topics/{topic}/partitions/{p}/state")[0])
            if st["leader"] not in live:
                return f"{topic}-{p} has no live leader ({st})"
            if set(st["isr"]) - live:
                return f"{topic}-{p}: ISR {st['isr']} still lists brokers that are gone"
            missing = {r for r in replicas if r in want} - set(st["isr"])
            if missing:
                return f"{topic}-{p}: replicas {sorted(missing)} not in ISR {st['isr']}"
    return None


def down(directory: str | os.PathLike[str] = DEFAULT_DIR) -> list[str]:
    """Stop every process of the lab (brokers cleanly, then sshd, then ZooKeeper), by PID."""
    state = LabState.load(directory)
    stopped = []
    for b in state.brokers:
        with contextlib.suppress(OSError, ValueError, TypeError):
            cfg = b.config()
            pid = running_pid(cfg)
            if pid:
                _terminate(pid, str(b.config_path), timeout=20)
                stopped.append(f"broker-{b.id} ({pid})")
    for b in state.brokers:
        if process_mentions(b.sshd_pid, b.run_dir):
            _terminate(b.sshd_pid, b.run_dir, group=True)
            stopped.append(f"sshd-{b.id} ({b.sshd_pid})")
    if not state.kraft and process_mentions(state.zk_pid, state.dir):
        _terminate(state.zk_pid, state.dir)
        stopped.append(f"zookeeper ({state.zk_pid})")
    return stopped


SNAPSHOT_FILE = "snapshot.json"  # in a snapshot: which brokers ran when it was taken (start starts those)
SETTLE_S = 1.0  # a started lab is ready when its leadership has not moved for this long


def start(directory: str | os.PathLike[str] = DEFAULT_DIR, brokers: Iterable[int] | None = None) -> LabState:
    """Start a lab that is down again from its own files (after ``down``, or put back by ``restore``): ZooKeeper on
    its port over its data, each broker's sshd on its port with its host key, then ``brokers`` through their
    service (default: those that ran when its snapshot was taken, else every one) until each is registered. Ports,
    keys and paths are the lab's own, so its inventory and connections still hold. It waits for registration, not
    for a healthy cluster: a lab in the middle of an incident (a replica out of ISR, a broker that refuses to
    start) comes back as it was."""
    lab_dir = Path(directory).resolve()
    state = LabState.load(lab_dir)
    if is_up(lab_dir):
        raise LabError(f"a fleet lab is already up at {lab_dir}: run `fleet-lab down --dir {lab_dir}` first")
    recorded = json.loads((lab_dir / SNAPSHOT_FILE).read_text()) if (lab_dir / SNAPSHOT_FILE).is_file() else {}
    if brokers is None:
        brokers = recorded.get("running", [b.id for b in state.brokers])
    wanted = sorted(set(brokers))
    controller = recorded.get("controller")  # started first, so that it is the controller again (plans name it)
    with _down_on_failure(lab_dir):
        if not state.kraft:
            zk = ZooKeeperServer(lab_dir / "zookeeper", port=state.zk_port, tick_time_ms=ZK_TICK_MS)
            zk.start()
            state.zk_pid = zk.detach()
        for b in state.brokers:
            b.sshd_pid = _start_sshd(b, lab_dir, state.user)
        state.save()
        for b in state.brokers:
            _wait_ssh_banner(b.ssh_port, b.sshd_pid or 0, Path(b.run_dir) / "sshd.log")
        first = [controller] if controller in wanted and not state.kraft else []
        for group in (first, [b for b in wanted if b not in first]):
            with ThreadPoolExecutor(max_workers=len(state.brokers)) as pool:
                results = list(pool.map(lambda bid: run_service(state.broker(bid), "start"), group))
            failed = [(bid, r) for bid, r in zip(group, results, strict=True) if r.returncode != 0]
            if failed:
                bid, r = failed[0]
                raise LabError(f"broker {bid} did not start: {r.stdout}{r.stderr}")
            if group and group == first:
                _wait_registered(state, first)
        if state.kraft:
            wait_healthy(state, timeout=30, expect_down=frozenset(b.id for b in state.brokers) - set(wanted))
        else:
            _wait_registered(state, wanted, settle_s=SETTLE_S, isr=recorded.get("isr"))
    return state


def _wait_registered(
    state: LabState,
    brokers: list[int],
    timeout: float = 60.0,
    settle_s: float = 0.0,
    isr: dict[str, list[int]] | None = None,
) -> None:
    """Until ``brokers`` are registered in ZooKeeper and a controller is elected; with ``isr`` (a snapshot's:
    ``topic-partition`` -> ISR), until every partition's ISR is that again; with ``settle_s``, and then until the
    controller and every partition's state (leader, leader epoch, ISR) have not changed for that long: the brokers
    have acted on their leadership (a new leader writes its leader-epoch-checkpoint)."""
    zk = state.zk_client()
    want = {k: sorted(v) for k, v in (isr or {}).items()}
    differ: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + timeout
        seen: tuple[Any, float] | None = None
        while time.monotonic() < deadline:
            registered = {int(i) for i in zk.get_children("/brokers/ids")} if zk.exists("/brokers/ids") else set()
            now = {k: sorted(v) for k, v in _isr(zk).items()} if want else {}
            differ = {k: (now.get(k), v) for k, v in want.items() if now.get(k) != v}
            if set(brokers) <= registered and (not brokers or zk.exists("/controller")) and not differ:
                if settle_s <= 0:
                    return
                now = _leadership(zk)
                if seen is None or seen[0] != now:
                    seen = (now, time.monotonic())
                elif time.monotonic() - seen[1] >= settle_s:
                    return
            time.sleep(0.05)
    finally:
        zk.stop()
        zk.close()
    raise LabError(
        f"broker(s) {brokers} not registered (and settled) in ZooKeeper within {timeout:.0f} s"
        + (f"; ISR now / as taken: {dict(list(differ.items())[:5])}" if differ else "")
    )


def wait_in_sync(state: LabState, timeout: float = 60.0) -> None:
    """Until every partition's ISR is all of its replicas (a ZooKeeper lab): a lab just brought up, before a
    snapshot records its ISR as the state every restore must reach again (a replica still catching up when it is
    taken would never be out of ISR again after a restore)."""
    zk = state.zk_client()
    lagging: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            replicas = {}
            for topic in zk.get_children("/brokers/topics"):
                assignment = json.loads(zk.get(f"/brokers/topics/{topic}")[0]).get("partitions", {})
                replicas.update({f"{topic}-{p}": sorted(r) for p, r in assignment.items()})
            isr = {k: sorted(v) for k, v in _isr(zk).items()}
            lagging = {k: (isr.get(k), r) for k, r in replicas.items() if isr.get(k) != r}
            if not lagging:
                return
            time.sleep(0.05)
    finally:
        zk.stop()
        zk.close()
    raise LabError(
        f"not every replica in ISR within {timeout:.0f} s (ISR / replicas): {dict(list(lagging.items())[:5])}"
    )


def _isr(zk: Any) -> dict[str, list[int]]:
    """``topic-partition`` -> its ISR, as ZooKeeper holds it now."""
    out: dict[str, list[int]] = {}
    for topic in zk.get_children("/brokers/topics"):
        parts = f"/brokers/topics/{topic}/partitions"
        for p in zk.get_children(parts) if zk.exists(parts) else []:
            with contextlib.suppress(Exception):
                out[f"{topic}-{p}"] = json.loads(zk.get(f"{parts}/{p}/state")[0])["isr"]
    return out


def _leadership(zk: Any) -> tuple[Any, ...]:
    """The controller and every partition state's data, as ZooKeeper holds them now."""
    out: list[Any] = [zk.get("/controller")[0] if zk.exists("/controller") else None]
    for topic in sorted(zk.get_children("/brokers/topics")):
        parts = f"/brokers/topics/{topic}/partitions"
        for p in sorted(zk.get_children(parts)) if zk.exists(parts) else []:
            out.append(zk.get(f"{parts}/{p}/state")[0] if zk.exists(f"{parts}/{p}/state") else None)
    return tuple(out)


def snapshot(directory: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """Stop the lab cleanly (``down``: brokers first, so no broker's session outlives ZooKeeper) and copy everything
    it is made of (log dirs, ZooKeeper's data, host keys, configs, its event record) to ``dest``, with which brokers
    ran; ``restore`` brings it back, at the same path, as it was."""
    lab_dir, dest = Path(directory).resolve(), Path(dest)
    state = LabState.load(lab_dir)
    running = [b.id for b in state.brokers if running_pid(b.config())]
    controller, isr = None, {}
    if not state.kraft:
        zk = state.zk_client()
        try:
            with contextlib.suppress(Exception):
                controller = json.loads(zk.get("/controller")[0])["brokerid"]
            isr = _isr(zk)
        finally:
            zk.stop()
            zk.close()
    down(lab_dir)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(lab_dir, dest, symlinks=True)
    taken = {"running": running, "controller": controller, "isr": isr}
    (dest / SNAPSHOT_FILE).write_text(json.dumps(taken) + "\n")
    return dest


def restore(snapshot_dir: str | os.PathLike[str], directory: str | os.PathLike[str]) -> LabState:
    """The lab ``snapshot`` copied, back at ``directory`` (where it was taken: its files name their paths) and
    started as it was (``start``); a lab up there is stopped first."""
    lab_dir = Path(directory).resolve()
    taken_at = LabState.load(snapshot_dir).dir
    if taken_at != str(lab_dir):
        raise LabError(f"{snapshot_dir} is a snapshot of the lab at {taken_at}, not {lab_dir}")
    if (lab_dir / "lab.json").is_file():
        down(lab_dir)
    if lab_dir.exists():
        shutil.rmtree(lab_dir)
    shutil.copytree(snapshot_dir, lab_dir, symlinks=True)
    return start(lab_dir)


def status(directory: str | os.PathLike[str] = DEFAULT_DIR) -> dict[str, Any]:
    state = LabState.load(directory)
    pids = _lab_pids(state)
    out: dict[str, Any] = {
        "dir": state.dir,
        "cluster": state.cluster,
        "cluster_id": state.cluster_id,
        "kafka_version": state.kafka_version,
        "metadata_mode": state.metadata_mode,
        "zookeeper": state.zookeeper or None,
        "zookeeper_pid": pids["zookeeper"],
        "zookeeper_running": pids["zookeeper"] is not None,
        "inventory": str(state.inventory_path),
        "airflow_connections": str(state.path / "airflow-connections.json"),
        "ssh_key": str(state.path / "ssh" / "id_ed25519"),
        "known_hosts": str(state.path / "ssh" / "known_hosts"),
        "controller": None,
        "brokers": [],
    }
    if state.kraft:
        leader = quorum_leader(state)
        out["controller"] = leader[0] if leader else None
        out["quorum_leader_epoch"] = leader[1] if leader else None
        out["controllers"] = [{"id": b.id, "metadata_log_dir": b.log_dirs[0]} for b in state.brokers]
    elif pids["zookeeper"]:
        with contextlib.suppress(Exception):
            zk = state.zk_client(timeout=3)
            try:
                raw = zk.get("/controller")[0]
                out["controller"] = json.loads(raw)["brokerid"]
            except Exception:  # no controller right now
                out["controller"] = None
            finally:
                zk.stop()
                zk.close()
    for b in state.brokers:
        pid = pids.get(f"broker-{b.id}")
        out["brokers"].append(
            {
                "id": b.id,
                "ssh_host": "127.0.0.1",
                "ssh_port": b.ssh_port,
                "ssh_running": pids[f"sshd-{b.id}"] is not None,
                "running": pid is not None,
                "pid": pid,
                "log_dirs": list(b.log_dirs),
                "listener": f"PLAINTEXT://127.0.0.1:{b.listener_port}",
                "server_log": str(Path(b.run_dir) / "server.log"),
            }
        )
    return out


def live_replica_dirs(log_dir: Path) -> list[tuple[str, int, Path]]:
    """(topic, partition, dir) of the live partition dirs of a log dir, by the probe's reading of the names
    (-delete / -future / -stray dirs are not replicas the broker serves)."""
    out = []
    for entry in sorted(os.listdir(log_dir)):
        parsed = parse_partition_dir_name(entry)
        if parsed and parsed["dir_state"] == "live" and (log_dir / entry).is_dir():
            out.append((parsed["topic"], parsed["partition"], log_dir / entry))
    return out


def zk_json(state: LabState, path: str) -> Any:
    """The JSON at a ZooKeeper path of the lab (None if absent)."""
    zk = state.zk_client()
    try:
        return json.loads(zk.get(path)[0]) if zk.exists(path) else None
    finally:
        zk.stop()
        zk.close()


def broker_events(state: LabState) -> dict[int, list[dict[str, Any]]]:
    """Each lab broker's lifecycle events (events.jsonl: running, stop-requested, ...), oldest first."""
    out = {}
    for b in state.brokers:
        f = Path(b.run_dir) / "events.jsonl"
        out[b.id] = [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []
    return out


def partition_topic_ids(state: LabState) -> dict[tuple[int, str, int], str | None]:
    """(broker, topic, partition) -> the topic ID in that replica's partition.metadata (None when absent)."""
    out = {}
    for b in state.brokers:
        for d in map(Path, b.log_dirs):
            for topic, part, pdir in live_replica_dirs(d):
                pm = pdir / PARTITION_METADATA
                try:
                    out[(b.id, topic, part)] = parse_partition_metadata(pm.read_bytes(), str(pm))["topic_id"]
                except (OSError, ValueError):
                    out[(b.id, topic, part)] = None
    return out
