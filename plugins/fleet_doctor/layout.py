"""Where Fleet Doctor keeps what it keeps: every key under the data root and every file of the repairs dir, defined
here and nowhere else (docs/audit.md "Data store", docs/repair.md "Where a repair keeps its records").

The data root (``FLEET_DOCTOR_DATA``: a local directory, ``s3a://bucket/prefix`` or ``hdfs://...``, reached through
``fleet_doctor.store``) keeps each cluster apart, under ``clusters/<cluster>/`` (``cluster_store``). A store written
before there were fleets holds one cluster's keys at the root: that cluster keeps reading and writing them there
(read in place; docs/audit.md "Data store"). A cluster's store, or a local work dir, holds::

    staging/<run>/                        one audit run's staging area (``RunArea``)
        probe/broker_id=<N>/probe.jsonl.gz          one broker's probe output but its bulk records, and
        probe/broker_id=<N>/probe.{segments,partitions,files}.parquet   those (fleet_doctor.staging)
        cluster-metadata.jsonl                      the cluster facts: ZooKeeper's snapshot or the KRaft metadata
                                                    log's image (``zk.jsonl`` before; still read)
        controllers.jsonl                           KRaft: each controller's metadata log header and problems
        metadata-source.json                        KRaft: which controller the facts came from, and why not others
        brokers.jsonl                               the broker facts detection reads
        summary.json, findings.jsonl                what the detection app wrote
        stage-errors.txt, metadata-error.txt        a local run's brokers that could not be staged, and why the
                                                    cluster facts could not be read
    verify/<run>/...                      a repair's re-verification: a run area of its own, detected like an audit
                                          run (its findings dataset inside it), never published
    findings/audit_run=<run>/*.parquet    the findings dataset (the audit DAG's Asset)
    history/runs.jsonl                    one row per published run, oldest first
    history/audit_run=<run>/findings.jsonl   every finding of the run with its status (new / persisting / ...)
    reports/<run>.html, reports/<run>.json   the report and the run's summary
    repair-lock.json                      the repair lock as a repair or an audit last saw it (``lock_state``): what
                                          the fleet page and the metrics show
    roll-timings.json                     a broker's restart step by step (and the log recovery rate), measured on
                                          the cluster's last roll: the next roll's prediction
    roll-status.json, roll-control.json   the running (or last) roll's step and why it is blocked; the operator's
                                          holds and skips per broker (``roll_status``)

A local work dir (``fleet-doctor scan``, the repair's post-verify) is a run area at the root of a local store: the
detection app reads every run area the same way (``audit.detection``).

The repairs dir (``FLEET_DOCTOR_REPAIR_DIR``, a local directory every repair task sees; ``RepairsDir``) holds, at
its root, ``locks/<cluster id>.{json,active,token,guard}``: the repair lock of a cluster without ZooKeeper
(``repair.dir_lock``; ``locks/`` in the data root when it is local and there is no repairs dir); and per cluster::

    <plan hash>/plan.json, plan.md                       the plan (what runs) and its text (what people read)
    <plan hash>/attempts/<run>/journal.json               one attempt (an Airflow run) at the plan: its journal,
    <plan hash>/attempts/<run>/result.json                what it did and did not do,
    <plan hash>/attempts/<run>/zookeeper.json             its ZooKeeper actions,
    <plan hash>/attempts/<run>/broker-<id>/backup-<n>.tar.gz   and its backups (with their sha256 manifests)
    <plan hash>/restores/<restore hash>/plan.json, plan.md     a restore plan of the plan's backups,
    <plan hash>/restores/<restore hash>/runs/<run>/journal.json  its runs' journals,
    <plan hash>/restores/<restore hash>/result-<run>.json        and what each run did
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# ---- the data root
CLUSTERS = "clusters"  # clusters/<cluster>/: one cluster's store
LOCKS = "locks"  # locks/<cluster id>.*: the repair lock of clusters without ZooKeeper (repair.dir_lock)


def dir_lock_files(lock_dir: Path, key: str) -> dict[str, Path]:
    """The files of the repair lock of the cluster whose id is ``key`` in ``lock_dir`` (``repair.dir_lock``): the
    holder record, the worker's liveness, the last fencing token given, the guard of every change."""
    return {kind: Path(lock_dir) / f"{key}.{ext}" for kind, ext in DIR_LOCK_FILES.items()}


