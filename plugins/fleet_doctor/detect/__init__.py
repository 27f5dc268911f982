"""Detection: probe facts + ZooKeeper snapshot + broker facts -> findings, as Spark DataFrame transformations in the
DataFrame API (no Python UDFs; cross-source rules are joins). Run by spark_apps/detect.py.

- ``frames``: the staged inputs, loaded once each into ``Frames``;
- ``findings``: what a finding is and how a rule makes one (checks fused per fact frame, or joins);
- one module per rule family, each function registered for its rule id (``findings.detector``): ``segments``,
  ``partitions``, ``logdirs``, ``cluster``, ``kraft``. Rule metadata (severity bands, remediation) is the registry's,
  ``fleet_doctor.rules``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from pyspark import inheritable_thread_target
from pyspark.sql import DataFrame

from fleet_doctor.detect import (  # noqa: F401  (they register the detectors)
    cluster,
    kraft,
    logdirs,
    partitions,
    segments,
)
from fleet_doctor.detect.findings import (
    DETECTORS,
    EMITTED_BY,
    FINDING_COLUMNS,
    Check,
    clear_column_cache,
    pin_jvm_classes,
    run_checks,
    union_all,
)
from fleet_doctor.detect.frames import Frames, load_frames
from fleet_doctor.rules import RULES, Needs, Scope

__all__ = ["FINDING_COLUMNS", "Frames", "detect", "load_frames"]

# judged from partition state against live brokers (offline-partition comes with under-replicated)
LIVENESS_RULES = frozenset({"under-replicated", "offline-partition"})


PLAN_THREADS = 4
NO_METADATA_LOG = "no controller's metadata log could be read"


def _stopped_reason(f: Frames) -> str:
    if set(f.shutdown_brokers) >= set(f.fenced_brokers):
        why = "every broker fenced after a controlled shutdown"
    else:
        why = (
            "every broker fenced, and nothing of the cluster runs (no broker running, no lock held, no live controller)"
        )
    return f"the metadata log shows {why}: a stopped cluster, whose partition leaders and ISR are those of its shutdown"


def detect(f: Frames, partial_scope: bool = False) -> tuple[DataFrame, dict[str, str]]:
    """All findings, plus {rule id: reason} for rules that could not be evaluated. ``partial_scope``: the run
    staged only some of the fleet's brokers on purpose (the audit DAG's ``brokers`` param)."""
    clear_column_cache()
    pin_jvm_classes(f.brokers.sparkSession.sparkContext)
    skipped: dict[str, str] = {}
    parts: list[DataFrame] = []
    checks: dict[str, list[Check]] = {}
    runnable: list[str] = []
    for rule in RULES:
        if rule.id in EMITTED_BY:
            if EMITTED_BY[rule.id] in skipped:
                skipped[rule.id] = skipped[EMITTED_BY[rule.id]]
            continue
        if rule.needs is Needs.ZOOKEEPER and not f.has_cluster_facts:
            skipped[rule.id] = NO_METADATA_LOG if f.kraft else "no ZooKeeper snapshot given"
            continue
        if rule.needs is Needs.METADATA_LOG:
            # KRaft's own rules: not for a ZooKeeper cluster (nor one whose mode nothing tells)
            if not f.kraft:
                continue
            if rule.scope is Scope.CONTROLLER and f.controllers is None:
                skipped[rule.id] = NO_METADATA_LOG
                continue
            if rule.scope is not Scope.CONTROLLER and not f.has_cluster_facts:
                skipped[rule.id] = NO_METADATA_LOG
                continue
        if rule.id in LIVENESS_RULES and f.stopped_kraft_cluster:
            skipped[rule.id] = _stopped_reason(f)
            continue
        # rules that compare brokers cannot judge from some of them (the odd replica may be out of scope, or a tie
        # blames the right one)
        if partial_scope and rule.needs is Needs.FLEET:
            skipped[rule.id] = "only some brokers audited in this run"
            continue
        runnable.append(rule.id)
    # each plan is built (and analyzed by Spark, eagerly) in its own thread: the driver spends most of it waiting on
    # the JVM, whose analyzer runs the threads' plans side by side
    in_thread = inheritable_thread_target(f.brokers.sparkSession)  # the job group and properties of this thread
    with ThreadPoolExecutor(PLAN_THREADS) as pool:
        outs = list(pool.map(in_thread(lambda rule_id: DETECTORS[rule_id](f)), runnable))
        for out in outs:
            for item in out if isinstance(out, list) else [out]:
                if isinstance(item, Check):
                    checks.setdefault(item.on, []).append(item)
                else:
                    parts.append(item)
        bases = {"segments": f.segments, "partitions": f.partitions, "files": f.files, "logdirs": f.logdirs}
        fused = list(pool.map(in_thread(lambda on: run_checks(bases[on], checks[on])), list(checks)))
    return union_all(fused + parts), skipped
