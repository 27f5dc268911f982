"""The nightly audit's steps, as plain functions the DAG (dags/kafka_fleet_audit.py) calls.

discover -> stage (one broker each, over SSH) -> snapshot the cluster metadata -> broker facts -> detect (Spark) ->
publish (``history``) -> alert (``alerts``). Nothing here imports Airflow: a broker's SSH connection is any
connected ``paramiko.SSHClient`` (the DAG gets it from the SSH provider's hook), so the steps are tested on their
own.

The cluster metadata comes from ZooKeeper (``metadata_mode`` ``zookeeper``) or, on a KRaft cluster, from the
controllers' metadata log (``fleet_doctor.audit.kraft``: the decoder run on each controller over SSH, the most
up-to-date log of those read giving the cluster's facts). Both give the same records (docs/zk-snapshot-schema.md,
docs/cluster-metadata-schema.md), staged as the run's cluster metadata: detection reads one shape of cluster facts. A
KRaft cluster's controllers are read once per run: ``discover`` stages what it read, ``snapshot_metadata`` uses it.

Where each step keeps what it stages: ``fleet_doctor.layout`` (one run's staging area is a ``RunArea``).
"""

from __future__ import annotations

import json
import logging
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet_doctor import inventory as inv
from fleet_doctor import lock_state
from fleet_doctor.audit import detection, history, kraft
from fleet_doctor.audit.summary import TIME_FORMAT
from fleet_doctor.identity import verify_identity
from fleet_doctor.layout import RunArea, staging
from fleet_doctor.remote import Remote, as_user, lowest_priority
from fleet_doctor.settings import Settings
from fleet_doctor.staging import StagingError, stage_probe, staged_brokers
from fleet_doctor.store import Store
from fleet_doctor.zookeeper import ZkAuth, credentials, session
from fleet_doctor.zookeeper.cluster import Cluster

LOG = logging.getLogger(__name__)

PROBE_SOURCE = Path(__file__).resolve().parents[1] / "probe.py"
# what a worker takes from one broker's probe: its records are short lines (a segment's is under 1 KiB) and about
# 0.5 KiB per segment in all; a broker sending more, or a line without end, is not running the probe (a hostile or
# broken host): the stage stops with an error naming it instead of holding a worker slot or filling the store
PROBE_MAX_BYTES = 4 << 30  # 4 GiB, some 8 million segments
PROBE_MAX_LINE = 1 << 20


