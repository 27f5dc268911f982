"""The nightly audit's steps, as plain functions the DAG (dags/kafka_fleet_audit.py) calls.

discover -> stage (one broker each, over SSH) -> snapshot ZooKeeper -> broker facts -> detect (Spark) ->
publish (history, report) -> alert. Nothing here imports Airflow: the SSH client is any connected
``paramiko.SSHClient`` (the DAG gets it from the SSH provider's hook), so the steps are tested on their own.

Storage layout under the data root (``FLEET_DOCTOR_DATA``: a local directory, or ``s3a://bucket/prefix`` or
``hdfs://namenode/path``, see fleet_doctor.store)::

    staging/<run>/probe/broker_id=<N>/probe.jsonl.gz    one broker's probe output but its bulk records, and
    staging/<run>/probe/broker_id=<N>/probe.{segments,partitions,files}.parquet   those (fleet_doctor.staged_records)
    staging/<run>/zk.jsonl, brokers.jsonl               the ZooKeeper snapshot, the broker facts
    staging/<run>/summary.json, findings.jsonl          what the Spark app wrote
    findings/audit_run=<run>/*.parquet                  the findings dataset (the DAG's Asset)
    history/runs.jsonl, history/audit_run=<run>/findings.jsonl   per finding: new / persisting / resolved
    reports/<run>.html                                  the report
"""

from __future__ import annotations

import io
import json
import os
import re
import select
import shlex
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from fleet_doctor import inventory as inv
from fleet_doctor.store import Store

REPO = Path(__file__).resolve().parents[2]
PROBE_SOURCE = Path(__file__).resolve().parent / "probe.py"
DETECT_APP = REPO / "spark_apps" / "detect.py"
PROBE_OBJECT = "probe.jsonl.gz"
DEFAULT_INVENTORY = "/etc/kafka-fleet-doctor/inventory.json"
FINDING_KEY = ("rule", "broker_id", "log_dir", "topic", "partition", "segment", "path")
SEVERITIES = ("critical", "warning", "info")
SECRET_SETTING_WORDS = ("access.key", "secret", "session.token", "password")


@dataclass(frozen=True)
class AuditSettings:
    inventory: Path
    data_root: str | Path  # a local directory or a store URL (s3a://, s3://, hdfs://)
    schedule: str = "0 2 * * *"
    pool: str = "kafka_fleet_audit"
    pool_slots: int = 32  # one wave for a fleet of up to 32 brokers (bench/README.md: audit staging)
    deep: bool = True
    verify_crc: bool = False
    stage_retries: int = 2
    stage_retry_delay_s: float = 30.0
    ssh_timeout_s: float = 1800.0
    spark_jars: str = ""  # comma-separated, for spark-submit --jars (e.g. hadoop-aws for an s3a:// store)
    spark_conf: tuple[tuple[str, str], ...] = ()  # extra Spark settings
    repair_dir: Path | None = None  # the repair DAGs' plans and journals (a local directory)
    # where the store's settings (S3 endpoint, credentials) are read; None: this process's environment
    environ: Mapping[str, str] | None = field(default=None, repr=False, compare=False)

    @cached_property
    def store(self) -> Store:
        return Store(self.data_root, self.environ)

    @staticmethod
    def run_key(run_id: str) -> str:
        """The store key of one audit run's staging area."""
        return f"staging/{safe_run_id(run_id)}"

    @property
    def findings_url(self) -> str:
        return self.store.url("findings")

    def detect_conf(self, base: Mapping[str, str]) -> dict[str, str]:
        """Spark settings of the detection app: ``base``, the store's (S3A endpoint), then the configured extras."""
        return {**base, **self.store.spark_conf(), **dict(self.spark_conf)}

    @property
    def repairs(self) -> Path:
        """The repair DAGs' plans, journals and backups: a local directory the plan, execute and restore tasks
        all see (FLEET_DOCTOR_REPAIR_DIR; default ``<data root>/repairs`` for a local data root)."""
        if self.repair_dir is not None:
            return self.repair_dir
        if not self.store.is_local:
            raise ValueError(
                f"the data root {self.store.root} is remote: set FLEET_DOCTOR_REPAIR_DIR to a directory that every "
                "task of the repair DAGs sees (a shared volume, or one worker's disk with the DAGs on one queue)"
            )
        return Path(self.data_root) / "repairs"


