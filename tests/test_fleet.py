"""A fleet of clusters in one deployment (docs/fleet.md): each cluster's store kept apart under ``clusters/<cluster>/``
(the data root's own single-cluster store read in place), its settings, repairs dir and inventory; the nightly
audits spread over a window; alerts naming the cluster, with its own notifiers; the Kafka fleet view's overview,
worst first, with stale audits and the inventories that give no cluster. Run against real stores (a local directory;
the S3 layout in test_console and test_audit_s3) and the real publisher."""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from fleet_doctor import layout, lock_state, roll_status
from fleet_doctor.audit import alerts, history
from fleet_doctor.audit.summary import RunSummary
from fleet_doctor.console.app import create_app
from fleet_doctor.console.data import is_stale
from fleet_doctor.fleet_dags import cron_of, fair_share, fleet_clusters, spread
from fleet_doctor.inventory import InventoryError
from fleet_doctor.lock_state import LockState
from fleet_doctor.roll_status import BLOCKED, MIN_ISR, Blocked, RollStatus
from fleet_doctor.settings import Settings
from fleet_doctor.store import Store
from harness import inventories
from harness.corpus import REPO
from harness.findings import finding


def fleet_of(tmp_path: Path, *clusters: dict[str, Any], **env: str) -> Settings:
    inv = inventories.fleet_dir(tmp_path / "inventories", *clusters)
    return Settings.from_env({"FLEET_DOCTOR_INVENTORY": str(inv), "FLEET_DOCTOR_DATA": str(tmp_path / "data"), **env})


def publish(
    settings: Settings, run: str, rows: list[dict[str, Any]], cluster: str, not_audited: list[int] = ()
) -> dict:
    """One audit run published by the real publisher into ``settings``' store."""
    area = layout.staging(run)
    settings.store.write_jsonl(area.findings_json, rows)
    settings.store.write_text(area.summary, json.dumps({"rules_skipped": {}}))
    discovered = {"cluster": cluster, "only_in_inventory": [], "only_in_zookeeper": []}
    audited = [b for b in (1, 2, 3) if b not in not_audited]
    return history.publish(settings, run, discovered, {"audited": audited, "not_audited": list(not_audited)})


CRITICAL = {**finding("topic-id-mismatch", 1, "/k/orders-0/partition.metadata", "critical")}
WARNING = {**finding("index-untrimmed", 2, "/k/orders-0/00000000000000000000.index", "warning")}


# ---- the store
def test_each_cluster_has_its_own_store_and_repairs(tmp_path: Path) -> None:
    s = fleet_of(tmp_path, inventories.inventory("prod-eu"), inventories.inventory("prod-us"))
    eu, us = s.for_cluster("prod-eu"), s.for_cluster("prod-us")
    assert eu.store.root == str(tmp_path / "data" / "clusters" / "prod-eu")
    assert us.store.root == str(tmp_path / "data" / "clusters" / "prod-us")
    assert eu.repairs == tmp_path / "data" / "clusters" / "prod-eu" / "repairs"
    publish(eu, "scheduled__1", [CRITICAL], "prod-eu")
    publish(us, "scheduled__1", [], "prod-us")
    assert [r["cluster"] for r in eu.store.read_jsonl(layout.HISTORY_RUNS)] == ["prod-eu"]  # the row names it
    assert us.store.read_jsonl(layout.history_findings("scheduled__1")) == []  # not the other's findings
    assert not (tmp_path / "data" / "history").exists()  # nothing at the root
    # the findings Asset's URI is made without reading the store (the DAG files make it when they are parsed);
    # a remote store's repairs go to FLEET_DOCTOR_REPAIR_DIR, each cluster apart there too (test_audit_s3)
    remote = Settings.from_env({"FLEET_DOCTOR_DATA": "s3a://bucket/fd"})
    assert remote.for_cluster("prod-eu").findings_asset_uri() == "s3://bucket/fd/clusters/prod-eu/findings"


