"""Submitting the detection app (spark_apps/detect.py) to Spark: the command, its environment, the library it ships.

Two named profiles of Spark settings, picked by the master: ``local`` (``local``, ``local[N]``: the CLI's ``scan``,
the demo, the tests; the driver on 127.0.0.1) and ``cluster`` (``spark://``, ``yarn``, ``k8s://``: nothing pinned to
one host). The audit DAG's master comes from its ``spark_default`` connection, so a cluster submit needs no override.
Runs of seconds on small inputs (``scan``, the repair's post-verify and re-verify) also take ``SHORT_RUN_CONF``. The
library (``fleet_doctor``) goes to the driver and the executors as a ``--py-files`` archive built from this package.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet_doctor.store import atomic_file, write_atomic

PACKAGE = Path(__file__).resolve().parent
DETECT_APP = PACKAGE.parents[1] / "spark_apps" / "detect.py"

PROFILES: dict[str, dict[str, str]] = {
    "local": {
        # one small machine: few shuffle partitions, no UI, loopback only
        "spark.sql.shuffle.partitions": "4",
        "spark.sql.adaptive.enabled": "true",
        "spark.ui.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.log.level": "WARN",
        # no per-call Python call-site capture (several JVM round trips per DataFrame/Column call)
        "spark.python.sql.dataFrameDebugging.enabled": "false",
    },
    "cluster": {
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.adaptive.coalescePartitions.enabled": "true",
        "spark.log.level": "WARN",
        "spark.python.sql.dataFrameDebugging.enabled": "false",
    },
}
# a driver JVM that lives seconds: the C1 compiler alone warms up much faster than tiered C2 (which pays off on big
# inputs: bench/README.md, detection benchmark)
SHORT_RUN_CONF = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}
LOCAL_SPARK_CONF = {**PROFILES["local"], **SHORT_RUN_CONF}  # scan's settings


class SparkError(RuntimeError):
    """Spark cannot be run from this interpreter, or the detection app failed (the message says why)."""


def profile_for(master: str) -> str:
    """The profile of a Spark master URL: ``local`` for ``local``/``local[N]``/``local[*]``, else ``cluster``."""
    return "local" if master == "local" or master.startswith("local[") else "cluster"


def conf_for(master: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The master's profile, with ``extra`` (the store's and the configured settings) on top."""
    return {**PROFILES[profile_for(master)], **(extra or {})}


def _spark_home() -> str:
    spec = importlib.util.find_spec("pyspark")  # found, not imported: cheap enough for DAG parsing
    if spec is None or not spec.submodule_search_locations:
        raise SparkError("pyspark is not installed in this interpreter's environment")
    return next(iter(spec.submodule_search_locations))


