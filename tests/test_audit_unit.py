"""Audit steps without Airflow: history statuses, alert text, the remote probe command."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor import layout
from fleet_doctor.audit import alerts, history, steps
from fleet_doctor.audit.summary import RunSummary
from fleet_doctor.layout import safe_run_id
from fleet_doctor.repair import tasks
from fleet_doctor.repair.errors import RepairError
from fleet_doctor.settings import Settings
from harness.findings import finding


def _run(settings: Settings, run: str, findings: list[dict[str, Any]], not_audited: list[int]) -> dict:
    key = layout.staging(run).key
    settings.store.write_jsonl(f"{key}/findings.jsonl", findings)
    settings.store.write_text(f"{key}/summary.json", json.dumps({"rules_skipped": {}}))
    discovered = {"cluster": "c1", "only_in_inventory": [], "only_in_zookeeper": [4], "zookeeper_error": None}
    facts = {"audited": [b for b in (1, 2, 3) if b not in not_audited], "not_audited": not_audited}
    return history.publish(settings, run, discovered, facts)


def test_history_marks_new_persisting_resolved_and_unverified(tmp_path: Path) -> None:
    s = Settings(inventory=tmp_path / "inv.json", data_root=tmp_path / "data")
    a, b, c = finding("index-orphan", 1, "/a"), finding("stray-dir", 2, "/b", "warning"), finding("log-crc", 3, "/c")
    s1 = _run(s, "run:1", [a, b, c], [])
    assert s1["by_status"] == {"new": 3, "persisting": 0, "resolved": 0, "unverified": 0}
    assert s1["by_severity"] == {"critical": 2, "warning": 1, "info": 0} and s1["only_in_zookeeper"] == [4]
    s2 = _run(s, "run:2", [a, b], [])  # c cleared
    assert s2["by_status"] == {"new": 0, "persisting": 2, "resolved": 1, "unverified": 0}
    assert s2["previous_run"] == safe_run_id("run:1")
    s3 = _run(s, "run:3", [a], [2])  # broker 2 unreachable: its finding is carried, not resolved
    assert s3["by_status"] == {"new": 0, "persisting": 1, "resolved": 0, "unverified": 1}
    assert s3["not_audited"] == [2]
    rows = s.store.read_jsonl("history/audit_run=run_3/findings.jsonl")
    assert {r["path"]: r["status"] for r in rows} == {"/a": "persisting", "/b": "unverified"}
    assert next(r for r in rows if r["path"] == "/a")["first_seen"] == "run_1"
    runs = s.store.read_jsonl(layout.HISTORY_RUNS)
    assert [r["audit_run"] for r in runs] == ["run_1", "run_2", "run_3"]
    html = Path(s3["report"]).read_text()
    assert "Not audited" in html and "<svg" in html and "unverified" in html
    # rerunning the same audit run replaces it in the history instead of adding a second row
    _run_again = _run(s, "run:4", [a], [])
    assert _run_again["previous_run"] == "run_3"


def test_alert_only_when_critical_or_unaudited(tmp_path: Path) -> None:
    summary = {
        "cluster": "c1",
        "audit_run": "r",
        "by_severity": {"critical": 0, "warning": 3, "info": 0},
        "by_status": {"new": 1, "resolved": 0},
        "by_rule": {"stray-dir": 3},
        "not_audited": [],
        "report": "/reports/r.html",
    }
    assert alerts.alert_message(RunSummary.from_dict(summary)) is None
    msg = alerts.alert_message(RunSummary.from_dict({**summary, "not_audited": [2]}), "https://fd.example/r.html")
    assert msg and "NOT AUDITED" in msg and "brokers 2" in msg and "https://fd.example/r.html" in msg
    msg = alerts.alert_message(
        RunSummary.from_dict({**summary, "by_severity": {"critical": 2, "warning": 0, "info": 0}})
    )
    assert msg and "2 critical" in msg and "stray-dir 3" in msg


def test_probe_command_quotes_every_path() -> None:
    evil = ["/var/lib/kafka/data 1", "/x/$(touch /tmp/pwned)", "/y/it's"]
    cmd = steps.probe_command(evil, deep=True, verify_crc=False)
    assert cmd.startswith("if command -v ionice") and "nice -n 19" in cmd
    probe = cmd.split("exec nice -n 19 $IO ", 1)[1]
    assert shlex.split(probe) == ["python3", "-", "--jobs", "1", "--deep", *evil]
    assert "--verify-crc" in steps.probe_command(["/d"], deep=True, verify_crc=True)


def test_out_of_scope_brokers_keep_their_findings_unverified(tmp_path: Path) -> None:
    """A manual run of only some brokers (param `brokers`) must not mark the others' findings resolved."""
    s = Settings(inventory=tmp_path / "inv.json", data_root=tmp_path / "data")
    a, b = finding("index-orphan", 1, "/a"), finding("stray-dir", 2, "/b", "warning")
    _run(s, "run:1", [a, b], [])
    s.store.write_jsonl(f"{layout.staging('run:2').key}/findings.jsonl", [a])
    discovered = {"cluster": "c1", "only_in_inventory": [], "only_in_zookeeper": [], "zookeeper_error": None}
    s2 = history.publish(s, "run:2", discovered, {"audited": [1], "not_audited": [], "out_of_scope": [2, 3]})
    assert s2["by_status"] == {"new": 0, "persisting": 1, "resolved": 0, "unverified": 1}
    assert s2["out_of_scope"] == [2, 3] and s2["not_audited"] == []
    assert (
        alerts.alert_message(RunSummary.from_dict({**s2, "by_severity": {"critical": 0, "warning": 0, "info": 0}}))
        is None
    )
    assert "Out of scope" in Path(s2["report"]).read_text()