def settings_from_env(environ: Mapping[str, str] | None = None) -> AuditSettings:
    """FLEET_DOCTOR_INVENTORY, FLEET_DOCTOR_DATA, FLEET_DOCTOR_AUDIT_SCHEDULE, FLEET_DOCTOR_AUDIT_POOL(_SLOTS),
    FLEET_DOCTOR_DEEP, FLEET_DOCTOR_VERIFY_CRC, FLEET_DOCTOR_STAGE_RETRIES, FLEET_DOCTOR_STAGE_RETRY_DELAY,
    FLEET_DOCTOR_SPARK_JARS, FLEET_DOCTOR_SPARK_CONF (a JSON object), FLEET_DOCTOR_REPAIR_DIR, read from
    ``environ`` (default: this process's environment); unset or empty means AuditSettings' default."""
    env = os.environ if environ is None else environ
    d = AuditSettings

    def flag(name: str, default: bool) -> bool:
        v = env.get(name)
        return default if v is None else v.strip().lower() in ("1", "true", "yes", "on")

    try:
        extra = json.loads(env.get("FLEET_DOCTOR_SPARK_CONF") or "{}")
        if not isinstance(extra, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        raise ValueError(f"FLEET_DOCTOR_SPARK_CONF: expected a JSON object of Spark settings ({e})") from e
    secret = [k for k in extra if any(w in k.lower() for w in SECRET_SETTING_WORDS)]
    if secret:  # the settings end up in the serialized DAG, the task log and spark-submit's command line
        raise ValueError(f"FLEET_DOCTOR_SPARK_CONF: no credentials here ({', '.join(secret)}): use the AWS_* variables")
    data = env.get("FLEET_DOCTOR_DATA") or str(REPO / ".fleet-doctor")
    return AuditSettings(
        inventory=Path(env.get("FLEET_DOCTOR_INVENTORY") or DEFAULT_INVENTORY),
        data_root=data if "://" in data else Path(data),
        schedule=env.get("FLEET_DOCTOR_AUDIT_SCHEDULE") or d.schedule,
        pool=env.get("FLEET_DOCTOR_AUDIT_POOL") or d.pool,
        pool_slots=int(env.get("FLEET_DOCTOR_AUDIT_POOL_SLOTS") or d.pool_slots),
        deep=flag("FLEET_DOCTOR_DEEP", d.deep),
        verify_crc=flag("FLEET_DOCTOR_VERIFY_CRC", d.verify_crc),
        stage_retries=int(env.get("FLEET_DOCTOR_STAGE_RETRIES") or d.stage_retries),
        stage_retry_delay_s=float(env.get("FLEET_DOCTOR_STAGE_RETRY_DELAY") or d.stage_retry_delay_s),
        spark_jars=env.get("FLEET_DOCTOR_SPARK_JARS") or d.spark_jars,
        spark_conf=tuple(sorted((str(k), str(v)) for k, v in extra.items())),
        repair_dir=Path(env["FLEET_DOCTOR_REPAIR_DIR"]) if env.get("FLEET_DOCTOR_REPAIR_DIR") else None,
        environ=environ,
    )


def asset_uri(url: str) -> str:
    """An Airflow Asset URI for a store URL: ``file://`` for a local path, ``s3://`` for S3A (Airflow's S3 scheme)."""
    if "://" not in url:
        return f"file://{url}"
    return "s3://" + url.split("://", 1)[1] if url.startswith(("s3a://", "s3://")) else url


def safe_run_id(run_id: str) -> str:
    """Airflow run ids hold ':' and '+': keep a file-name-safe form."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)


# --------------------------------------------------------------------------------------------
# discover
def discover(
    inventory: inv.Inventory, zookeeper: str | None = None, timeout: float = 10.0, only: Iterable[int] = ()
) -> dict[str, Any]:
    """The brokers to audit: every broker of the inventory (or only the ids in ``only``, the rest listed as out of
    scope), with its ZooKeeper registration. A broker known to only one of the two is reported, never dropped."""
    known = {b.id for b in inventory.brokers}
    scope = {int(b) for b in only}
    if scope - known:
        raise ValueError(f"broker(s) {sorted(scope - known)} are not in the inventory of cluster {inventory.cluster}")
    registered: dict[int, dict[str, Any]] = {}
    zk_error = None
    try:
        from kazoo.client import KazooClient

        zk = KazooClient(hosts=zookeeper or inventory.zookeeper, timeout=timeout, read_only=True)
        zk.start(timeout=timeout)
        try:
            for child in zk.get_children("/brokers/ids"):
                raw, _ = zk.get(f"/brokers/ids/{child}")
                try:
                    registered[int(child)] = json.loads(raw)
                except ValueError:
                    registered[int(child)] = {}
        finally:
            zk.stop()
            zk.close()
    except Exception as e:  # kazoo's timeouts and connection errors have no common base
        zk_error = f"ZooKeeper {zookeeper or inventory.zookeeper}: {type(e).__name__}: {e}"
    brokers = [
        {
            "broker_id": b.id,
            "host": b.host,
            "ssh_conn_id": inventory.ssh_connection_id(b.id),
            "log_dirs": list(b.log_dirs),
            "kafka_version": b.kafka_version,
            "registered": b.id in registered,
        }
        for b in inventory.brokers
        if not scope or b.id in scope
    ]
    return {
        "cluster": inventory.cluster,
        "zookeeper": zookeeper or inventory.zookeeper,
        "brokers": brokers,
        "registered": sorted(registered),
        "only_in_inventory": sorted(known - set(registered)) if zk_error is None else [],
        "only_in_zookeeper": sorted(set(registered) - known),
        "zookeeper_error": zk_error,
        "out_of_scope": sorted(known - scope) if scope else [],
    }


# --------------------------------------------------------------------------------------------
# stage
def probe_command(log_dirs: Iterable[str], *, deep: bool, verify_crc: bool) -> str:
    """The remote command: the probe read from stdin by python3, at the lowest CPU and I/O priority the host
    offers (nice 19, ionice idle class where present). Every path is shell-quoted."""
    args = ["--jobs", "1"]
    if verify_crc:
        args.append("--verify-crc")
    elif deep:
        args.append("--deep")
    probe = "python3 - " + " ".join(shlex.quote(a) for a in [*args, *log_dirs])
    return f"if command -v ionice >/dev/null 2>&1; then IO='ionice -c 3'; else IO=''; fi; exec nice -n 19 $IO {probe}"


class StageError(RuntimeError):
    """The probe could not be run or did not finish on the broker."""


def run_probe(client: Any, command: str, sink: Callable[[bytes], None], timeout: float, who: str) -> dict[str, Any]:
    """Stream the probe (sent on stdin) through an open SSH connection: stdout goes to ``sink`` as it arrives.
    Raises StageError unless the probe exited 0 and its last record is a complete ``probe_end`` (returned)."""
    transport = client.get_transport()
    chan = transport.open_session(timeout=30)
    chan.settimeout(timeout)
    err = bytearray()
    tail = b""
    deadline = time.monotonic() + timeout
    try:
        chan.exec_command(command)
        chan.sendall(PROBE_SOURCE.read_bytes())
        chan.shutdown_write()
        while True:
            if time.monotonic() > deadline:
                raise StageError(f"{who}: the probe did not finish within {timeout:.0f} s")
            select.select([chan], [], [], 1.0)
            progressed = False
            while chan.recv_ready():
                data = chan.recv(1 << 16)
                if not data:
                    break
                sink(data)
                tail = (tail + data)[-4096:]
                progressed = True
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(1 << 16)
                progressed = True
            if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                break
            if not progressed and chan.closed:
                break
        status = chan.recv_exit_status()
    finally:
        chan.close()
    last = tail.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    end = json.loads(last) if last.startswith(b"{") else {}
    if status != 0:
        raise StageError(f"{who}: the probe exited {status}: {err.decode(errors='replace').strip()[-500:]}")
    if end.get("kind") != "probe_end" or not end.get("complete"):
        raise StageError(f"{who}: the probe output ends without a complete probe_end record")
    end["stderr"] = err.decode(errors="replace")[-2000:]
    return end


def probe_records(client: Any, log_dirs: Iterable[str], timeout: float = 600.0) -> list[dict[str, Any]]:
    """A metadata-mode probe of a broker's log dirs, its records in memory (for checks on a few partitions,
    e.g. a repair's post-verify; the audit streams to the staging store instead)."""
    buf = bytearray()
    run_probe(client, probe_command(log_dirs, deep=False, verify_crc=False), buf.extend, timeout, "post-verify")
    return [json.loads(line) for line in buf.splitlines() if line.strip()]


def stage_broker(
    client: Any,
    broker: dict[str, Any],
    store: Store,
    run_key: str,
    *,
    deep: bool,
    verify_crc: bool,
    timeout: float = 1800.0,
) -> dict[str, Any]:
    """Run the probe on the broker over an open SSH connection and stream its output into the store under
    ``<run_key>/probe/broker_id=<N>/``: the segment, partition and file records as ``probe.segments.parquet``,
    ``probe.partitions.parquet`` and ``probe.files.parquet``, every other record as gzip'd JSON Lines,
    ``probe.jsonl.gz`` (fleet_doctor.staged_records). A broker counts as staged only when its JSON Lines object
    exists: an attempt first removes the one a previous attempt left (so old JSON Lines never pair with new
    Parquet), and commits it again last. The objects appear only when the probe exited 0, its last record is a
    complete ``probe_end``, and the records staged of each kind are as many as it counted."""
    from fleet_doctor.staged_records import ProbeSplitter, staged_outputs  # pyarrow: imported when used

    bid = int(broker["broker_id"])
    key = f"{run_key}/probe/broker_id={bid}/{PROBE_OBJECT}"
    command = probe_command(broker["log_dirs"], deep=deep, verify_crc=verify_crc)
    store.delete(key)
    nbytes = 0
    with staged_outputs(key, store.writer, gzip_level=5) as (out, columnar):
        with ProbeSplitter(out, columnar) as splitter:

            def sink(data: bytes) -> None:
                nonlocal nbytes
                splitter.write(data)
                nbytes += len(data)

            end = run_probe(client, command, sink, timeout, f"broker {bid}")
        miscounted = splitter.miscounted(end)
        if miscounted:
            raise StageError(f"broker {bid}: " + "; ".join(miscounted))
    return {
        "broker_id": bid,
        "path": store.url(key),
        "bytes": nbytes,
        "partitions": end.get("partitions"),
        "segments": end.get("segments"),
        "segments_columnar": splitter.rows["segment"],
        "errors": end.get("errors"),
        "stderr": end["stderr"],
    }


def staged_brokers(store: Store, run_key: str) -> list[int]:
    """Brokers whose probe output is complete (only the final object counts, never a temporary one)."""
    done = re.compile(r"broker_id=(\d+)/" + re.escape(PROBE_OBJECT))
    return sorted(int(m.group(1)) for f in store.files(f"{run_key}/probe") if (m := done.fullmatch(f)))


# --------------------------------------------------------------------------------------------
# ZooKeeper snapshot and broker facts
def snapshot_zookeeper(connect: str, store: Store, key: str, timeout: float = 10.0) -> int:
    from fleet_doctor import zk_snapshot

    records = zk_snapshot.read_live(connect, timeout=timeout)
    store.write_jsonl(key, records)
    return len(records)


def write_broker_facts(discovered: dict[str, Any], store: Store, run_key: str) -> dict[str, Any]:
    """brokers.jsonl for the Spark app, and the audited / not-audited split."""
    staged = set(staged_brokers(store, run_key))
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
    store.write_jsonl(f"{run_key}/brokers.jsonl", facts)
    zk = f"{run_key}/zk.jsonl"
    return {
        "audited": sorted(staged),
        "not_audited": sorted(b["broker_id"] for b in discovered["brokers"] if b["broker_id"] not in staged),
        "out_of_scope": list(discovered.get("out_of_scope", [])),
        "brokers": store.url(f"{run_key}/brokers.jsonl"),
        "probe_dir": store.url(f"{run_key}/probe"),
        "zk_snapshot": store.url(zk) if store.is_file(zk) else None,
    }


def detect_args(settings: AuditSettings, run_id: str, facts: dict[str, Any]) -> list[str]:
    run_key = settings.run_key(run_id)
    args = [
        "--probe-dir", facts["probe_dir"],
        "--brokers", facts["brokers"],
        "--output", settings.findings_url,
        "--audit-run", safe_run_id(run_id),
        "--summary", settings.store.url(f"{run_key}/summary.json"),
        "--findings-json", settings.store.url(f"{run_key}/findings.jsonl"),
    ]  # fmt: skip
    if facts.get("zk_snapshot"):
        args += ["--zk-snapshot", facts["zk_snapshot"]]
    if facts.get("out_of_scope"):
        args.append("--partial-scope")
    return args


# --------------------------------------------------------------------------------------------
# publish: history and report
def finding_key(f: dict[str, Any]) -> str:
    return json.dumps([f.get(k) for k in FINDING_KEY])


def publish(settings: AuditSettings, run_id: str, discovered: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    """Mark every finding new / persisting versus the previous run, add the previous run's findings that are
    gone as resolved (unless their broker was not audited this time, unreachable or out of the run's scope: then
    they are carried as unverified),
    append the run to the history, write the HTML report and return the compact summary."""
    from fleet_doctor.report import render_audit_html

    store = settings.store
    run = safe_run_id(run_id)
    run_key = settings.run_key(run_id)
    findings = store.read_jsonl(f"{run_key}/findings.jsonl")
    spark_summary = store.read_json(f"{run_key}/summary.json") or {}
    runs = [r for r in store.read_jsonl("history/runs.jsonl") if r["audit_run"] != run]
    previous = runs[-1]["audit_run"] if runs else None
    before = (
        {
            finding_key(f): f
            for f in store.read_jsonl(f"history/audit_run={previous}/findings.jsonl")
            if f.get("status") != "resolved"
        }
        if previous
        else {}
    )
    not_audited = set(facts["not_audited"])
    out_of_scope = set(facts.get("out_of_scope", []))
    not_checked = not_audited | out_of_scope
    rows = []
    now = {finding_key(f): f for f in findings}
    for key, f in now.items():
        rows.append(
            {
                **f,
                "status": "persisting" if key in before else "new",
                "first_seen": (before.get(key) or {}).get("first_seen") or run,
            }
        )
    for key, f in before.items():
        if key in now:
            continue
        # a partial run resolves only what it looked at: its brokers' own findings, not the cluster's
        carried = f.get("broker_id") in not_checked or (bool(out_of_scope) and f.get("broker_id") is None)
        rows.append({**f, "status": "unverified" if carried else "resolved", "audit_run": run})
    store.write_jsonl(f"history/audit_run={run}/findings.jsonl", rows)
    active = [r for r in rows if r["status"] in ("new", "persisting", "unverified")]
    by_severity = Counter(r["severity"] for r in active if r["status"] != "unverified")
    status_counts = Counter(r["status"] for r in rows)
    report = f"reports/{run}.html"
    summary = {
        "audit_run": run,
        "cluster": discovered["cluster"],
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "findings": sum(by_severity.values()),
        "by_severity": {s: by_severity.get(s, 0) for s in SEVERITIES},
        "by_status": {s: status_counts.get(s, 0) for s in ("new", "persisting", "resolved", "unverified")},
        "by_rule": dict(sorted(Counter(r["rule"] for r in active if r["status"] != "unverified").items())),
        "audited": facts["audited"],
        "not_audited": facts["not_audited"],
        "out_of_scope": facts.get("out_of_scope", []),
        "only_in_inventory": discovered["only_in_inventory"],
        "only_in_zookeeper": discovered["only_in_zookeeper"],
        "zookeeper_error": discovered.get("zookeeper_error"),
        "rules_skipped": spark_summary.get("rules_skipped", {}),
        "report": store.url(report),
        "findings_dataset": store.url(f"findings/audit_run={run}"),
        "previous_run": previous,
    }
    runs.append(
        {k: summary[k] for k in ("audit_run", "finished_at", "by_severity", "by_status", "not_audited", "out_of_scope")}
    )
    store.write_jsonl("history/runs.jsonl", runs)
    store.write_text(f"reports/{run}.json", json.dumps(summary, indent=2) + "\n")
    html = io.StringIO()
    render_audit_html(rows, summary, runs, html)
    store.write_text(report, html.getvalue())
    return summary


def alert_message(summary: dict[str, Any], report_url: str | None = None) -> str | None:
    """The on-call message when there are critical findings or brokers that could not be audited, else None."""
    crit = summary["by_severity"]["critical"]
    if not crit and not summary["not_audited"] and not summary.get("zookeeper_error"):
        return None
    parts = [f"Kafka Fleet Doctor, cluster {summary['cluster']}, audit {summary['audit_run']}:"]
    parts.append(
        f"{crit} critical, {summary['by_severity']['warning']} warning finding(s) "
        f"({summary['by_status']['new']} new, {summary['by_status']['resolved']} resolved)."
    )
    if summary["by_rule"]:
        parts.append("Rules: " + ", ".join(f"{r} {n}" for r, n in summary["by_rule"].items()) + ".")
    if summary["not_audited"]:
        parts.append(f"NOT AUDITED (unreachable): brokers {', '.join(map(str, summary['not_audited']))}.")
    if summary.get("zookeeper_error"):
        parts.append(summary["zookeeper_error"])
    parts.append(f"Report: {report_url or summary['report']}")
    return " ".join(parts)


def run_local(
    settings: AuditSettings,
    run_id: str,
    connect: Any,
    *,
    master: str = "local[2]",
) -> dict[str, Any]:
    """The audit's steps in this process, without Airflow (tests, ad-hoc runs): discover, stage every broker
    through ``connect(broker) -> paramiko.SSHClient`` (a broker that fails is left not audited), snapshot
    ZooKeeper, detect with spark-submit, publish. Returns the published summary."""
    import subprocess

    from fleet_doctor.scan import LOCAL_SPARK_CONF, spark_env, spark_submit_cmd

    store, run_key = settings.store, settings.run_key(run_id)
    store.check()
    discovered = discover(inv.load(settings.inventory))
    errors = []
    for broker in discovered["brokers"]:
        try:
            client = connect(broker)
            try:
                stage_broker(client, broker, store, run_key, deep=settings.deep, verify_crc=settings.verify_crc)
            finally:
                client.close()
        except Exception as e:  # an unreachable broker is reported, not fatal
            errors.append(f"broker {broker['broker_id']}: {type(e).__name__}: {e}\n")
    if errors:
        store.write_text(f"{run_key}/stage-errors.txt", "".join(errors))
    try:
        snapshot_zookeeper(discovered["zookeeper"], store, f"{run_key}/zk.jsonl")
    except Exception as e:  # detection runs without the cross-source rules
        store.write_text(f"{run_key}/zk-error.txt", f"{type(e).__name__}: {e}\n")
    facts = write_broker_facts(discovered, store, run_key)
    conf = settings.detect_conf(LOCAL_SPARK_CONF)
    cmd = spark_submit_cmd(DETECT_APP, master, conf, detect_args(settings, run_id, facts), jars=settings.spark_jars)
    # the store's settings (AWS_*) as the settings were read, for Spark as for the tasks
    env = {**spark_env(), **{k: v for k, v in (settings.environ or {}).items() if k.startswith("AWS_")}}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"detection failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return publish(settings, run_id, discovered, facts)