DIR_LOCK_FILES = {"holder": "json", "active": "active", "token": "token", "guard": "guard"}
STAGING = "staging"
VERIFY = "verify"
FINDINGS = "findings"  # the findings dataset of every published run (the audit DAG's Asset)
HISTORY_RUNS = "history/runs.jsonl"
PROBE_DIR = "probe"
PROBE_OBJECT = "probe.jsonl.gz"  # one broker's staged JSON Lines: the object that says the broker is staged
CLUSTER_METADATA = "cluster-metadata.jsonl"
LEGACY_CLUSTER_METADATA = "zk.jsonl"  # the same facts, as runs staged before it was renamed hold them
CONTROLLERS = "controllers.jsonl"
METADATA_SOURCE = "metadata-source.json"
BROKERS = "brokers.jsonl"
SUMMARY = "summary.json"
FINDINGS_JSON = "findings.jsonl"
STAGE_ERRORS = "stage-errors.txt"
METADATA_ERROR = "metadata-error.txt"
REPAIR_LOCK = "repair-lock.json"  # the cluster's repair lock as last seen (``fleet_doctor.lock_state``)
ROLL_TIMINGS = "roll-timings.json"  # a broker's restart step by step, measured on the cluster's last roll
ROLL_STATUS = "roll-status.json"  # the running (or last) roll: its step, why blocked (``fleet_doctor.roll_status``)
ROLL_CONTROL = "roll-control.json"  # the operator's holds and skips per broker, read by every roll (``roll_status``)


def safe_run_id(run_id: str) -> str:
    """Airflow run ids hold ':' and '+': keep a file-name-safe form."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)


def cluster_root(cluster: str) -> str:
    """Where one cluster's store is, relative to the data root."""
    if not cluster or cluster.startswith(".") or "/" in cluster:
        raise ValueError(f"{cluster!r} is not a cluster name (fleet_doctor.inventory)")
    return f"{CLUSTERS}/{cluster}"


ROOT_CLUSTER_LOOKBACK = 30  # runs read back for one that names its cluster (a publish cut short leaves no summary)


def root_cluster(root: Any) -> str | None:
    """The cluster a single-cluster store at the data root ``root`` (a ``Store``) belongs to: the cluster its newest
    published run names (its history row, or the run's summary for a row written before rows named it; a run whose
    summary is missing, its publication cut short, is passed over); None when no run says."""
    for row in reversed(root.read_jsonl(HISTORY_RUNS)[-ROOT_CLUSTER_LOOKBACK:]):  # newest first
        if row.get("cluster"):
            return str(row["cluster"])
        summary = root.read_json(report_json(str(row.get("audit_run"))))  # a row from before rows named it
        if isinstance(summary, dict) and summary.get("cluster"):
            return str(summary["cluster"])
    return None


def cluster_store(root: Any, cluster: str) -> Any:
    """One cluster's store in the data root ``root`` (a ``Store``): ``clusters/<cluster>/``, unless the root itself
    holds this cluster's single-cluster store (``root_cluster``) and ``clusters/<cluster>/`` no history yet: then
    the root, read in place."""
    own = root.sub(cluster_root(cluster))
    if own.is_file(HISTORY_RUNS) or root_cluster(root) != cluster:
        return own
    return root


def history_findings(run: str) -> str:
    """Every finding of a published run, with its status."""
    return f"history/audit_run={run}/findings.jsonl"


def findings_dataset(run: str) -> str:
    """A published run's partition of the findings dataset."""
    return f"{FINDINGS}/audit_run={run}"


def report_html(run: str) -> str:
    return f"reports/{run}.html"


def report_json(run: str) -> str:
    """The run's summary (``audit.summary.RunSummary``)."""
    return f"reports/{run}.json"