@pytest.mark.live  # starts its own ZooKeeper server
def test_discover_scope_against_a_real_zookeeper(tmp_path: Path) -> None:
    from kazoo.client import KazooClient

    from fleet_doctor.inventory import BrokerEntry, Inventory
    from fleet_lab.zk_server import ZooKeeperServer

    with ZooKeeperServer(tmp_path / "zk") as zk:
        client = KazooClient(hosts=zk.connect)
        client.start(timeout=15)
        for bid in (1, 2, 4):  # 3 is down, 4 is not in the inventory
            client.create(
                f"/kafka/brokers/ids/{bid}",
                json.dumps({"host": "h", "port": 9092}).encode(),
                makepath=True,
                ephemeral=True,
            )
        entries = [
            BrokerEntry(i, "127.0.0.1", 22, "kafka", "/k", "ssh-ed25519 AAAA", ["/d"], "3.7.0", {}) for i in (1, 2, 3)
        ]
        inventory = Inventory("c1", zk.connect + "/kafka", entries)
        whole = steps.discover(inventory)
        assert [b["broker_id"] for b in whole["brokers"]] == [1, 2, 3] and whole["out_of_scope"] == []
        assert whole["only_in_inventory"] == [3] and whole["only_in_zookeeper"] == [4]
        part = steps.discover(inventory, only=[2])
        assert [b["broker_id"] for b in part["brokers"]] == [2] and part["out_of_scope"] == [1, 3]
        assert part["brokers"][0]["registered"] and part["only_in_zookeeper"] == [4]
        try:
            steps.discover(inventory, only=[2, 9])
            raise AssertionError("an unknown broker id must be refused")
        except ValueError as e:
            assert "[9]" in str(e) and "c1" in str(e)
        client.stop()