def test_a_single_cluster_store_at_the_root_is_read_in_place_by_its_cluster(tmp_path: Path) -> None:
    """A store written before there were fleets: its runs, findings and repairs at the data root. Its cluster keeps
    reading and writing them there (the history goes on: a finding of the old run persists); any other cluster of
    the fleet gets clusters/<name>/."""
    s = fleet_of(tmp_path, inventories.inventory("prod-eu"), inventories.inventory("prod-us"))
    root = Store(tmp_path / "data")
    old = publish(s, "scheduled__1", [CRITICAL], "prod-eu")  # settings of no cluster: the data root itself
    assert root.is_file(layout.HISTORY_RUNS) and old["cluster"] == "prod-eu"
    # rows written before they named the cluster: the run's summary says which
    rows = root.read_jsonl(layout.HISTORY_RUNS)
    root.write_jsonl(layout.HISTORY_RUNS, [{k: v for k, v in r.items() if k != "cluster"} for r in rows])
    assert layout.root_cluster(root) == "prod-eu"
    # a newer row whose summary was never written (its publication cut short) does not hide whose store it is
    root.write_jsonl(layout.HISTORY_RUNS, [*root.read_jsonl(layout.HISTORY_RUNS), {"audit_run": "scheduled__0"}])
    assert layout.root_cluster(root) == "prod-eu"
    root.write_jsonl(layout.HISTORY_RUNS, root.read_jsonl(layout.HISTORY_RUNS)[:-1])

    eu, us = s.for_cluster("prod-eu"), s.for_cluster("prod-us")
    assert eu.store.root == root.root and eu.repairs == tmp_path / "data" / "repairs"
    assert us.store.root == f"{root.root}/clusters/prod-us"
    new = publish(eu, "scheduled__2", [CRITICAL], "prod-eu")
    assert new["previous_run"] == "scheduled__1" and new["by_status"]["persisting"] == 1
    assert [r["audit_run"] for r in root.read_jsonl(layout.HISTORY_RUNS)] == ["scheduled__1", "scheduled__2"]
    # once moved under clusters/<name>/ (docs/audit.md "Data store"), the cluster reads it there
    (tmp_path / "data" / "clusters" / "prod-eu").mkdir(parents=True)
    for name in ("history", "reports", "staging", "findings", "repairs"):
        if (tmp_path / "data" / name).exists():
            (tmp_path / "data" / name).rename(tmp_path / "data" / "clusters" / "prod-eu" / name)
    moved = s.for_cluster("prod-eu")
    assert moved.store.root == f"{root.root}/clusters/prod-eu"
    assert moved.store.read_jsonl(layout.HISTORY_RUNS)[-1]["audit_run"] == "scheduled__2"


def test_a_cluster_name_is_short_enough_for_its_dags(tmp_path: Path) -> None:
    """The DAGs' tag cluster:<name> may have 100 characters: a longer name is its file's problem, never an import
    error that takes every cluster's DAGs with it."""
    inventories.write(tmp_path / "long.json", inventories.inventory("x" * 65))
    with pytest.raises(InventoryError, match="at most 64 characters"):
        Settings.from_env({"FLEET_DOCTOR_INVENTORY": str(tmp_path / "long.json")}).load_inventory()
    s = fleet_of(tmp_path / "f", inventories.inventory("x" * 64), inventories.inventory("y" * 65))
    assert [c.cluster for c in fleet_clusters(s).clusters] == ["x" * 64]


def test_a_cluster_name_never_leaves_its_place_in_the_store(tmp_path: Path) -> None:
    for bad in ("..", ".hidden", "a/b", ""):
        with pytest.raises(ValueError):
            layout.cluster_root(bad)
    for bad in ("..", ".", ".hidden"):
        inventories.write(tmp_path / "x.json", inventories.inventory(bad))
        with pytest.raises(InventoryError, match=r"must match .*, not start with '\.'"):
            Settings.from_env({"FLEET_DOCTOR_INVENTORY": str(tmp_path / "x.json")}).load_inventory()


# ---- the settings of one cluster
def test_a_cluster_reads_its_own_inventory_and_a_broken_one_says_why(tmp_path: Path) -> None:
    s = fleet_of(tmp_path, inventories.inventory("prod-eu", brokers=3), inventories.inventory("k", kraft=True))
    assert s.for_cluster("k").load_inventory().kraft and len(s.for_cluster("prod-eu").load_inventory().brokers) == 3
    with pytest.raises(InventoryError, match="2 clusters: name the one meant"):
        s.load_inventory()
    inventories.write(tmp_path / "inventories" / "broken.json", "{")
    with pytest.raises(InventoryError, match=r"no usable inventory of cluster 'gone'.*broken.json: not JSON"):
        s.for_cluster("gone").load_inventory()
    assert s.for_cluster("k").load_inventory().cluster == "k"  # the broken file hides no other cluster