@dataclass(frozen=True)
class RunArea:
    """One run's staging area: ``staging/<run>`` (an audit run), ``verify/<run>`` (a repair's re-verification), or
    ``""``, the root of a local work dir. Every name is a store key relative to the data root."""

    key: str

    def _at(self, name: str) -> str:
        return f"{self.key}/{name}" if self.key else name

    @property
    def probe_dir(self) -> str:
        return self._at(PROBE_DIR)

    def broker_dir(self, broker_id: int) -> str:
        return self._at(f"{PROBE_DIR}/broker_id={broker_id}")

    def probe(self, broker_id: int) -> str:
        """The JSON Lines object of one broker's staged probe output (its Parquet objects beside it)."""
        return f"{self.broker_dir(broker_id)}/{PROBE_OBJECT}"

    def staged_broker(self, rel: str) -> int | None:
        """The broker whose committed probe output ``rel`` (a key relative to ``probe_dir``) is, else None."""
        m = _STAGED.fullmatch(rel)
        return int(m.group(1)) if m else None

    @property
    def cluster_metadata(self) -> str:
        return self._at(CLUSTER_METADATA)

    @property
    def legacy_cluster_metadata(self) -> str:
        return self._at(LEGACY_CLUSTER_METADATA)

    def cluster_metadata_key(self, store: Any) -> str | None:
        """The key the cluster facts are staged at in ``store`` (the legacy name for a run staged before the
        rename), None when they are not."""
        for key in (self.cluster_metadata, self.legacy_cluster_metadata):
            if store.is_file(key):
                return key
        return None

    def read_cluster_facts(self, store: Any) -> list[dict[str, Any]]:
        """The staged cluster facts ([] when there are none)."""
        key = self.cluster_metadata_key(store)
        return store.read_jsonl(key) if key else []

    @property
    def controllers(self) -> str:
        return self._at(CONTROLLERS)

    @property
    def metadata_source(self) -> str:
        return self._at(METADATA_SOURCE)

    @property
    def brokers(self) -> str:
        return self._at(BROKERS)

    @property
    def summary(self) -> str:
        return self._at(SUMMARY)

    @property
    def findings_json(self) -> str:
        return self._at(FINDINGS_JSON)

    @property
    def own_findings_dataset(self) -> str:
        """Where a run area that is not an audit run's (a re-verification, a local run) writes its findings dataset:
        inside itself, never into the audit's."""
        return self._at("findings")

    @property
    def stage_errors(self) -> str:
        return self._at(STAGE_ERRORS)

    @property
    def metadata_error(self) -> str:
        return self._at(METADATA_ERROR)


_STAGED = re.compile(r"broker_id=(\d+)/" + re.escape(PROBE_OBJECT))
LOCAL = RunArea("")  # a local work dir: the run area is its root


def staging(run_id: str) -> RunArea:
    """An audit run's staging area."""
    return RunArea(f"{STAGING}/{safe_run_id(run_id)}")


def verify(run: str) -> RunArea:
    """A repair's re-verification of the fleet (never published)."""
    return RunArea(f"{VERIFY}/{safe_run_id(run)}")


# ---- the repairs dir
PLAN = "plan.json"
PLAN_TEXT = "plan.md"
JOURNAL = "journal.json"
RESULT = "result.json"
ZOOKEEPER_RESULT = "zookeeper.json"


def attempt_name(run_id: str) -> str:
    """A file-name-safe, one-to-one name for an Airflow run id (``safe_run_id`` alone maps ``a:b`` and ``a_b`` to
    one name: two runs would share an attempt)."""
    safe = safe_run_id(run_id)
    return safe if safe == run_id else f"{safe}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class RepairsDir:
    """The repairs dir: every plan, its attempts and its restores (module docstring)."""

    root: Path

    def plan_dir(self, plan_hash: str) -> Path:
        return self.root / plan_hash

    def plan(self, plan_hash: str) -> Path:
        return self.plan_dir(plan_hash) / PLAN

    def plan_text(self, plan_hash: str) -> Path:
        return self.plan_dir(plan_hash) / PLAN_TEXT

    def attempts(self, plan_hash: str) -> Path:
        return self.plan_dir(plan_hash) / "attempts"

    def attempt(self, plan_hash: str, run_id: str) -> Path:
        """Where one attempt at a plan (one Airflow run) keeps its journal, result and backups."""
        return self.attempts(plan_hash) / attempt_name(run_id)

    def purge_dir(self, plan_hash: str, purge_hash: str) -> Path:
        """A plan deleting what the repair plan ``plan_hash`` quarantined (``repair.purge``): its plan, text, result."""
        return self.plan_dir(plan_hash) / "purges" / purge_hash

    def restore_dir(self, plan_hash: str, restore_hash: str) -> Path:
        return self.plan_dir(plan_hash) / "restores" / restore_hash

    def restore_run(self, plan_hash: str, restore_hash: str, run_id: str) -> Path:
        """Where one run of a restore plan keeps its journal."""
        return self.restore_dir(plan_hash, restore_hash) / "runs" / attempt_name(run_id)

    def restore_result(self, plan_hash: str, restore_hash: str, run_id: str) -> Path:
        return self.restore_dir(plan_hash, restore_hash) / f"result-{safe_run_id(run_id)}.json"


def backup_name(broker_id: int, n: int) -> str:
    """A backup's tarball, relative to its attempt's dir (the journal records this name)."""
    return f"broker-{broker_id}/backup-{n}.tar.gz"


def backup_manifest(tarball: Path, n: int) -> Path:
    """The sha256 manifest of a backup's files, beside its tarball."""
    return tarball.with_name(f"manifest-{n}.sha256")


def backup_checksum(tarball: Path, n: int) -> Path:
    """The tarball's own sha256, beside it."""
    return tarball.with_name(f"backup-{n}.sha256")
