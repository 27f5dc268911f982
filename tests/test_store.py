"""The audit's data store on a local directory and on S3 (a real S3 HTTP server on 127.0.0.1), and the audit's
publish step on S3: atomic writes, missing and broken objects named in the error, history across runs."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from pyarrow import fs

from fleet_doctor import layout, spark
from fleet_doctor.audit import history
from fleet_doctor.repair import tasks
from fleet_doctor.repair.errors import RepairError
from fleet_doctor.repair.session import repairs_dir
from fleet_doctor.settings import Settings
from fleet_doctor.store import Store, StoreError
from harness.findings import finding


@pytest.fixture(params=["local", "s3"])
def store_env(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, str]]:
    if request.param == "local":
        return str(tmp_path / "data"), {}
    s3 = request.getfixturevalue("s3")
    return s3.url(f"tests/{request.node.name}"), s3.env()


def _raw_names(store: Store, key: str) -> list[str]:
    """Every entry under key as the filesystem lists it (hidden temporary objects included)."""
    sel = fs.FileSelector(store._path(key), recursive=True, allow_not_found=True)
    return sorted(i.path.rsplit("/", 1)[-1] for i in store.fs.get_file_info(sel) if i.type == fs.FileType.File)


def test_round_trip_and_missing_objects(store_env: tuple[str, dict[str, str]]) -> None:
    root, env = store_env
    store = Store(root, env)
    assert store.list("") == [] and store.read_bytes("a/b.json") is None and store.read_jsonl("x.jsonl") == []
    store.write_jsonl("staging/run 1/zk.jsonl", [{"kind": "cluster", "id": "é"}])
    store.write_bytes("staging/run 1/probe/broker_id=1/probe.jsonl.gz", gzip.compress(b'{"kind":"probe"}\n'))
    assert store.list("staging/run 1") == ["probe", "zk.jsonl"]
    assert store.read_jsonl("staging/run 1/zk.jsonl") == [{"kind": "cluster", "id": "é"}]
    assert store.read_jsonl("staging/run 1/probe/broker_id=1/probe.jsonl.gz") == [{"kind": "probe"}]
    assert store.is_file("staging/run 1/zk.jsonl") and not store.is_file("staging/run 1")
    store.write_text("staging/run 1/zk.jsonl", "")  # overwrite
    assert store.read_jsonl("staging/run 1/zk.jsonl") == []
    store.delete("staging/run 1/zk.jsonl")
    store.delete("staging/run 1/zk.jsonl")  # nothing there: no error
    assert not store.is_file("staging/run 1/zk.jsonl") and store.read_bytes("staging/run 1/zk.jsonl") is None
    assert store.url("findings") == f"{root if '://' in root else Path(root).resolve()}/findings"


def test_the_size_of_a_staged_input_is_told_on_every_store(store_env: tuple[str, dict[str, str]]) -> None:
    """What the detection's settings are chosen by (``spark.input_conf``): the bytes under a prefix, temporary
    objects left out, from one listing; nothing there is None, not 0."""
    root, env = store_env
    store = Store(root, env)
    store.write_bytes("run/probe/broker_id=1/logdir-0.jsonl", b"x" * 1000)
    store.write_bytes("run/probe/broker_id=2/logdir-0.jsonl", b"x" * 300)
    with store.fs.open_output_stream(store._path("run/probe/broker_id=2/.logdir-1.jsonl.tmp")) as f:
        f.write(b"x" * 5000)  # a writer's temporary object: not staged input
    assert store.size("run/probe") == 1300 and store.size("run/probe/broker_id=2/logdir-0.jsonl") == 300
    assert store.size("run/nothing") is None
    url = store.url("run/probe")
    assert spark.staged_bytes(url, env) == 1300 and spark.staged_bytes(store.url("run/nothing"), env) is None
    args = spark.detect_args(url, url, "/out", "run", "/s.json", "/f.jsonl", None)
    assert spark.input_conf(args, env) == spark.SMALL_INPUT_CONF


def test_a_failed_write_leaves_nothing_behind(store_env: tuple[str, dict[str, str]]) -> None:
    root, env = store_env
    store = Store(root, env)
    store.write_text("reports/r.html", "old")
    with pytest.raises(KeyError), store.writer("reports/r.html") as out:
        out.write(b"half of the new report")
        raise KeyError("the probe died")
    with pytest.raises(KeyError), store.writer("reports/new.html") as out:
        out.write(b"half")
        raise KeyError("the probe died")
    assert store.read_text("reports/r.html") == "old"
    assert _raw_names(store, "reports") == ["r.html"], "a temporary object was left behind"


def test_broken_objects_and_bad_keys_are_named(store_env: tuple[str, dict[str, str]]) -> None:
    root, env = store_env
    store = Store(root, env)
    store.write_bytes("staging/r/probe/broker_id=2/probe.jsonl.gz", b"\x1f\x8b not really gzip")
    with pytest.raises(StoreError, match=r"broker_id=2/probe\.jsonl\.gz: not JSON Lines"):
        store.read_jsonl("staging/r/probe/broker_id=2/probe.jsonl.gz")
    store.write_text(layout.HISTORY_RUNS, '{"audit_run": "a"}\n\n{"audit_run": ')
    with pytest.raises(StoreError, match=r"history/runs\.jsonl: not JSON Lines \(line 3\)"):
        store.read_jsonl(layout.HISTORY_RUNS)
    store.write_bytes("history/bad.jsonl", b'{"a": "\xff"}\n')
    with pytest.raises(StoreError, match=r"history/bad\.jsonl: not JSON Lines \(line 1\)"):
        store.read_jsonl("history/bad.jsonl")
    with pytest.raises(StoreError, match=r"'\.\.' is not allowed"):
        store.read_bytes("history/../../etc/passwd")


def test_unsupported_and_unreachable_stores_are_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="ftp://x/y: unsupported store"):
        Store("ftp://x/y")
    with pytest.raises(StoreError, match="no bucket"):
        Store("s3a:///prefix")
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        "AWS_ACCESS_KEY_ID": "a",
        "AWS_SECRET_ACCESS_KEY": "b",
        "FLEET_DOCTOR_S3_ENDPOINT": f"http://127.0.0.1:{port}",
    }
    with pytest.raises(StoreError, match=r"s3a://bucket/p/history/runs\.jsonl: open failed"):
        Store("s3a://bucket/p", env).read_jsonl(layout.HISTORY_RUNS)


def test_spark_settings_point_s3a_at_the_endpoint() -> None:
    env = {
        "FLEET_DOCTOR_S3_ENDPOINT": "https://minio.internal:9000",
        "AWS_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLEKEYID",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMIexamplesecret",
    }
    conf = Store("s3://bucket/fd", env).spark_conf()
    assert conf == {
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1",
        "spark.hadoop.fs.s3a.endpoint": "https://minio.internal:9000",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "true",
    }
    assert Store("s3://bucket/fd", env).url("findings") == "s3a://bucket/fd/findings"  # what Spark reads
    assert Store("s3a://bucket/fd", {}).spark_conf() == {}  # AWS itself: S3A finds the bucket's region
    # credentials reach Spark through its environment, never a setting on its command line
    assert not any(v in (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) for v in conf.values())
    with pytest.raises(ValueError, match="no credentials here"):
        Settings.from_env({"FLEET_DOCTOR_SPARK_CONF": '{"spark.hadoop.fs.s3a.secret.key": "x"}'})
    with pytest.raises(StoreError, match="no credentials in the store URL"):
        Store("s3a://AKIA:secret@bucket/fd", {})
    assert "secret" not in repr(Settings.from_env({"FLEET_DOCTOR_DATA": "s3a://b/p", **env}))


def test_store_urls_need_no_connection() -> None:
    """Building URLs (the DAG file does it at every parse) opens nothing: a host that does not resolve is fine."""
    s = Store("hdfs://namenode.invalid:8020/fleet", {})
    assert s.url("findings") == "hdfs://namenode.invalid:8020/fleet/findings"
    assert Store("hdfs://nn:8020/", {}).url("history") == "hdfs://nn:8020/history"
    assert Store("file:///var/lib/fd", {}).url("x") == "/var/lib/fd/x"
    with pytest.raises(StoreError, match=r"namenode\.invalid.*cannot open HDFS"):
        s.read_jsonl(layout.HISTORY_RUNS)


def test_a_missing_bucket_is_named(s3: Any) -> None:
    with pytest.raises(StoreError, match="bucket 'no-such-bucket' does not exist"):
        Store("s3a://no-such-bucket/fd", s3.env()).check()
    Store(s3.url("fd"), s3.env()).check()


def test_concurrent_writers_of_one_key_never_mix(store_env: tuple[str, dict[str, str]]) -> None:
    """Two attempts of one stage task (a retry beside a zombie, on workers with the same pid) write one key."""
    root, env = store_env
    store = Store(root, env)
    a, b = b"a" * 300_000 + b"\n", b"b" * 300_000 + b"\n"
    with store.writer("staging/r/probe/broker_id=1/probe.jsonl.gz") as w1:
        w1.write(a[:1000])
        with store.writer("staging/r/probe/broker_id=1/probe.jsonl.gz") as w2:
            w2.write(b)
        w1.write(a[1000:])
    assert store.read_bytes("staging/r/probe/broker_id=1/probe.jsonl.gz") in (a, b)
    assert _raw_names(store, "staging") == ["probe.jsonl.gz"], "a temporary object was left behind"


def test_a_remote_store_needs_a_repair_dir() -> None:
    settings = Settings.from_env({"FLEET_DOCTOR_DATA": "s3a://bucket/fd"})
    with pytest.raises(RepairError, match="FLEET_DOCTOR_REPAIR_DIR"):
        repairs_dir(settings)
    local = Settings.from_env({"FLEET_DOCTOR_DATA": "/srv/fd"})
    assert repairs_dir(local).root == Path("/srv/fd/repairs")


def test_publish_keeps_the_history_in_the_store(store_env: tuple[str, dict[str, str]]) -> None:
    root, env = store_env  # only in the mapping the settings are read from, not in this process's environment
    settings = Settings.from_env({"FLEET_DOCTOR_DATA": root, **env})
    store = settings.store
    discovered = {"cluster": "c1", "only_in_inventory": [], "only_in_zookeeper": [], "zookeeper_error": None}
    a, b = finding("index-orphan", 1, "/a"), finding("log-crc", 2, "/b")
    summaries = []
    for run, found in (("scheduled__1", [a, b]), ("scheduled__2", [a])):
        key = layout.staging(run).key
        store.write_jsonl(f"{key}/findings.jsonl", found)
        store.write_text(f"{key}/summary.json", json.dumps({"rules_skipped": {}}))
        summaries.append(history.publish(settings, run, discovered, {"audited": [1, 2], "not_audited": []}))
    assert summaries[1]["by_status"] == {"new": 0, "persisting": 1, "resolved": 1, "unverified": 0}
    assert summaries[1]["report"] == store.url("reports/scheduled__2.html")
    assert "index-orphan" in (store.read_text("reports/scheduled__2.html") or "")
    assert [r["audit_run"] for r in store.read_jsonl(layout.HISTORY_RUNS)] == ["scheduled__1", "scheduled__2"]
    from fleet_lab import demo

    assert demo.latest_summary(root, env, cluster=None)["audit_run"] == "scheduled__2"
    assert tasks.latest_audit_run(settings) == "scheduled__2"