# --------------------------------------------------------------------------------------------
# discover
def discover(
    inventory: inv.Inventory,
    zookeeper: str | None = None,
    timeout: float = 10.0,
    only: Iterable[int] = (),
    auth: ZkAuth | None = None,
    connect: kraft.Connect | None = None,
    metadata_timeout: float = kraft.DECODE_TIMEOUT_S,
    *,
    store: Store | None = None,
    area: RunArea | None = None,
    lock_dir: Path | None = None,
) -> dict[str, Any]:
    """The brokers to audit: every broker of the inventory (or only the ids in ``only``, the rest listed as out of
    scope), with its registration. A broker known to only one of the two is reported, never dropped.
    ZooKeeper: ``/brokers/ids``, read as ``auth``, by default the cluster's credentials
    (``fleet_doctor.zookeeper.credentials``). KRaft: the brokers the metadata log registers and does not fence, read
    from every controller (``connect(endpoint) -> SSH client``, default the Airflow connection) and taken from the
    most up-to-date log, the inventory's order breaking ties (``fleet_doctor.audit.kraft``); ``metadata_source``
    names it, ``controller_errors`` the controllers that could not be read, ``metadata_error`` says why none could
    be, ``fenced`` the brokers registered but fenced (``only_in_cluster_metadata``: "only in the metadata log").
    With ``store`` and ``area`` (the run's staging area), what was read from the controllers is staged there as the
    run's cluster metadata (``stage_kraft_metadata``), so that ``snapshot_metadata`` does not read them again.
    Each broker carries what ``stage_broker`` checks its identity against (pinned host key, log dirs)."""
    known = {b.id for b in inventory.brokers}
    scope = {int(b) for b in only}
    if scope - known:
        raise ValueError(f"broker(s) {sorted(scope - known)} are not in the inventory of cluster {inventory.cluster}")
    registered: dict[int, dict[str, Any]] = {}
    zk_error = metadata_error = None
    source: dict[str, Any] | None = None
    controller_errors: list[dict[str, Any]] = []
    fenced: list[int] = []
    repair_lock: dict[str, Any] | None = None
    zk_connect: str | None = zookeeper or inventory.zookeeper
    endpoints = [inventory.controller_endpoint(c.id) for c in inventory.controllers]
    if inventory.kraft:
        zk_connect = None
        reads, controller_errors = kraft.read_controllers(endpoints, connect, timeout=metadata_timeout)
        if store is not None and area is not None:
            stage_kraft_metadata(store, area, endpoints, reads, controller_errors)
        if reads:
            registered, fenced, source = reads[0].registrations(), reads[0].fenced(), reads[0].source()
            repair_lock = _dir_repair_lock(lock_dir, source.get("cluster_id"))
        else:
            metadata_error = kraft.error_text(controller_errors)
    else:
        try:
            if auth is None:
                auth = credentials(inventory)
            with session(zk_connect, timeout=timeout, read_only=True, auth=auth) as zk:
                registered = Cluster(zk).registrations()
                repair_lock = _repair_lock(zk)
        except Exception as e:  # kazoo's timeouts and connection errors have no common base
            zk_error = f"ZooKeeper {zk_connect}: {type(e).__name__}: {e}"
    unknown = zk_error is not None or metadata_error is not None
    brokers = [
        {
            "broker_id": b.id,
            "host": b.host,
            "ssh_port": b.ssh_port,
            "host_key": b.host_key,
            "ssh_conn_id": inventory.ssh_connection_id(b.id),
            "log_dirs": list(b.log_dirs),
            "kafka_version": b.kafka_version,
            "kafka_user": b.kafka_user,
            "registered": b.id in registered,
        }
        for b in inventory.brokers
        if not scope or b.id in scope
    ]
    only_in_metadata = sorted(set(registered) - known)
    return {
        "cluster": inventory.cluster,
        "started_at": time.strftime(TIME_FORMAT, time.gmtime()),  # the run's start (its summary's duration)
        "metadata_mode": inventory.metadata_mode,  # decided once, by the inventory: passed on from here
        "zookeeper": zk_connect,
        "controllers": endpoints,
        "brokers": brokers,
        "registered": sorted(registered),
        "only_in_inventory": sorted(known - set(registered)) if not unknown else [],
        "only_in_cluster_metadata": only_in_metadata,
        "only_in_zookeeper": only_in_metadata,  # its older name (on KRaft it meant "only in the metadata log")
        "fenced": fenced,  # KRaft: registered but fenced (in only_in_inventory when in the inventory)
        "zookeeper_error": zk_error,
        "metadata_source": source,
        "metadata_error": metadata_error,
        "controller_errors": controller_errors,
        "out_of_scope": sorted(known - scope) if scope else [],
        "repair_lock": repair_lock,  # the repair lock as seen now (``lock_state``), None when unread
    }


def show_repair_lock(store: Store, discovered: dict[str, Any]) -> None:
    """The repair lock as ``discover`` saw it, mirrored in the cluster's store for the fleet page (``lock_state``)."""
    lock_state.record(store, lock_state.LockState.from_json(discovered.get("repair_lock")))


def _repair_lock(zk: Any) -> dict[str, Any] | None:
    """The cluster's repair lock (keyed by its ``/cluster/id``) as this session sees it, for the fleet page; None
    when it cannot be read (logged: the audit goes on)."""
    try:
        key = Cluster(zk).cluster_id()
        return None if key is None else lock_state.seen_in_zookeeper(zk, key, "audit").to_json()
    except Exception as e:
        LOG.warning("the repair lock could not be read (the fleet page shows an older state): %s", e)
        return None


def _dir_repair_lock(lock_dir: Path | None, cluster_id: str | None) -> dict[str, Any] | None:
    """A KRaft cluster's repair lock (files in the repairs dir, keyed by its cluster.id: ``repair.dir_lock``) as it
    is now; None when there is no lock dir to look in or it cannot be read (logged: the audit goes on)."""
    if lock_dir is None or not cluster_id:
        return None
    try:
        return lock_state.seen_in_dir(lock_dir, str(cluster_id), "audit").to_json()
    except Exception as e:
        LOG.warning("the repair lock in %s could not be read (the fleet page shows an older state): %s", lock_dir, e)
        return None


def audit_lock_dir(settings: Settings) -> Path | None:
    """Where a KRaft cluster's repair lock lives for these settings (``Settings.lock_dir``), None when there is none
    (a remote data root without FLEET_DOCTOR_REPAIR_DIR: no repair can run there either)."""
    try:
        return settings.lock_dir
    except Exception:
        return None