def test_partial_run_resolves_only_its_brokers_and_is_no_base_for_a_repair(tmp_path: Path) -> None:

    s = Settings(inventory=tmp_path / "inv.json", data_root=tmp_path / "data")
    cluster_wide = {**finding("under-replicated", None, "/brokers/topics/t"), "log_dir": None}
    _run(s, "run:1", [finding("index-orphan", 1, "/a"), cluster_wide], [])
    # broker 1 is clean now; ZooKeeper's finding not seen in this run
    s.store.write_jsonl(f"{layout.staging('run:2').key}/findings.jsonl", [])
    discovered = {"cluster": "c1", "only_in_inventory": [], "only_in_zookeeper": [], "zookeeper_error": None}
    facts = {"audited": [1], "not_audited": [], "out_of_scope": [2, 3]}
    s2 = history.publish(s, "run:2", discovered, facts)
    rows = s.store.read_jsonl("history/audit_run=run_2/findings.jsonl")
    assert {r["path"]: r["status"] for r in rows} == {"/a": "resolved", "/brokers/topics/t": "unverified"}
    assert s2["by_status"]["resolved"] == 1
    # the history says which runs were partial; the repair plans only from whole-fleet runs
    runs = s.store.read_jsonl(layout.HISTORY_RUNS)
    assert [r["out_of_scope"] for r in runs] == [[], [2, 3]]
    assert tasks.latest_audit_run(s) == "run_1"
    try:
        tasks.whole_fleet_run(s, "run_2")
        raise AssertionError("a partial run must be refused as the base of a plan")
    except RepairError as e:
        assert "run_2" in str(e) and "[2, 3]" in str(e)
    tasks.whole_fleet_run(s, "run_1")
    with pytest.raises(RepairError, match="no audit run 'run_9'"):  # an empty plan would look healthy
        tasks.whole_fleet_run(s, "run_9")
    assert "--partial-scope" in steps.detect_args(s, "run:2", {**facts, "probe_dir": "/p", "brokers": "/b"})
    assert "--partial-scope" not in steps.detect_args(
        s, "run:1", {**facts, "out_of_scope": [], "probe_dir": "/p", "brokers": "/b"}
    )


def test_settings_read_the_given_environment_and_default_to_the_dataclass() -> None:
    """fleet_lab.demo.prepare creates the pool from the environment it is handed (not this process's)."""
    s = Settings.from_env(
        {
            "FLEET_DOCTOR_AUDIT_POOL": "probes",
            "FLEET_DOCTOR_AUDIT_POOL_SLOTS": "8",
            "FLEET_DOCTOR_DEEP": "false",
            "FLEET_DOCTOR_STAGE_RETRIES": "",
        }
    )
    assert (s.pool, s.pool_slots, s.deep, s.stage_retries) == ("probes", 8, False, 2)
    d = Settings.from_env({})
    assert (d.pool, d.pool_slots, d.schedule, d.deep, d.verify_crc) == (
        "kafka_fleet_audit",
        32,
        "0 2 * * *",
        True,
        False,
    )


def test_an_explicit_audit_run_as_airflow_names_it_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28 item 16: a run id as Airflow gives it (``manual__...T10:00:00+00:00``, with ':' and '+') names the
    run the history keeps under its file-safe form; the plan task finds it instead of saying "not found"."""
    s = Settings(inventory=tmp_path / "inv.json", data_root=tmp_path / "data")
    airflow_id = "manual__2026-11-05T10:00:00.123456+00:00"
    _run(s, airflow_id, [finding("index-orphan", 1, "/a")], [])
    asked: list[str] = []

    def plan_from_run(settings: Settings, run: str, params: dict[str, Any]) -> Any:
        tasks.whole_fleet_run(settings, run)  # the history knows it (RepairError otherwise)
        asked.append(run)
        raise RuntimeError("planned")

    monkeypatch.setattr(tasks, "plan_from_run", plan_from_run)
    with pytest.raises(RuntimeError, match="planned"):
        tasks.make_plan(s, {"audit_run": airflow_id})
    assert asked == [safe_run_id(airflow_id)]
    with pytest.raises(RepairError, match="no audit run"):
        tasks.whole_fleet_run(s, airflow_id)  # the raw id is not a key of the history