# ---- the schedules
@pytest.mark.parametrize(
    "schedule,index,count,window,expected",
    [
        ("0 2 * * *", 0, 3, 120, "0 2 * * *"),
        ("0 2 * * *", 1, 3, 120, "40 2 * * *"),
        ("0 2 * * *", 2, 3, 120, "20 3 * * *"),
        ("@daily", 1, 2, 120, "0 1 * * *"),
        ("30 23 * * *", 1, 2, 120, "30 0 * * *"),  # past midnight: every day, so the same day's early hours
        ("30 23 * * 1-5", 1, 2, 120, "59 23 * * 1-5"),  # weekdays only: it stops at 23:59, the day stays true
        ("0 */4 * * *", 1, 2, 120, "0 */4 * * *"),  # several hours a day: kept
        ("0 2 * * *", 5, 6, 0, "0 2 * * *"),  # no window
    ],
)
def test_the_fleets_schedule_is_spread_over_the_window(
    schedule: str, index: int, count: int, window: int, expected: str
) -> None:
    assert spread(schedule, index, count, window) == expected


def test_an_inventory_schedule_is_checked_and_a_bad_one_is_a_problem_of_its_own(tmp_path: Path) -> None:
    assert cron_of("@weekly") == "0 0 * * 0"
    for bad in ("at two", "@sometimes", "0 2 * *", "61 2 * * *"):
        with pytest.raises(ValueError):
            cron_of(bad)
    s = fleet_of(tmp_path, inventories.inventory("a", schedule="15 1 * * *"), inventories.inventory("b", schedule="x"))
    fleet = fleet_clusters(s)
    assert [(c.cluster, c.schedule) for c in fleet.clusters] == [("a", "15 1 * * *")]
    (problem,) = fleet.problems
    assert problem.path.endswith("b.json") and "schedule" in problem.message and "'x'" in problem.message
    with pytest.raises(InventoryError, match="schedule must be"):
        inventories.write(tmp_path / "c.json", inventories.inventory("c", schedule=""))
        Settings.from_env({"FLEET_DOCTOR_INVENTORY": str(tmp_path / "c.json")}).load_inventory()


def test_each_cluster_stages_at_most_its_share_of_the_one_pool() -> None:
    assert [fair_share(32, n) for n in (1, 2, 3, 8, 16, 50, 500)] == [32, 32, 21, 8, 4, 4, 4]
    assert fair_share(2, 50) == 2  # never more than the pool


def test_a_cluster_may_set_its_share(tmp_path: Path) -> None:
    s = fleet_of(tmp_path, inventories.inventory("a"), FLEET_DOCTOR_AUDIT_CLUSTER_SLOTS="6")
    assert fleet_clusters(s).clusters[0].stage_slots == 6


# ---- alerts
def test_an_alert_names_the_cluster_and_goes_to_its_own_notifiers_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sent = tmp_path / "sent.jsonl"
    mine = [{"class": "harness.notify.FileNotifier", "kwargs": {"path": str(sent), "text": "prod-eu: {message}"}}]
    fleet = [{"class": "harness.notify.FileNotifier", "kwargs": {"path": str(sent), "text": "fleet: {report}"}}]
    s = fleet_of(
        tmp_path,
        inventories.inventory("prod-eu", notifiers=mine),
        inventories.inventory("prod-us"),
        FLEET_DOCTOR_NOTIFIERS=json.dumps(fleet),
        FLEET_DOCTOR_REPORT_BASE_URL="https://reports.example/{cluster}/",
    ).for_cluster("prod-eu")
    summary = publish(s, "scheduled__1", [CRITICAL], "prod-eu")
    with caplog.at_level(logging.WARNING):
        message = alerts.send_alert(s, summary)
    assert message and message.startswith("Kafka Fleet Doctor, cluster prod-eu, audit scheduled__1:")
    lines = [json.loads(line)["text"] for line in sent.read_text().splitlines()]
    assert lines == ["fleet: https://reports.example/prod-eu/scheduled__1.html", f"prod-eu: {message}"]
    # the other cluster has no notifiers of its own: only the fleet's
    us = s.for_cluster("prod-us")
    sent.unlink()
    alerts.send_alert(us, publish(us, "scheduled__1", [CRITICAL], "prod-us"))
    assert [json.loads(line)["text"] for line in sent.read_text().splitlines()] == [
        "fleet: https://reports.example/prod-us/scheduled__1.html"
    ]
    assert alerts.report_url(RunSummary.from_dict(summary)) == summary["report"]