# --------------------------------------------------------------------------------------------
# stage
def probe_command(log_dirs: Iterable[str], *, deep: bool, verify_crc: bool, kafka_user: str = "") -> str:
    """The remote command: the probe read from stdin by python3, at the lowest CPU and I/O priority the host
    offers (nice 19, ionice idle class where present), as the Kafka user when the inventory names one (``sudo -n
    -u``: the SSH user need not read Kafka's files). Every path is shell-quoted."""
    args = ["--jobs", "1"]
    if verify_crc:
        args.append("--verify-crc")
    elif deep:
        args.append("--deep")
    probe = lowest_priority("python3 - " + " ".join(shlex.quote(a) for a in [*args, *log_dirs]))
    return as_user(kafka_user, probe, shell=True)


class StageError(StagingError):
    """The probe could not be run on the broker or did not finish."""


def bounded(
    sink: Callable[[bytes], None], who: str, max_bytes: int = PROBE_MAX_BYTES, max_line: int = PROBE_MAX_LINE
) -> Callable[[bytes], None]:
    """``sink`` behind the caps on a probe's output: at most ``max_bytes`` in all and ``max_line`` per line, checked
    on each chunk as it arrives (linear time); past either, StageError naming the broker (the stream stops)."""
    total = line = 0

    def write(data: bytes) -> None:
        nonlocal total, line
        total += len(data)
        if total > max_bytes:
            raise StageError(
                f"{who}: the probe's output passed {max_bytes} bytes: stopped, nothing staged (a broker with more "
                "than some 8 million segments needs a higher cap; anything else is not the probe's output)"
            )
        cut = data.rfind(b"\n")
        line = line + len(data) if cut < 0 else len(data) - cut - 1
        if line > max_line:
            raise StageError(
                f"{who}: a line of the probe's output is longer than {max_line} bytes: not the probe's output "
                "(a hostile or broken host?): stopped, nothing staged"
            )
        sink(data)

    return write


def run_probe(remote: Remote, command: str, sink: Callable[[bytes], None], timeout: float) -> dict[str, Any]:
    """Stream the probe (sent on stdin) through the broker's SSH connection: stdout goes to ``sink`` as it arrives.
    Raises StageError unless the probe exited 0 and its last record is a complete ``probe_end`` (returned)."""
    tail = b""

    def keep_tail(data: bytes) -> None:
        nonlocal tail
        sink(data)
        tail = (tail + data)[-4096:]

    done = remote.stream(command, PROBE_SOURCE.read_bytes(), keep_tail, timeout)
    if done.exit_status != 0:
        raise StageError(f"{remote.who}: the probe exited {done.exit_status}: {done.stderr.strip()[-500:]}")
    last = tail.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    try:
        end = json.loads(last) if last.startswith(b"{") else {}
    except ValueError:  # a last line cut short: the output did not end with its probe_end record
        end = {}
    if not isinstance(end, dict) or end.get("kind") != "probe_end" or not end.get("complete"):
        raise StageError(f"{remote.who}: the probe output ends without a complete probe_end record")
    end["stderr"] = done.stderr
    return end


def stage_broker(
    client: Any,
    broker: dict[str, Any],
    store: Store,
    area: RunArea,
    *,
    deep: bool,
    verify_crc: bool,
    timeout: float = 1800.0,
) -> dict[str, Any]:
    """Run the probe on the broker over an open SSH connection and stream its output into the store under the run
    area's ``probe/broker_id=<N>/`` in the staged form (fleet_doctor.staging: Parquet for the bulk records, gzip'd
    JSON Lines for the rest, committed all or nothing).

    First the host must prove it is broker N (fleet_doctor.identity: the pinned host key, the log dirs'
    meta.properties): IdentityError naming both ids otherwise, and nothing is staged."""
    bid = int(broker["broker_id"])
    key = area.probe(bid)
    remote = Remote(client, bid)
    if not broker.get("host_key"):
        raise StageError(f"{remote.who}: no pinned host_key in the discovered broker: rerun discover")
    where = f"{broker.get('host')}:{broker.get('ssh_port')}"
    identity = verify_identity(remote, bid, broker["host_key"], broker["log_dirs"], where=where)
    command = probe_command(
        broker["log_dirs"], deep=deep, verify_crc=verify_crc, kafka_user=broker.get("kafka_user") or ""
    )
    nbytes = 0
    end: dict[str, Any] = {}

    def produce(write: Callable[[bytes], None]) -> dict[str, Any]:
        def sink(data: bytes) -> None:
            nonlocal nbytes
            write(data)
            nbytes += len(data)

        end.update(run_probe(remote, command, bounded(sink, remote.who), timeout))
        return end

    splitter = stage_probe(store, key, produce, remote.who)
    return {
        "broker_id": bid,
        "path": store.url(key),
        "bytes": nbytes,
        "partitions": end.get("partitions"),
        "segments": end.get("segments"),
        "segments_columnar": splitter.rows["segment"],
        "errors": end.get("errors"),
        "stderr": end["stderr"],
        "identity": identity,
    }


