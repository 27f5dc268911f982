"""The repair's post-verify of one broker, after its restart: is every file the plan touched right now?

"Right" is what detection says, not a second set of checks: the broker is probed again (metadata mode) and its
fresh output, with a live ZooKeeper snapshot, goes through the same detection app as an audit
(``fleet_doctor.audit.detection.detect_locally``). A touched file is wrong when a finding names it (a quarantined index
that Kafka rebuilt badly, a ``partition.metadata`` that again holds another topic ID than ZooKeeper's), or names its
segment's log (``index-missing``). Besides findings, the broker must have re-created what it re-creates at start: a
removed ``partition.metadata`` and a quarantined index must exist again, and so must a removed
``leader-epoch-checkpoint``: Kafka (0.11+, message format v2) creates it whenever it loads a log, empty when it was
missing (CheckpointFile's constructor; entries come with a recovered segment, a leader epoch or an append), so its
absence means the broker did not load that partition. Its content is judged by detection (``leader-epoch-malformed``
and the other leader-epoch rules name the file). The plan removes it only with ``partition.metadata`` (2.8+, where
a broker whose ``log.message.format.version`` is below 0.11 would delete it at load: not a supported setup here).
"""

from __future__ import annotations

import io
import json
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from fleet_doctor.audit.detection import detect_locally
from fleet_doctor.audit.steps import probe_command, run_probe
from fleet_doctor.layout import LOCAL, PROBE_OBJECT
from fleet_doctor.probe import LEADER_EPOCH_CHECKPOINT, PARTITION_METADATA, segment_file_name
from fleet_doctor.remote import Remote
from fleet_doctor.repair.plan import leftover_file, stray_replica_dir
from fleet_doctor.staging import split_to_dir
from fleet_doctor.zookeeper import snapshot


def post_verify(
    remote: Remote,
    broker_id: int,
    actions: Iterable[Any],
    log_dirs: list[str],
    kafka_version: str,
    zookeeper: str,
    timeout: float = 600.0,
    stage: Callable[[str], None] = lambda s: None,
    metadata_mode: str = "zookeeper",
    kafka_user: str = "",
    read_cluster: Callable[[], list[dict[str, Any]]] | None = None,
) -> list[str]:
    """The problems left on the files of ``actions`` (a BrokerPlan's FileActions); empty when every one is right.
    ``stage``: told which stage runs now (the executor's progress lines say it); ``metadata_mode``: the cluster's
    (its inventory's); ``kafka_user``: the probe runs as it (the inventory's, as the change does); ``read_cluster``:
    the cluster's facts now (a KRaft cluster's metadata, as the audit reads it; default: ZooKeeper's snapshot of
    ``zookeeper``)."""
    actions = list(actions)
    with tempfile.TemporaryDirectory(prefix=f"fleet-doctor-verify-{broker_id}-") as tmp:
        work = Path(tmp)
        raw = bytearray()
        stage(f"probing {len(log_dirs)} log dir(s)")
        command = probe_command(log_dirs, deep=False, verify_crc=False, kafka_user=kafka_user)
        run_probe(remote, command, raw.extend, timeout)
        dest = work / LOCAL.broker_dir(broker_id)
        dest.mkdir(parents=True)
        split_to_dir(io.BytesIO(raw), dest, PROBE_OBJECT.removesuffix(".gz"))
        facts = [{"broker_id": broker_id, "kafka_version": kafka_version, "running": True}]
        stage(f"probe output {len(raw) // 1024} KiB; reading the cluster's metadata")
        zk = read_cluster() if read_cluster is not None else snapshot.read_live(zookeeper)
        stage(f"probe output {len(raw) // 1024} KiB; Spark detection running")
        # one broker of the fleet: the rules that compare brokers cannot judge from it
        found = detect_locally(
            work, facts, zk, metadata_mode=metadata_mode, master="local[2]", audit_run="verify", partial_scope=True
        )
    return problems(actions, found.findings, _present(raw, {a.path.rsplit("/", 1)[0] for a in actions}))


def problems(actions: list[Any], findings: list[dict[str, Any]], present: set[str]) -> list[str]:
    """For each touched file: the findings that name it (or, for an index, its segment's log), and whether the
    broker re-created it when it must have (an index only while its segment's log is still there: retention may
    have deleted the segment since)."""
    by_path: dict[str, list[dict[str, Any]]] = {}
    for f in findings:
        by_path.setdefault(f.get("path") or "", []).append(f)
    out = []
    for a in actions:
        if stray_replica_dir(a.path):  # moved whole out of the log dir: the broker's start must not find it there
            if a.path in present:
                out.append(f"{a.path} is in its log dir again (the quarantine did not take, or it was put back)")
            continue
        if leftover_file(a.path):  # Kafka's own temporary file: the cleaner and retention may write one of that very
            continue  # name again once the broker runs (a cleaned segment keeps its base offset), so nothing to judge
        pdir, name = a.path.rsplit("/", 1)
        named = list(by_path.get(a.path, []))
        log = f"{pdir}/{name.split('.', 1)[0]}.log"
        if a.action == "quarantine":
            named += [f for f in by_path.get(log, []) if f["rule"] == "index-missing"]
        out += [f"{a.path}: {f['rule']}: {f['message']}" for f in named]
        recreated_at_load = name in (PARTITION_METADATA, LEADER_EPOCH_CHECKPOINT)
        if ((a.action == "quarantine" and log in present) or recreated_at_load) and a.path not in present:
            why = " (Kafka creates it when it loads the log: the broker did not load it)"
            out.append(
                f"{a.path} was not re-created by the broker's start{why if name == LEADER_EPOCH_CHECKPOINT else ''}"
            )
    return out


def _present(output: bytes | bytearray, partition_dirs: set[str]) -> set[str]:
    """The files of ``partition_dirs`` the probe saw (its ``output``): partition.metadata, leader-epoch-checkpoint
    and segments' logs and indexes. Only those partition dirs' records are parsed (the probe prints ``"path":`` as
    JSON does)."""
    wanted = [f'"path":{json.dumps(d)}'.encode() for d in partition_dirs]
    out: set[str] = set()
    for line in output.splitlines():
        if not any(w in line for w in wanted):
            continue
        r = json.loads(line)
        if r.get("kind") == "partition":
            out.add(r["path"])
            if r.get("partition_metadata_present"):
                out.add(f"{r['path']}/{PARTITION_METADATA}")
            if r.get("leader_epoch_present"):
                out.add(f"{r['path']}/{LEADER_EPOCH_CHECKPOINT}")
        elif r.get("kind") == "segment":
            for ext in ("log", "index", "timeindex"):
                if r.get(f"has_{ext}"):
                    out.add(f"{r['path']}/{segment_file_name(r['base_offset'], ext)}")
    return out