def test_an_inventory_may_name_airflow_notifiers_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An inventory is edited by more people than the deployment: a class it names that is not an Airflow notifier
    is never built (the workers that would build it hold every broker's SSH key); the fleet's notifiers still run."""
    built, sent = tmp_path / "built", tmp_path / "sent.jsonl"
    hostile = [{"class": "harness.notify.NotANotifier", "kwargs": {"path": str(built)}}]
    fleet = [{"class": "harness.notify.FileNotifier", "kwargs": {"path": str(sent), "text": "{message}"}}]
    s = fleet_of(
        tmp_path, inventories.inventory("prod-eu", notifiers=hostile), FLEET_DOCTOR_NOTIFIERS=json.dumps(fleet)
    ).for_cluster("prod-eu")
    with caplog.at_level(logging.ERROR):
        assert alerts.send_alert(s, publish(s, "scheduled__1", [CRITICAL], "prod-eu"))
    assert not built.exists()
    assert "harness.notify.NotANotifier is not an Airflow notifier (BaseNotifier): not used" in caplog.text
    assert len(sent.read_text().splitlines()) == 1


# ---- the overview
def overview(s: Settings) -> str:
    r = TestClient(create_app(lambda: s)).get("/")
    assert r.status_code == 200, r.text[:500]
    return r.text


def rows_of(text: str) -> list[tuple[str, str]]:
    import re

    return re.findall(r"data-testid='cluster-row' data-cluster='([^']+)' data-state='([^']+)'", text)


def test_the_overview_lists_every_cluster_worst_first(tmp_path: Path) -> None:
    zk = [inventories.inventory(n, brokers=3) for n in ("calm", "critical", "warned", "fresh", "unreached")]
    s = fleet_of(tmp_path, *zk, inventories.inventory("k", brokers=3, kraft=True))
    inventories.write(tmp_path / "inventories" / "broken.json", {"cluster": "x"})
    publish(s.for_cluster("calm"), "scheduled__1", [], "calm")
    publish(s.for_cluster("critical"), "scheduled__1", [CRITICAL, WARNING], "critical")
    publish(s.for_cluster("warned"), "scheduled__1", [WARNING], "warned")
    publish(s.for_cluster("unreached"), "scheduled__1", [], "unreached", not_audited=[2])
    publish(s.for_cluster("k"), "scheduled__1", [WARNING, WARNING | {"path": "/k/o-1/0.index"}], "k")
    text = overview(s)
    shown = rows_of(text)
    # critical first, then by warnings (k has two), then brokers not audited; the ones never audited are stale
    assert [c for c, _ in shown] == ["critical", "k", "warned", "unreached", "fresh", "calm"]
    assert dict(shown)["fresh"] == "stale" and dict(shown)["calm"] == "ok"
    assert "broken.json" in text and "inventory-problem" in text  # the file that gives no cluster, said
    # to someone who may read only some clusters: how many files are broken, not which or why (another team's)
    r = TestClient(create_app(lambda: s, readable=lambda: lambda dag_id: dag_id.endswith("__calm"))).get("/")
    assert r.status_code == 200 and rows_of(r.text) == [("calm", "ok")]
    assert "broken.json" not in r.text and "1 inventory file(s) of the fleet give no cluster" in r.text
    missing = TestClient(create_app(lambda: s)).get("/clusters/elsewhere/")
    assert missing.status_code == 404 and "inventories" not in missing.text  # no host path in the answer
    assert "kraft" in text and "3.9.0" in text
    assert "href='clusters/critical/'" in text


def lock_cells(text: str) -> dict[str, str]:
    """cluster -> the state its row's repair-lock cell shows."""
    import re

    rows = re.findall(r"<tr data-testid='cluster-row' data-cluster='([^']+)'.*?</tr>", text)
    cells = re.findall(r"<tr data-testid='cluster-row'.*?data-testid='repair-lock' data-state='([^']+)'", text)
    return dict(zip(rows, cells, strict=True))


HALTED = {"plan_hash": "b" * 64, "step": "brokers", "run_id": "manual__1", "since": 1_790_000_000, "cluster": "held"}


def test_the_overview_and_a_clusters_page_show_the_repair_lock(tmp_path: Path) -> None:
    """As the repair or the audit last saw it (``lock_state``): a lock left for a person ranks its cluster above a
    calm one; one never seen says so, a KRaft cluster has none; a mirror that is not JSON is named, one whose numbers
    are absurd is ignored, the rest of the row still shown; a cluster whose history cannot be read still shows it."""
    names = ("calm", "held", "executing", "never", "garbled", "absurd", "nan", "no-history")
    s = fleet_of(
        tmp_path,
        *(inventories.inventory(n, brokers=3) for n in names),
        inventories.inventory("k", brokers=3, kraft=True),
    )
    for n in (*names, "k"):
        publish(s.for_cluster(n), "scheduled__1", [], n)
    now = 1_790_000_100.0
    lock_state.record(s.for_cluster("calm").store, LockState(False, now, "audit"))
    lock_state.record(s.for_cluster("held").store, LockState(True, now, "repair", HALTED, False, "files changed"))
    lock_state.record(s.for_cluster("executing").store, LockState(True, now, "repair", HALTED, True))
    s.for_cluster("garbled").store.write_text(layout.REPAIR_LOCK, "{not json")
    s.for_cluster("absurd").store.write_text(layout.REPAIR_LOCK, json.dumps({"held": False, "observed_at": 1e300}))
    s.for_cluster("nan").store.write_text(layout.REPAIR_LOCK, '{"held": true, "observed_at": NaN}')
    no_history = s.for_cluster("no-history").store
    lock_state.record(no_history, LockState(True, now, "repair", HALTED, False))
    no_history.write_text(layout.HISTORY_RUNS, "{torn\n")
    text = overview(s)
    assert lock_cells(text) == {
        "no-history": "needs-human",  # its row says the store cannot be read, and still what holds the lock
        "calm": "free",
        "held": "needs-human",
        "executing": "held",
        "never": "unknown",
        "garbled": "unreadable",
        "absurd": "unknown",
        "nan": "unknown",
        "k": "unknown",  # a KRaft cluster whose lock no repair or audit has seen yet
    }
    assert dict(rows_of(text))["no-history"] == "unreadable"
    assert rows_of(text)[1][0] == "held"  # after the unreadable one, the only row worse than the calm ones
    assert "held by run manual__1 (plan bbbbbbbbbbbb, step brokers, since 2026-09-21T" in text
    assert "kept: files changed" in text and "repair-lock.json" in text
    page = TestClient(create_app(lambda: s)).get("/clusters/held/")
    assert page.status_code == 200 and "data-testid='repair-lock' data-state='needs-human'" in page.text
    assert TestClient(create_app(lambda: s)).get("/clusters/absurd/").status_code == 200


def test_a_clusters_page_says_why_its_roll_is_blocked_and_who_holds_or_skips_a_broker(tmp_path: Path) -> None:
    """The roll as its worker last wrote it (``roll_status``): the gate, what holds it and since when on the cluster's
    page, a mark in the overview's lock cell; the operator's holds and skips (set by ``bin/fleet-doctor
    roll-control``, the command line a platform team scripts) with who and why; a damaged status is named."""
    import os
    import subprocess

    s = fleet_of(tmp_path, inventories.inventory("blocked", brokers=3), inventories.inventory("garbled", brokers=3))
    for n in ("blocked", "garbled"):
        publish(s.for_cluster(n), "scheduled__1", [], n)
    since = dt.datetime.now(dt.UTC).timestamp() - 600
    gate = Blocked(MIN_ISR, "stopping broker 2 would take below min ISR", ("orders-3 (ISR [2, 3], min ISR 2)",), since)
    roll_status.record_status(
        s.for_cluster("blocked").store,
        RollStatus("manual__7", "c" * 64, BLOCKED, since + 590, 2, 3, (2,), "waiting for its gates", (1,), (), gate),
    )
    s.for_cluster("garbled").store.write_text(layout.ROLL_CONTROL, '{"hold": {"2": {"by": "x", "at": "soon"}}}')
    bad = {"run_id": "r", "plan_hash": "d" * 64, "state": "blocked", "updated_at": float("nan")}
    s.for_cluster("garbled").store.write_text(layout.ROLL_STATUS, json.dumps(bad))  # NaN: ignored, logged
    env = {**os.environ, "FLEET_DOCTOR_INVENTORY": str(s.inventory), "FLEET_DOCTOR_DATA": str(s.data_root)}
    cli = [str(REPO / "bin" / "fleet-doctor"), "roll-control", "blocked"]
    done = subprocess.run([*cli, "hold", "3", "--by", "alice", "--why", "disk swap"], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert subprocess.run([*cli, "skip", "1", "--by", "bob"], env=env, capture_output=True).returncode == 0
    unknown = subprocess.run([*cli, "hold", "9"], env=env, capture_output=True, text=True)
    assert unknown.returncode == 2 and "broker 9 is not in cluster blocked's inventory" in unknown.stderr
    shown = json.loads(subprocess.run([*cli, "show", "--format", "json"], env=env, capture_output=True).stdout)
    assert shown["hold"]["3"]["by"] == "alice" and shown["skip"]["1"]["by"] == "bob"
    assert shown["roll"]["blocked"]["gate"] == MIN_ISR
    text = subprocess.run([*cli, "show"], env=env, capture_output=True, text=True).stdout
    assert "broker 3: held by alice at" in text and "roll: step 2 of 3 (broker 2) blocked: min-isr since" in text

    page = TestClient(create_app(lambda: s)).get("/clusters/blocked/").text
    assert "data-testid='roll' data-state='blocked' data-gate='min-isr'" in page
    assert "Blocked at gate <b>min-isr</b> for 10 min" in page and "orders-3 (ISR [2, 3], min ISR 2)" in page
    assert "broker 3: held by alice at" in page and "disk swap" in page and "broker 1: skipped by bob" in page
    assert "roll-control blocked release BROKER" in page and "kafka_fleet_roll__blocked" in page
    assert "roll blocked at min-isr" in overview(s)
    garbled = TestClient(create_app(lambda: s)).get("/clusters/garbled/")
    assert garbled.status_code == 200 and "data-testid='roll-error'" in garbled.text
    assert "roll-control.json: not a roll control (hold of broker 2: not a time: &#x27;soon&#x27;)" in garbled.text
    broken = subprocess.run(
        [str(REPO / "bin" / "fleet-doctor"), "roll-control", "garbled", "show"], env=env, text=True, capture_output=True
    )
    assert broken.returncode == 2 and "not a roll control" in broken.stderr and "fix or delete it" in broken.stderr
    assert subprocess.run([*cli, "release", "3"], env=env, capture_output=True).returncode == 0
    assert roll_status.read_control(s.for_cluster("blocked").store).hold == {}


T0 = 1_790_000_000.0


def test_the_lock_mirror_keeps_the_newest_state_by_zookeepers_order_and_the_reason_it_was_kept(tmp_path: Path) -> None:
    store = Store(tmp_path)
    kept = LockState(True, T0 + 10, "repair", HALTED, False, "a broker was left stopped", zxid=100)
    lock_state.record(store, kept)
    # a read of an older zxid (a lagging server, a writer that lost the race) never replaces it, whatever its clock
    lock_state.record(store, LockState(True, T0 + 99, "audit", HALTED, True, zxid=90))
    assert lock_state.read(store) == kept
    # the same holder seen later, still without a worker: the reason stays
    lock_state.record(store, LockState(True, T0 + 20, "audit", HALTED, False, zxid=100))
    assert lock_state.read(store) == LockState(True, T0 + 20, "audit", HALTED, False, kept.kept, zxid=100)
    # resumed (the same run): executing, and the old reason goes with the halt it was about
    lock_state.record(store, LockState(True, T0 + 30, "repair", HALTED, True, zxid=120))
    lock_state.record(store, LockState(True, T0 + 40, "audit", HALTED, False, zxid=121))  # its worker killed
    assert lock_state.read(store).kept is None  # type: ignore[union-attr]
    other = LockState(True, T0 + 50, "audit", {**HALTED, "run_id": "manual__2"}, False, zxid=130)
    lock_state.record(store, other)
    assert lock_state.read(store) == other  # another holder: no reason of the old one
    # without zxids (a mirror written before them): the observers' clocks
    lock_state.record(store, LockState(False, T0 + 60, "audit"))
    plain = Store(tmp_path / "plain")
    lock_state.record(plain, LockState(False, T0 + 60, "audit"))
    lock_state.record(plain, LockState(True, T0 + 1, "audit", HALTED, True))
    assert lock_state.read(plain) == LockState(False, T0 + 60, "audit")
    for junk in (
        [],
        {"held": "yes", "observed_at": T0},
        {"held": True},
        {"held": True, "observed_at": "x"},
        {"held": True, "observed_at": 5.0},
        {"held": True, "observed_at": T0, "zxid": "7"},
    ):
        assert LockState.from_json(junk) is None
    assert "since" not in LockState(True, T0, "audit", {**HALTED, "since": float("inf")}).describe()
    store.write_text(layout.REPAIR_LOCK, json.dumps({"held": 1}))
    assert lock_state.read(store) is None  # not a state: none, logged
    (tmp_path / "a-file").write_text("x")
    lock_state.record(Store(tmp_path / "a-file"), kept)  # cannot be written (its root is a file): logged, no raise


def test_an_audit_older_than_its_schedule_allows_is_stale() -> None:
    now = dt.datetime(2026, 11, 29, 5, 0, tzinfo=dt.UTC)
    assert not is_stale("0 2 * * *", "2026-11-29T02:20:00Z", now)
    assert is_stale("0 2 * * *", "2026-11-28T02:20:00Z", now)  # last night's is missing
    assert not is_stale("0 4 * * *", "2026-11-28T04:20:00Z", now)  # tonight's may still be running (2 h grace)
    assert is_stale("0 2 * * *", None, now) and not is_stale(None, None, now)


def test_the_overview_reads_a_single_cluster_store_in_place(tmp_path: Path) -> None:
    s = fleet_of(tmp_path, inventories.inventory("prod-eu"), inventories.inventory("prod-us"))
    publish(s, "scheduled__1", [CRITICAL], "prod-eu")  # at the data root, as before fleets
    shown = dict(rows_of(overview(s)))
    assert shown["prod-eu"] in ("ok", "stale") and shown["prod-us"] == "stale"
    page = TestClient(create_app(lambda: s)).get("/clusters/prod-eu/").text
    assert "data-testid='finding-group'" in page


def test_old_links_reach_the_one_cluster_and_say_so_with_more(tmp_path: Path) -> None:
    one = fleet_of(tmp_path / "one", inventories.inventory("prod-eu"))
    c = TestClient(create_app(lambda: one), follow_redirects=False)
    r = c.get("/repair?rule=index-untrimmed&broker=1")
    assert r.status_code == 307 and r.headers["location"] == "clusters/prod-eu/repair?rule=index-untrimmed&broker=1"
    assert c.get("/reports/r1.html").headers["location"] == "../clusters/prod-eu/reports/r1.html"
    # followed as a browser follows them (relative to the old page), they reach the cluster's pages
    publish(one.for_cluster("prod-eu"), "scheduled__1", [CRITICAL], "prod-eu")
    follow = TestClient(create_app(lambda: one))
    assert follow.get("/reports/scheduled__1.html").url.path == "/clusters/prod-eu/reports/scheduled__1.html"
    assert follow.get("/reports/scheduled__1.html").status_code == 200
    assert follow.get("/repair?rule=x").url.path == "/clusters/prod-eu/repair"
    two = fleet_of(tmp_path / "two", inventories.inventory("a"), inventories.inventory("b"))
    r = TestClient(create_app(lambda: two)).get("/repair?rule=x")
    assert r.status_code == 404 and "clusters/<cluster>/" in r.json()["detail"]


# ---- the metrics
def scrape(s: Settings, **app: Any) -> dict[str, list[Any]]:
    """GET /metrics parsed by Prometheus' own parser: metric name -> its samples."""
    from prometheus_client.parser import text_string_to_metric_families

    r = TestClient(create_app(lambda: s, **app)).get("/metrics")
    assert r.status_code == 200, r.text[:500]
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = list(text_string_to_metric_families(r.text))
    assert all(f.type == "gauge" and f.documentation for f in families)
    return {f.name: f.samples for f in families}


def value(samples: list[Any], **labels: str) -> float:
    (found,) = [s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]
    return found


def test_the_metrics_say_per_cluster_what_the_overview_says(tmp_path: Path) -> None:
    s = fleet_of(
        tmp_path,
        inventories.inventory("prod-eu", brokers=3),
        inventories.inventory("k", brokers=3, kraft=True),
        inventories.inventory("never", brokers=4),
    )
    inventories.write(tmp_path / "inventories" / "broken.json", "{")
    eu = s.for_cluster("prod-eu")
    publish(eu, "scheduled__1", [CRITICAL], "prod-eu")
    summary = publish(eu, "scheduled__2", [CRITICAL, WARNING], "prod-eu", not_audited=[3])
    publish(s.for_cluster("k"), "scheduled__1", [WARNING], "k")
    m = scrape(s, pending_approvals=lambda: {"prod-eu": 2})

    assert {x.labels["cluster"]: x.labels["metadata_mode"] for x in m["kafka_fleet_cluster_info"]} == {
        "prod-eu": "zookeeper",
        "k": "kraft",
        "never": "zookeeper",
    }
    findings = m["kafka_fleet_findings"]
    # prod-eu: the critical one persisting on broker 1, the warning new on broker 2; broker 3 not audited
    assert value(findings, cluster="prod-eu", rule="topic-id-mismatch", severity="critical", status="persisting") == 1
    assert value(findings, cluster="prod-eu", rule="index-untrimmed", severity="warning", status="new") == 1
    assert value(findings, cluster="k", severity="warning", status="new") == 1
    assert not [x for x in findings if x.labels["cluster"] == "never"]
    brokers = m["kafka_fleet_brokers"]
    assert value(brokers, cluster="prod-eu", state="inventory") == 3
    assert value(brokers, cluster="prod-eu", state="audited") == 2
    assert value(brokers, cluster="prod-eu", state="not_audited") == 1
    assert value(brokers, cluster="never", state="inventory") == 4
    assert not [x for x in brokers if x.labels["cluster"] == "never" and x.labels["state"] == "audited"]
    end = value(m["kafka_fleet_last_audit_end_timestamp_seconds"], cluster="prod-eu")
    assert dt.datetime.fromtimestamp(end, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") == summary["finished_at"]
    assert value(m["kafka_fleet_audit_stale"], cluster="never") == 1
    assert value(m["kafka_fleet_pending_approvals"], cluster="prod-eu") == 2
    assert value(m["kafka_fleet_pending_approvals"], cluster="k") == 0
    assert value(m["kafka_fleet_inventory_problems"]) == 1
    assert value(m["kafka_fleet_store_up"], cluster="k") == 1
    # the repair lock as last seen: no sample for a cluster whose lock was never seen
    assert not m["kafka_fleet_repair_lock_held"]
    lock_state.record(eu.store, LockState(True, T0, "repair", HALTED, False, "a broker left stopped"))
    lock_state.record(s.for_cluster("k").store, LockState(False, 1_790_000_001.0, "audit"))
    m = scrape(s)
    assert value(m["kafka_fleet_repair_lock_held"], cluster="prod-eu") == 1
    assert value(m["kafka_fleet_repair_lock_needs_human"], cluster="prod-eu") == 1
    assert value(m["kafka_fleet_repair_lock_held"], cluster="k") == 0
    assert value(m["kafka_fleet_repair_lock_seen_timestamp_seconds"], cluster="k") == 1_790_000_001
    assert not [x for x in m["kafka_fleet_repair_lock_held"] if x.labels["cluster"] == "never"]
    # a cluster the caller may not read is not in them at all
    only = scrape(s, readable=lambda: lambda dag_id: dag_id == "kafka_fleet_audit__k")
    assert {x.labels["cluster"] for x in only["kafka_fleet_cluster_info"]} == {"k"}


def test_the_metrics_give_a_runs_duration_and_escape_what_they_quote(tmp_path: Path) -> None:
    s = fleet_of(tmp_path, inventories.inventory("prod-eu", brokers=3)).for_cluster("prod-eu")
    discovered = {"cluster": "prod-eu", "only_in_inventory": [], "only_in_zookeeper": []}
    discovered["started_at"] = "2026-11-29T01:59:00Z"
    area = layout.staging("scheduled__1")
    odd = {**WARNING, "rule": 'index-"odd"\\\nrule'}
    s.store.write_jsonl(area.findings_json, [odd])
    s.store.write_text(area.summary, "{}")
    summary = history.publish(s, "scheduled__1", discovered, {"audited": [1, 2, 3], "not_audited": []})
    took = value(scrape(s)["kafka_fleet_last_audit_duration_seconds"], cluster="prod-eu")
    assert took == RunSummary.from_dict(summary).duration_s > 0
    assert value(scrape(s)["kafka_fleet_findings"], rule='index-"odd"\\\nrule') == 1


def test_counts_a_damaged_store_holds_are_taken_as_zero_not_a_server_error(tmp_path: Path) -> None:
    """A history row or a summary whose counts are not numbers (a hand-edited or damaged store): the overview, the
    cluster's page and the metrics still answer, those counts taken as 0."""
    s = fleet_of(tmp_path, inventories.inventory("a", brokers=3))
    a = s.for_cluster("a")
    publish(a, "scheduled__1", [CRITICAL], "a")
    rows = a.store.read_jsonl(layout.HISTORY_RUNS)
    rows[0].update(by_severity={"critical": "many", "warning": None}, by_status={"new": [1]})
    a.store.write_jsonl(layout.HISTORY_RUNS, rows)
    report = layout.report_json(rows[0]["audit_run"])
    a.store.write_text(report, json.dumps({**a.store.read_json(report), "by_severity": {"critical": "x"}}))
    client = TestClient(create_app(lambda: s))
    for path in ("/", "/clusters/a/", "/metrics"):
        assert client.get(path).status_code == 200, path
    assert RunSummary.from_dict(
        {"by_severity": {"critical": "3", "warning": -1, "info": 2.0, "x": "\u00b3", "y": "\u0663"}}
    ).by_severity == {"critical": 3, "warning": 0, "info": 2, "x": 0, "y": 3}