# --------------------------------------------------------------------------------------------
# the cluster metadata (ZooKeeper or KRaft) and broker facts
def snapshot_zookeeper(connect: str, store: Store, key: str, timeout: float = 10.0, auth: ZkAuth | None = None) -> int:
    """Kafka's metadata from ZooKeeper, read as ``auth`` (``fleet_doctor.zookeeper.credentials(inventory)``: with
    ACLs on Kafka's znodes an anonymous read may be refused), as JSON Lines at ``key``."""
    from fleet_doctor.zookeeper import snapshot

    records = snapshot.read_live(connect, timeout=timeout, auth=auth)
    store.write_jsonl(key, records)
    return len(records)


def stage_kraft_metadata(
    store: Store,
    area: RunArea,
    endpoints: list[dict[str, Any]],
    reads: list[kraft.ControllerRead],
    errors: list[dict[str, Any]],
) -> dict[str, Any]:
    """What one read of a KRaft cluster's controllers gave, staged in ``area``: the most up-to-date log's records as
    the cluster metadata, each controller's header and problems (in the inventory's order) as the controllers
    input, and the account of the read (which controller, why the others did not give it, how many records). A read
    that failed leaves an earlier successful one's files in place. Returns the account."""
    order = [int(e["controller_id"]) for e in endpoints]
    in_order = sorted(reads, key=lambda r: order.index(r.controller_id))
    source = {
        "metadata_mode": "kraft",
        "source": reads[0].source() if reads else None,
        "controllers_read": [r.controller_id for r in in_order],
        "controller_errors": errors,
        "error": None if reads else kraft.error_text(errors),
        "records": len(reads[0].lines) if reads else 0,
    }
    if reads:
        store.write_jsonl(area.controllers, [r for read in in_order for r in read.controller_records()])
        with store.writer(area.cluster_metadata) as f:  # as the decoder printed them: no second copy in memory
            f.writelines(reads[0].lines)
    if reads or not store.is_file(area.cluster_metadata):  # a retry that failed leaves an earlier attempt's account
        store.write_text(area.metadata_source, json.dumps(source, indent=2) + "\n")
    return source


def snapshot_metadata(
    discovered: dict[str, Any],
    store: Store,
    area: RunArea,
    *,
    timeout: float = 10.0,
    auth: ZkAuth | None = None,
    connect: kraft.Connect | None = None,
    metadata_timeout: float = kraft.DECODE_TIMEOUT_S,
) -> int:
    """The cluster's metadata staged in ``area`` (the number of records). ZooKeeper: exactly ``snapshot_zookeeper``.
    KRaft: what ``discover`` read from the controllers and staged for this run (``stage_kraft_metadata``); read now
    only when discover could not read any controller (``connect(endpoint)``).
    Raises MetadataReadError when no controller could be read (detection then runs without cluster facts)."""
    if discovered["metadata_mode"] != "kraft":
        return snapshot_zookeeper(discovered["zookeeper"], store, area.cluster_metadata, timeout=timeout, auth=auth)
    staged = store.read_json(area.metadata_source) or {}
    if not staged.get("source") or not store.is_file(area.cluster_metadata):
        endpoints = discovered["controllers"]
        reads, errors = kraft.read_controllers(endpoints, connect, timeout=metadata_timeout)
        staged = stage_kraft_metadata(store, area, endpoints, reads, errors)
    if not staged.get("source"):
        raise kraft.MetadataReadError(staged.get("error") or "no controller's metadata log could be read")
    return int(staged.get("records") or 0)


