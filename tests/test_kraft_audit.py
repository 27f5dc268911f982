"""The audit's plumbing on KRaft clusters (issue 18): the inventory's metadata mode and controllers, discovery and the
metadata snapshot read from the controllers over real SSH (identity checked, a second controller when the first
cannot be read), the report naming the metadata source, and the repair and restore refusing a KRaft cluster."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor import inventory as inv
from fleet_doctor.audit import history
from fleet_doctor.repair import tasks
from fleet_doctor.settings import Settings
from harness.findings import finding

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE"
SERVICE = {"stop": "sudo systemctl stop kafka", "start": "sudo systemctl start kafka", "status": "systemctl is-active"}


def broker(bid: int) -> dict[str, Any]:
    return {
        "id": bid,
        "host": f"kafka{bid}.example.net",
        "ssh_port": 22,
        "ssh_user": "doctor",
        "ssh_key_file": "/etc/fleet-doctor/id_ed25519",
        "host_key": KEY + str(bid),
        "log_dirs": [f"/var/lib/kafka/data-{bid}", f"/var/lib/kafka/more-{bid}"],
        "kafka_version": "3.7.1",
        "service": SERVICE,
    }


KRAFT = {
    "inventory_version": 1,
    "cluster": "eu1",
    "metadata_mode": "kraft",
    "brokers": [broker(1), broker(2), broker(3)],
    "controllers": [
        {"id": 2},  # combined: broker 2's SSH entry, metadata.log.dir = its first log dir
        {"id": 1, "metadata_log_dir": "/var/lib/kafka/meta"},
        {
            "id": 9000,
            "metadata_log_dir": "/var/lib/kraft/controller/",
            "host": "ctl1.example.net",
            "ssh_port": 2222,
            "ssh_user": "doctor",
            "ssh_key_file": "/etc/fleet-doctor/id_ed25519",
            "host_key": KEY + "9",
        },
    ],
}


def kraft(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(KRAFT)
    data.update(changes)
    return data


# --------------------------------------------------------------------------------------------
# inventory
def test_a_kraft_inventory_lists_its_controllers_in_order() -> None:
    i = inv.parse(kraft())
    assert i.kraft and i.metadata_mode == "kraft" and i.zookeeper == ""
    assert [c.id for c in i.controllers] == [2, 1, 9000]  # the order the audit tries them in
    assert [c.combined for c in i.controllers] == [True, True, False]
    assert i.controller(2).metadata_log_dir == "/var/lib/kafka/data-2"  # Kafka's metadata.log.dir default
    assert i.controller(9000).metadata_log_dir == "/var/lib/kraft/controller"
    combined, only = i.controller_endpoint(2), i.controller_endpoint(9000)
    assert combined == {
        "controller_id": 2,
        "combined": True,
        "host": "kafka2.example.net",
        "ssh_port": 22,
        "ssh_user": "doctor",
        "ssh_key_file": "/etc/fleet-doctor/id_ed25519",
        "host_key": KEY + "2",
        "ssh_conn_id": "kafka_ssh_eu1_2",  # the broker's own connection
        "metadata_log_dir": "/var/lib/kafka/data-2",
    }
    assert only["ssh_conn_id"] == "kafka_ssh_eu1_controller_9000" and only["host_key"] == KEY + "9"
    assert (only["host"], only["ssh_port"]) == ("ctl1.example.net", 2222)
    conns = i.airflow_connections()
    assert sorted(conns) == ["kafka_ssh_eu1_1", "kafka_ssh_eu1_2", "kafka_ssh_eu1_3", "kafka_ssh_eu1_controller_9000"]
    ctl = conns["kafka_ssh_eu1_controller_9000"]
    assert (ctl["host"], ctl["port"], ctl["login"]) == ("ctl1.example.net", 2222, "doctor")
    assert ctl["extra"]["host_key"] == KEY + "9" and ctl["extra"]["no_host_key_check"] is False
    assert inv.parse(json.loads(i.to_json())) == i  # what the file says is what it reads back
    assert "zookeeper.connect" not in i.to_json() and json.loads(i.to_json())["controllers"][0] == {
        "id": 2,
        "metadata_log_dir": "/var/lib/kafka/data-2",
    }


def test_a_zookeeper_inventory_is_unchanged() -> None:
    data = {k: v for k, v in KRAFT.items() if k not in ("metadata_mode", "controllers")}
    data["zookeeper"] = "zk1:2181,zk2:2181/kafka"
    i = inv.parse(data)
    assert not i.kraft and i.metadata_mode == "zookeeper" and i.controllers == []
    assert "metadata_mode" not in i.to_json() and "controllers" not in i.to_json()  # the file as before issue 18
    assert sorted(i.airflow_connections()) == ["kafka_ssh_eu1_1", "kafka_ssh_eu1_2", "kafka_ssh_eu1_3", "kafka_zk_eu1"]
    assert inv.parse({**data, "metadata_mode": "zookeeper"}) == i
    with pytest.raises(inv.InventoryError, match="missing field 'zookeeper'"):
        inv.parse({k: v for k, v in data.items() if k != "zookeeper"})


def controllers_with(i: int, **fields: Any) -> dict[str, Any]:
    data = kraft()
    data["controllers"][i] = {**data["controllers"][i], **fields}
    return data


@pytest.mark.parametrize(
    "data,message",
    [
        (kraft(metadata_mode="raft"), "metadata_mode must be one of zookeeper, kraft"),
        ({k: v for k, v in KRAFT.items() if k != "controllers"}, "missing field 'controllers'"),
        (kraft(controllers=[]), "at least one entry in controllers"),
        (kraft(controllers=[{"id": 1}, {"id": 1}]), "duplicate controller id 1"),
        (kraft(controllers=[{"id": "1"}]), "field 'id' has the wrong type"),
        (kraft(controllers=["kafka1"]), r"controllers\[0\]: not an object"),
        (controllers_with(0, host="elsewhere"), "controller 2 is broker 2 of the inventory"),
        (controllers_with(2, host=None), "field 'host' has the wrong type"),
        (kraft(controllers=[{"id": 7, "metadata_log_dir": "/m"}]), "controller-only node needs host"),
        (controllers_with(2, host_key="AAAA"), "pinned public host key"),
        (controllers_with(2, host="ctl1; reboot"), "invalid host"),
        (controllers_with(1, metadata_log_dir="var/lib/kafka"), "metadata_log_dir must be an absolute path"),
        (controllers_with(1, metadata_log_dir="/d/__cluster_metadata-0"), "not __cluster_metadata-0 itself"),
        (controllers_with(1, metadata_log_dir="/d\nx"), "metadata_log_dir must be an absolute path"),
        (controllers_with(2, sshport=22), r"unknown field\(s\) \['sshport'\]"),
        (kraft(zookeeper=7), "field 'zookeeper' has the wrong type"),
        (
            {**{k: v for k, v in KRAFT.items() if k != "metadata_mode"}, "zookeeper": "zk:2181"},
            "controllers are for metadata_mode kraft",
        ),
    ],
)
def test_kraft_inventory_validation_names_the_field(data: dict[str, Any], message: str) -> None:
    with pytest.raises(inv.InventoryError, match=message) as e:
        inv.parse(data, "inv.json")
    assert str(e.value).startswith("inv.json")


# --------------------------------------------------------------------------------------------
# repair and restore refuse KRaft
def write_kraft_inventory(tmp_path: Path) -> Settings:
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps(KRAFT))
    return Settings(inventory=path, data_root=tmp_path / "data", repair_dir=tmp_path / "repairs")


def test_repair_and_restore_refuse_a_kraft_cluster_before_anything_else(tmp_path: Path) -> None:
    """The first task of each DAG (and each task that acts) refuses, before reading the history or a plan, before
    any connection: nothing is read or written."""
    s = write_kraft_inventory(tmp_path)
    refused = "repairs on KRaft clusters are not supported yet: cluster eu1"
    with pytest.raises(tasks.RepairError, match=refused):
        tasks.make_plan(s, {"audit_run": "latest"})
    with pytest.raises(tasks.RepairError, match=refused):
        tasks.execute(s, {"hash": "0" * 64}, {}, "manual__1")
    with pytest.raises(tasks.RepairError, match=refused):
        tasks.restore_zookeeper(s, {"hash": "0" * 64}, {}, "manual__1")
    with pytest.raises(tasks.RepairError, match="repairs and restores on KRaft clusters are not supported yet"):
        tasks.make_restore_plan(s, {"plan": "0" * 12})
    with pytest.raises(tasks.RepairError, match="metadata_mode kraft") as e:
        tasks.refuse_kraft(s)
    assert "kafka_fleet_audit" in str(e.value)  # where to go instead
    assert not (tmp_path / "repairs").exists() and not (tmp_path / "data").exists()


# --------------------------------------------------------------------------------------------
# the summary and the report name the metadata source
SOURCE = {
    "controller": 2,
    "host": "127.0.0.1:2202",
    "metadata_log_dir": "/lab/broker-2/data-0",
    "cluster_id": "EP6hyiddQNW5FPrAvR9kWw",
    "snapshot": "00000000000000000150-0000000003.checkpoint",
    "snapshot_end_offset": 150,
    "log_end_offset": 188,
    "quorum_leader_id": 3,
    "quorum_leader_epoch": 3,
    "problems": 0,
}


def test_summary_and_report_name_the_controller_and_snapshot_used(tmp_path: Path) -> None:
    s = Settings(inventory=tmp_path / "inv.json", data_root=tmp_path / "data")
    key = s.run_key("run:1")
    s.store.write_jsonl(f"{key}/findings.jsonl", [{**finding("under-replicated", None, "t-0"), "log_dir": None}])
    s.store.write_text(f"{key}/summary.json", json.dumps({"rules_skipped": {}}))
    failed = [{"controller": 1, "error": "controller 1 (127.0.0.1:2201): cannot connect: NoValidConnectionsError"}]
    discovered = {
        "cluster": "lab",
        "metadata_mode": "kraft",
        "only_in_inventory": [3],
        "only_in_zookeeper": [],
        "zookeeper_error": None,
        "metadata_source": {**SOURCE, "controller": 1},  # discover read controller 1, the snapshot step could not
        "metadata_error": None,
        "controller_errors": [],
    }
    facts = {
        "audited": [1, 2, 3],
        "not_audited": [],
        "metadata_mode": "kraft",
        "metadata_source": SOURCE,
        "metadata_error": None,
        "controller_errors": failed,
    }
    summary = history.publish(s, "run:1", discovered, facts)
    assert summary["metadata_mode"] == "kraft" and summary["metadata_source"] == SOURCE  # what detection used
    assert summary["controller_errors"] == failed and summary["metadata_error"] is None
    assert json.loads(Path(s.store.url("reports/run_1.json")).read_text())["metadata_source"]["controller"] == 2
    page = Path(summary["report"]).read_text()
    assert "controller 2&#x27;s metadata log (127.0.0.1:2202, /lab/broker-2/data-0)" in page
    assert "snapshot 00000000000000000150-0000000003.checkpoint (end offset 150), log end offset 188" in page
    assert "Controllers not read" in page and "cannot connect: NoValidConnectionsError" in page
    assert "not registered in the metadata log" in page and "ZooKeeper" not in page


def test_no_controller_read_is_reported_and_alerted(tmp_path: Path) -> None:
    from fleet_doctor.audit import alerts

    s = Settings(inventory=tmp_path / "inv.json", data_root=tmp_path / "data")
    key = s.run_key("run:1")
    s.store.write_jsonl(f"{key}/findings.jsonl", [])
    error = "no controller's metadata log could be read: controller 1 (h:22): the decoder exited 2: boom"
    discovered = {"cluster": "lab", "metadata_mode": "kraft", "only_in_inventory": [], "only_in_zookeeper": []}
    facts = {"audited": [1], "not_audited": [], "metadata_mode": "kraft", "metadata_source": None}
    summary = history.publish(s, "run:1", discovered, {**facts, "metadata_error": error, "controller_errors": []})
    assert summary["metadata_error"] == error and summary["metadata_source"] is None
    assert "Not read: the cluster-wide rules did not run" in Path(summary["report"]).read_text()
    message = alerts.alert_message(summary)
    assert message and "the decoder exited 2: boom" in message