def spark_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a spark-submit on this machine, from this interpreter's pyspark (the pip package ships Spark):
    its Spark, this Python for driver and executors, this venv's bin first, and a loopback driver address."""
    env = dict(os.environ if base is None else base)
    env["SPARK_HOME"] = _spark_home()
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def library_archive(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``fleet_doctor`` as a zip for ``--py-files``, named by its content (built once per version of the library,
    atomically; concurrent builders write the same bytes). Default cache: ``$TMPDIR/fleet-doctor-spark-<uid>``."""
    sources = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
    digest = hashlib.sha256()
    for p in sources:
        digest.update(str(p.relative_to(PACKAGE)).encode() + b"\0" + p.read_bytes() + b"\0")
    directory = Path(cache_dir or Path(tempfile.gettempdir()) / f"fleet-doctor-spark-{os.getuid()}")
    archive = directory / f"fleet_doctor-{digest.hexdigest()[:16]}.zip"
    if archive.is_file():
        return archive
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_file(archive) as out, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sources:
            info = zipfile.ZipInfo(f"fleet_doctor/{p.relative_to(PACKAGE)}", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, p.read_bytes())
    return archive


def detect_args(
    probe_dir: str,
    brokers: str,
    output: str,
    audit_run: str,
    summary: str,
    findings_json: str,
    zk_snapshot: str | None = None,
    partial_scope: bool = False,
    controllers: str | None = None,
    metadata_mode: str | None = None,
) -> list[str]:
    """The detection app's command-line arguments (spark_apps/detect.py --help). ``zk_snapshot``: the cluster facts
    (a ZooKeeper snapshot's records, or a KRaft metadata log's); ``controllers``: KRaft, the controllers' own
    metadata log headers and problems; ``metadata_mode``: the cluster's declared mode ("zookeeper" | "kraft"), so
    that a KRaft run whose controllers could not be read says so instead of looking like a ZooKeeper one."""
    if metadata_mode not in (None, "zookeeper", "kraft"):
        raise ValueError(f"metadata_mode must be 'zookeeper' or 'kraft', not {metadata_mode!r}")
    args = ["--probe-dir", probe_dir, "--brokers", brokers, "--output", output, "--audit-run", audit_run]
    args += ["--summary", summary, "--findings-json", findings_json]
    if zk_snapshot:
        args += ["--zk-snapshot", zk_snapshot]
    if controllers:
        args += ["--controllers", controllers]
    if metadata_mode:
        args += ["--metadata-mode", metadata_mode]
    if partial_scope:
        args.append("--partial-scope")
    return args


def submit_command(
    app: Path, master: str, conf: Mapping[str, str], app_args: list[str], jars: str = "", py_files: str = ""
) -> list[str]:
    """The spark-submit command line of ``app`` (the library archive is built and shipped unless ``py_files``
    names it)."""
    cmd = [os.path.join(_spark_home(), "bin", "spark-submit"), "--master", master]
    if jars:
        cmd += ["--jars", jars]
    cmd += ["--py-files", py_files or str(library_archive())]
    for k, v in conf.items():
        cmd += ["--conf", f"{k}={v}"]
    return [*cmd, str(app), *app_args]


def run_detect(
    master: str, conf: Mapping[str, str], args: list[str], jars: str = "", env: Mapping[str, str] | None = None
) -> None:
    """The detection app through spark-submit on this machine, with ``env`` on top of ``spark_env()``; SparkError
    with the end of its stderr when it fails."""
    cmd = submit_command(DETECT_APP, master, conf, args, jars=jars)
    proc = subprocess.run(cmd, env={**spark_env(), **(env or {})}, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-25:])
        raise SparkError(f"detection app failed (exit {proc.returncode}):\n{tail}")


@dataclass(frozen=True)
class Detection:
    findings: list[dict[str, Any]]
    summary: dict[str, Any]


def detect_locally(
    work: Path,
    brokers: Iterable[Mapping[str, Any]],
    zk_records: Iterable[Mapping[str, Any]] | None,
    *,
    master: str = "local[*]",
    audit_run: str = "scan",
    partial_scope: bool = False,
    controller_records: Iterable[Mapping[str, Any]] | None = None,
    metadata_mode: str | None = None,
) -> Detection:
    """The detection app on probe output staged in ``work/probe/broker_id=<N>/`` (fleet_doctor.audit.staging), in
    this machine's Spark: for ``fleet-doctor scan`` and the repair's post-verify of one broker. ``brokers``: the
    broker facts (``broker_id``, ``kafka_version``, ``running``); ``zk_records``: the cluster facts (a ZooKeeper
    snapshot's records or a KRaft metadata log's), or None for none; ``controller_records``: KRaft, every
    controller's ``cluster_metadata`` record each followed by its ``metadata_problem`` records, or None;
    ``partial_scope``: only some of the fleet's brokers are in ``work`` (rules that compare brokers are skipped);
    ``metadata_mode``: the cluster's mode, by default "kraft" when controller records or a metadata log's records
    are given, else "zookeeper" when a ZooKeeper snapshot's are, else not told. SparkError when the app fails."""
    write_atomic(work / "brokers.jsonl", "".join(json.dumps(dict(b)) + "\n" for b in brokers).encode())
    zk = controllers = None
    if zk_records is not None:
        zk_records = list(zk_records)
    if controller_records is not None:
        controller_records = list(controller_records)
    if metadata_mode is None:
        if controller_records is not None or (zk_records and zk_records[0].get("kind") == "cluster_metadata"):
            metadata_mode = "kraft"
        elif zk_records is not None:
            metadata_mode = "zookeeper"
    if zk_records is not None:
        zk = str(work / "zk.jsonl")
        write_atomic(zk, "".join(json.dumps(dict(r)) + "\n" for r in zk_records).encode())
    if controller_records is not None:
        controllers = str(work / "controllers.jsonl")
        write_atomic(controllers, "".join(json.dumps(dict(r)) + "\n" for r in controller_records).encode())
    args = detect_args(
        str(work / "probe"),
        str(work / "brokers.jsonl"),
        str(work / "findings"),
        audit_run,
        str(work / "summary.json"),
        str(work / "findings.jsonl"),
        zk,
        partial_scope,
        controllers,
        metadata_mode,
    )
    run_detect(master, {**conf_for(master), **SHORT_RUN_CONF}, args)
    findings = [json.loads(line) for line in (work / "findings.jsonl").read_text().splitlines() if line.strip()]
    return Detection(findings, json.loads((work / "summary.json").read_text()))