def write_broker_facts(discovered: dict[str, Any], store: Store, area: RunArea) -> dict[str, Any]:
    """The broker facts for the detection app (staged in ``area``), and the audited / not-audited split."""
    staged = set(staged_brokers(store, area))
    facts = [
        {
            "broker_id": b["broker_id"],
            "kafka_version": b["kafka_version"],
            "running": b["registered"],
            "host": b["host"],
        }
        for b in discovered["brokers"]
        if b["broker_id"] in staged
    ]
    store.write_jsonl(area.brokers, facts)
    out = {
        "audited": sorted(staged),
        "not_audited": sorted(b["broker_id"] for b in discovered["brokers"] if b["broker_id"] not in staged),
        "out_of_scope": list(discovered.get("out_of_scope", [])),
        "metadata_mode": discovered.get("metadata_mode", "zookeeper"),
    }
    if out["metadata_mode"] == "kraft":  # what the snapshot step used (read once per run)
        source = store.read_json(area.metadata_source) or {}
        out["metadata_source"] = source.get("source")
        out["metadata_error"] = source.get("error") or (None if source else "the metadata snapshot step did not run")
        out["controller_errors"] = source.get("controller_errors", [])
    return out


def detect_args(
    settings: Settings,
    run_id: str,
    facts: dict[str, Any],
    area: RunArea | None = None,
    findings_dataset: str | None = None,
) -> list[str]:
    """The detection app's arguments for an audit run (``area``: its staging area, default the run's;
    ``findings_dataset``: default the audit's)."""
    return detection.detect_args(
        settings.store,
        area or staging(run_id),
        run_id,
        metadata_mode=facts.get("metadata_mode"),
        findings_dataset=findings_dataset or settings.findings_url,
        partial_scope=bool(facts.get("out_of_scope")),
    )


@dataclass(frozen=True)
class LocalRun:
    """An audit run made in this process: what ``discover`` and the broker facts said, and where it is staged."""

    area: RunArea
    discovered: dict[str, Any]
    facts: dict[str, Any]


def stage_and_detect(
    settings: Settings,
    run_id: str,
    connect: Callable[[dict[str, Any]], Any],
    *,
    area: RunArea | None = None,
    master: str = "local[2]",
    connect_controller: kraft.Connect | None = None,
) -> LocalRun:
    """The audit's steps up to detection, in this process (no Airflow): discover, stage every broker through
    ``connect(broker) -> paramiko.SSHClient`` (a broker that fails is left not audited), snapshot the cluster
    metadata (KRaft: the controllers through ``connect_controller(endpoint)``, default their Airflow connections),
    detect with spark-submit. ``area``: where to stage (default the run's staging area); a run staged elsewhere
    writes its findings dataset there too, never into the audit's."""
    store = settings.store
    own_area = area is not None
    area = area or staging(run_id)
    store.check()
    inventory = settings.load_inventory()
    auth = None if inventory.kraft else credentials(inventory)
    discovered = discover(
        inventory, auth=auth, connect=connect_controller, store=store, area=area, lock_dir=audit_lock_dir(settings)
    )
    errors = []
    for broker in discovered["brokers"]:
        try:
            client = connect(broker)
            try:
                stage_broker(client, broker, store, area, deep=settings.deep, verify_crc=settings.verify_crc)
            finally:
                client.close()
        except Exception as e:  # an unreachable broker is reported, not fatal
            errors.append(f"broker {broker['broker_id']}: {type(e).__name__}: {e}\n")
    if errors:
        store.write_text(area.stage_errors, "".join(errors))
    try:
        snapshot_metadata(discovered, store, area, auth=auth, connect=connect_controller)
    except Exception as e:  # detection runs without the cross-source rules
        store.write_text(area.metadata_error, f"{type(e).__name__}: {e}\n")
    facts = write_broker_facts(discovered, store, area)
    output = store.url(area.own_findings_dataset) if own_area else None
    args = detect_args(settings, run_id, facts, area, output)
    # the store's settings (AWS_*) as the settings were read, for Spark as for the tasks
    detection.run(
        master,
        settings.detect_conf({}),
        args,
        jars=settings.spark_jars,
        env=settings.aws_environ(),
        secret_file=settings.spark_auth_file,
    )
    return LocalRun(area, discovered, facts)


def run_local(
    settings: Settings,
    run_id: str,
    connect: Callable[[dict[str, Any]], Any],
    *,
    master: str = "local[2]",
    connect_controller: kraft.Connect | None = None,
) -> dict[str, Any]:
    """A whole audit run in this process (tests, ad-hoc runs): ``stage_and_detect``, then publish. Returns the
    published summary (``audit.summary.RunSummary.to_dict``)."""
    run = stage_and_detect(settings, run_id, connect, master=master, connect_controller=connect_controller)
    show_repair_lock(settings.store, run.discovered)
    return history.publish(settings, run_id, run.discovered, run.facts)
