"""The audit's plumbing on KRaft clusters (issue 18): the inventory's metadata mode and controllers, discovery and the
metadata snapshot read from the controllers over real SSH (identity checked, a second controller when the first
cannot be read), the report naming the metadata source, and the repair and restore refusing a KRaft cluster."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fleet_doctor import inventory as inv
from fleet_doctor import layout
from fleet_doctor.audit import history, kraft, report, steps
from fleet_doctor.audit.summary import RunSummary
from fleet_doctor.repair import tasks
from fleet_doctor.repair.errors import RepairError
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


def kraft_data(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(KRAFT)
    data.update(changes)
    return data


# --------------------------------------------------------------------------------------------
# inventory
def test_a_kraft_inventory_lists_its_controllers_in_order() -> None:
    i = inv.parse(kraft_data())
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
    data = kraft_data()
    data["controllers"][i] = {**data["controllers"][i], **fields}
    return data


@pytest.mark.parametrize(
    "data,message",
    [
        (kraft_data(metadata_mode="raft"), "metadata_mode must be one of zookeeper, kraft"),
        ({k: v for k, v in KRAFT.items() if k != "controllers"}, "missing field 'controllers'"),
        (kraft_data(controllers=[]), "at least one entry in controllers"),
        (kraft_data(controllers=[{"id": 1}, {"id": 1}]), "duplicate controller id 1"),
        (kraft_data(controllers=[{"id": "1"}]), "field 'id' has the wrong type"),
        (kraft_data(controllers=["kafka1"]), r"controllers\[0\]: not an object"),
        (controllers_with(0, host="elsewhere"), "controller 2 is broker 2 of the inventory"),
        (controllers_with(2, host=None), "field 'host' has the wrong type"),
        (kraft_data(controllers=[{"id": 7, "metadata_log_dir": "/m"}]), "controller-only node needs host"),
        (controllers_with(2, host_key="AAAA"), "pinned public host key"),
        (controllers_with(2, host="ctl1; reboot"), "invalid host"),
        (controllers_with(1, metadata_log_dir="var/lib/kafka"), "metadata_log_dir must be an absolute path"),
        (controllers_with(1, metadata_log_dir="/d/__cluster_metadata-0"), "not __cluster_metadata-0 itself"),
        (controllers_with(1, metadata_log_dir="/d\nx"), "metadata_log_dir must be an absolute path"),
        (controllers_with(2, sshport=22), r"unknown field\(s\) \['sshport'\]"),
        (kraft_data(zookeeper=7), "field 'zookeeper' has the wrong type"),
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


def test_the_zookeeper_write_is_refused_on_a_kraft_cluster_before_anything_else(tmp_path: Path) -> None:
    """A KRaft cluster has no ZooKeeper: the topic-ID write refuses before reading a plan or connecting; nothing is
    read or written. (The repair and the restore themselves run on KRaft: tests/test_kraft_repair.py.)"""
    s = write_kraft_inventory(tmp_path)
    assert s.load_inventory().kraft
    with pytest.raises(RepairError, match="cluster eu1 is a KRaft cluster: it has no ZooKeeper"):
        tasks.restore_zookeeper(s, {"hash": "0" * 64}, {}, "manual__1")
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
    "log_max_epoch": 3,
    "whole": True,
    "quorum_leader_id": 3,
    "quorum_leader_epoch": 3,
    "problems": 0,
}


def test_summary_and_report_name_the_controller_and_snapshot_used(tmp_path: Path) -> None:
    s = Settings(inventory=tmp_path / "inv.json", data_root=tmp_path / "data")
    key = layout.staging("run:1").key
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


def test_the_plan_names_the_quorums_controller_whichever_controllers_log_is_the_freshest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Offline, the demo's case made certain: node 3's quorum-state names leader 2 at epoch 2 (1 leads), and either
    node 3's log or node 1's is a batch ahead. Whichever is chosen, the staged cluster record (its lines and its
    parsed copy), the source and the plan's controller name 1: the plan hash does not move with the NoOpRecords."""
    from fleet_doctor.repair.planner import FleetFacts

    def read_of(cid: int, leader: int, end: int) -> kraft.ControllerRead:
        head = {
            "kind": "cluster_metadata",
            "source": "kraft",
            "node_id": cid,
            "cluster_id": "c1",
            "quorum_leader_id": leader,
            "quorum_leader_epoch": 2,
            "log_max_epoch": 2,
            "log_end_offset": end,
            "image_complete": True,
            "error": None,
        }
        cluster = {"kind": "cluster", "cluster_id": "c1", "controller_id": leader, "controller_epoch": 2}
        records = [head, cluster, {"kind": "topic", "topic": "t"}, {"kind": "cluster_metadata_end", "complete": True}]
        lines = [json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in records]
        return kraft.ControllerRead({"controller_id": cid}, lines, "", kept=[head, cluster, records[-1]])

    endpoints = [{"controller_id": n} for n in (1, 2, 3)]
    monkeypatch.setattr(kraft, "connected", lambda endpoint, connect: SimpleNamespace(close=lambda: None))
    views = {1: 1, 2: 1, 3: 2}  # whom each node's quorum-state names
    plans = []
    for ends in ({1: 50, 2: 50, 3: 51}, {1: 52, 2: 51, 3: 51}):  # node 3 ahead, then node 1

        def read(client: Any, e: dict[str, Any], ends: dict[int, int] = ends, **kw: Any) -> kraft.ControllerRead:
            return read_of(e["controller_id"], views[e["controller_id"]], ends[e["controller_id"]])

        monkeypatch.setattr(kraft, "read_controller", read)
        reads, errors = kraft.read_controllers(endpoints, connect=lambda e: None, program=b"")
        chosen = reads[0]
        assert errors == [] and chosen.controller_id == max(ends, key=lambda n: (ends[n], -n))
        staged = [json.loads(line) for line in chosen.lines]
        assert [(r["controller_id"], r["controller_epoch"]) for r in staged if r["kind"] == "cluster"] == [(1, 2)]
        assert chosen.controller() == (1, 2) and staged[2] == {"kind": "topic", "topic": "t"}
        source = chosen.source()
        assert (source["active_controller"], source["quorum_leader_id"]) == (1, views[chosen.controller_id])
        plans.append(FleetFacts({}, staged).controller)
    assert plans == [1, 1]
    # a decoder output without its cluster record is an error naming the controller, not the node's own view kept
    broken = read_of(3, 2, 51)
    broken.lines = [broken.lines[0], broken.lines[-1]]
    with pytest.raises(kraft.MetadataReadError, match="controller 3: the decoder printed no cluster record"):
        broken.name_controller((1, 2))


def test_no_controller_read_is_reported_and_alerted(tmp_path: Path) -> None:
    from fleet_doctor.audit import alerts

    s = Settings(inventory=tmp_path / "inv.json", data_root=tmp_path / "data")
    key = layout.staging("run:1").key
    s.store.write_jsonl(f"{key}/findings.jsonl", [])
    error = "no controller's metadata log could be read: controller 1 (h:22): the decoder exited 2: boom"
    discovered = {"cluster": "lab", "metadata_mode": "kraft", "only_in_inventory": [], "only_in_zookeeper": []}
    facts = {"audited": [1], "not_audited": [], "metadata_mode": "kraft", "metadata_source": None}
    summary = history.publish(s, "run:1", discovered, {**facts, "metadata_error": error, "controller_errors": []})
    assert summary["metadata_error"] == error and summary["metadata_source"] is None
    assert "Not read: the cluster-wide rules did not run" in Path(summary["report"]).read_text()
    message = alerts.alert_message(RunSummary.from_dict(summary))
    assert message and "the decoder exited 2: boom" in message


# --------------------------------------------------------------------------------------------
# over real SSH: the KRaft fleet lab (`fleet-lab up --metadata kraft`: combined nodes, a real sshd each), and copies
# of a real KRaft quorum's metadata log dirs served by the same sshd
GREENLEMON = "kraft-3.5-3broker-greenlemon"  # Kafka 3.5.1, 3 combined nodes, snapshots, divergent quorum-state


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A 3-node KRaft fleet lab, and copies of greenlemon's kafka1..3 (meta.properties node.id 1..3) that an
    inventory may name as the metadata log dirs of controllers 1..3 instead of the lab's own."""
    from fleet_lab import fleet
    from harness.corpus import CORPUS, copy_writable

    root = tmp_path_factory.mktemp("kraft-audit")
    state = fleet.up(root / "lab", brokers=3, metadata="kraft")
    try:
        meta = {n: copy_writable(CORPUS / GREENLEMON / f"kafka{n}", root / f"node-{n}") for n in (1, 2, 3)}
        yield {"state": state, "root": root, "meta": meta, "inv": inv.load(state.inventory_path)}
    finally:
        fleet.down(root / "lab")


def kraft_inventory(lab: dict[str, Any], controllers: list[dict[str, Any]] | None = None) -> inv.Inventory:
    """The lab's inventory with other controllers (default: greenlemon's metadata log dirs on nodes 1..3)."""
    default = [{"id": n, "metadata_log_dir": str(lab["meta"][n])} for n in (1, 2, 3)]
    return inv.parse({**lab["inv"].to_dict(), "controllers": controllers or default}, "lab inventory")


def connect(endpoint: dict[str, Any], trust_any_host_key: bool = False) -> Any:
    """SSH to a controller as the product does (paramiko, the endpoint's pinned host key)."""
    from harness.ssh import ssh_client

    node = SimpleNamespace(**{k: endpoint[k] for k in inv.SSH_FIELDS})
    return ssh_client(node, trust_any_host_key=trust_any_host_key)  # type: ignore[arg-type]


def decoded_here(path: Path) -> list[dict[str, Any]]:
    from fleet_doctor.cluster_metadata import read_cluster_metadata

    return [{k: v for k, v in r.items() if k not in ("taken_at_ms", "dir")} for r in read_cluster_metadata(str(path))]


def test_discover_reads_the_controllers_over_ssh(lab: dict[str, Any]) -> None:
    i = kraft_inventory(lab)
    found = steps.discover(i, connect=connect)
    assert found["metadata_mode"] == "kraft" and found["zookeeper"] is None and found["zookeeper_error"] is None
    assert found["metadata_error"] is None and found["controller_errors"] == []
    source = found["metadata_source"]
    assert source["controller"] == 1 and source["metadata_log_dir"] == str(lab["meta"][1])
    assert source["snapshot"] == "00000000000000028869-0000000189.checkpoint" and source["log_end_offset"] == 30638
    assert (source["quorum_leader_id"], source["quorum_leader_epoch"]) == (1, 190)  # kafka1's quorum-state
    assert source["cluster_id"] == "EpwKlK0lR6qKZW0cGwZz8w"
    # a cleanly stopped KRaft cluster: its brokers stay registered, fenced, so none counts as registered
    assert found["registered"] == [] and found["only_in_inventory"] == [1, 2, 3] and found["fenced"] == [1, 2, 3]
    assert [c["controller_id"] for c in found["controllers"]] == [1, 2, 3]
    assert all(not b["registered"] for b in found["brokers"])
    part = steps.discover(i, only=[2], connect=connect)
    assert [b["broker_id"] for b in part["brokers"]] == [2] and part["out_of_scope"] == [1, 3]


def test_snapshot_metadata_stages_the_chosen_controller_and_every_controllers_header(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    s = Settings(inventory=tmp_path / "inventory.json", data_root=tmp_path / "data")
    discovered = steps.discover(kraft_inventory(lab), connect=connect)
    n = steps.snapshot_metadata(discovered, s.store, layout.staging("r1"), connect=connect)
    staged = s.store.read_jsonl(layout.staging("r1").cluster_metadata)
    assert n == len(staged) and staged[-1] == {**staged[-1], "kind": "cluster_metadata_end", "complete": True}
    # what came over SSH is what the decoder says here, record for record
    assert [{k: v for k, v in r.items() if k not in ("taken_at_ms", "dir")} for r in staged] == decoded_here(
        lab["meta"][1]
    )
    headers = s.store.read_jsonl(layout.staging("r1").controllers)
    assert [(h["kind"], h["controller_id"], h["node_id"]) for h in headers] == [
        ("cluster_metadata", 1, 1),
        ("cluster_metadata", 2, 2),
        ("cluster_metadata", 3, 3),
    ]
    # each controller's own quorum-state (they diverge in this real quorum: detection judges it)
    assert [(h["quorum_leader_id"], h["quorum_leader_epoch"]) for h in headers] == [(1, 190), (3, 189), (1, 190)]
    source = s.store.read_json(layout.staging("r1").metadata_source)
    assert source["source"]["controller"] == 1 and source["controllers_read"] == [1, 2, 3] and source["error"] is None
    facts = steps.write_broker_facts(discovered, s.store, layout.staging("r1"))
    assert facts["metadata_mode"] == "kraft" and facts["metadata_source"]["controller"] == 1
    args = steps.detect_args(s, "r1", facts, layout.staging("r1"))
    assert args[args.index("--controllers") + 1] == s.store.url(layout.staging("r1").controllers)
    assert args[args.index("--cluster-metadata") + 1] == s.store.url(layout.staging("r1").cluster_metadata)
    assert args[args.index("--metadata-mode") + 1] == "kraft"


def test_the_most_up_to_date_metadata_log_is_used_whatever_the_order(lab: dict[str, Any], tmp_path: Path) -> None:
    """greenlemon's kafka2 and kafka3 stopped at epoch 189, offset 30637; kafka1 went on to epoch 190, 30638. Listed
    first, a controller whose log stopped short (a stopped node on a running host) must not give the cluster's facts:
    Raft's comparison of logs (newest epoch, then end offset) picks kafka1; equal logs go by the inventory's order."""
    s = Settings(inventory=tmp_path / "inventory.json", data_root=tmp_path / "data")
    order = [2, 3, 1]
    i = kraft_inventory(lab, [{"id": n, "metadata_log_dir": str(lab["meta"][n])} for n in order])
    found = steps.discover(i, connect=connect)
    assert found["metadata_source"]["controller"] == 1 and found["metadata_source"]["log_max_epoch"] == 190
    steps.snapshot_metadata(found, s.store, layout.staging("r4"), connect=connect)
    source = s.store.read_json(layout.staging("r4").metadata_source)
    assert source["source"]["controller"] == 1 and source["controllers_read"] == order
    assert [h["controller_id"] for h in s.store.read_jsonl(layout.staging("r4").controllers)] == order
    assert s.store.read_jsonl(layout.staging("r4").cluster_metadata)[0]["node_id"] == 1
    tie = kraft_inventory(lab, [{"id": n, "metadata_log_dir": str(lab["meta"][n])} for n in (3, 2)])
    assert steps.discover(tie, connect=connect)["metadata_source"]["controller"] == 3  # equal logs: the first


def test_a_log_that_misses_records_gives_way_to_a_whole_one(lab: dict[str, Any], tmp_path: Path) -> None:
    """kafka1's log is the most up-to-date, but with a batch failing its CRC its image misses records: kafka2's
    whole one is used; kafka1's header (log_crc_errors) still goes to detection."""
    from harness.corpus import CORPUS, copy_writable

    damaged = copy_writable(CORPUS / GREENLEMON / "kafka1", tmp_path / "kafka1")
    log = damaged / inv.CLUSTER_METADATA_DIR / "00000000000000000000.log"
    data = bytearray(log.read_bytes())
    data[-20] ^= 0xFF  # inside the last batch's records
    log.write_bytes(bytes(data))
    i = kraft_inventory(
        lab, [{"id": 1, "metadata_log_dir": str(damaged)}, {"id": 2, "metadata_log_dir": str(lab["meta"][2])}]
    )
    s = Settings(inventory=tmp_path / "inventory.json", data_root=tmp_path / "data")
    found = steps.discover(i, connect=connect)
    assert found["metadata_source"]["controller"] == 2 and found["controller_errors"] == []
    steps.snapshot_metadata(found, s.store, layout.staging("crc"), connect=connect)
    heads = [h for h in s.store.read_jsonl(layout.staging("crc").controllers) if h["kind"] == "cluster_metadata"]
    assert [(h["controller_id"], h["log_crc_errors"] > 0) for h in heads] == [(1, True), (2, False)]
    alone = kraft_inventory(lab, [{"id": 1, "metadata_log_dir": str(damaged)}])
    source = steps.discover(alone, connect=connect)["metadata_source"]
    assert source["controller"] == 1 and source["whole"] is False  # none whole: still used, and the report says so
    assert "its image misses records" in report.metadata_source_text(source)


def test_an_unreachable_controller_falls_back_to_the_next(lab: dict[str, Any], tmp_path: Path) -> None:
    """Controller 1's host is gone (its sshd killed): discover and the snapshot read controller 2, and say so."""
    from fleet_lab import fleet

    s = Settings(inventory=tmp_path / "inventory.json", data_root=tmp_path / "data")
    i = kraft_inventory(lab)
    fleet.kill_sshd(lab["state"], 1)
    try:
        found = steps.discover(i, connect=connect)
        n = steps.snapshot_metadata(found, s.store, layout.staging("r2"), connect=connect)
    finally:
        fleet.start_sshd(lab["state"], 1)
    assert found["metadata_source"]["controller"] == 2 and found["metadata_error"] is None
    assert found["metadata_source"]["quorum_leader_id"] == 3  # kafka2's own view
    [failed] = found["controller_errors"]
    assert failed["controller"] == 1 and "controller 1 (127.0.0.1:" in failed["error"]
    assert "cannot connect" in failed["error"]
    source = s.store.read_json(layout.staging("r2").metadata_source)
    assert source["source"]["controller"] == 2 and source["controllers_read"] == [2, 3]
    assert [e["controller"] for e in source["controller_errors"]] == [1]
    assert n == len(s.store.read_jsonl(layout.staging("r2").cluster_metadata))
    facts = steps.write_broker_facts(found, s.store, layout.staging("r2"))
    s.store.write_jsonl(f"{layout.staging('r2').key}/findings.jsonl", [])
    summary = history.publish(s, "r2", found, facts)
    page = Path(summary["report"]).read_text()
    assert "From controller 2&#x27;s metadata log" in page and "00000000000000028869-0000000189.checkpoint" in page
    assert "Controllers not read" in page and "controller 1 (127.0.0.1:" in page
    assert summary["fenced"] == [1, 2, 3] and "Fenced by the controller" in page
    from fleet_doctor.audit import alerts

    message = alerts.alert_message(
        RunSummary.from_dict(summary)
    )  # no finding, but controller 1's own log went unchecked
    assert message and "NOT READ (KRaft controllers' metadata logs): 1." in message


def test_a_controller_that_is_not_what_the_inventory_says_is_skipped(lab: dict[str, Any]) -> None:
    """Identity as for a broker: the pinned host key, then node.id in the metadata log dir's meta.properties."""
    b1, b2 = lab["inv"].broker(1), lab["inv"].broker(2)
    elsewhere = {  # a controller-only node 7 whose inventory entry points at broker 1's host, pinning broker 2's key
        "id": 7,
        "metadata_log_dir": str(lab["meta"][1]),
        **{k: getattr(b1, k) for k in ("host", "ssh_port", "ssh_user", "ssh_key_file")},
        "host_key": b2.host_key,
    }
    wrong_dir = {"id": 1, "metadata_log_dir": str(lab["meta"][2])}  # node 2's dir on controller 1
    i = kraft_inventory(lab, [elsewhere, wrong_dir, {"id": 3, "metadata_log_dir": str(lab["meta"][3])}])
    found = steps.discover(i, connect=lambda e: connect(e, trust_any_host_key=True))  # the check itself refuses
    assert found["metadata_source"]["controller"] == 3
    key, node = found["controller_errors"]
    assert key["controller"] == 7 and "presented host key" in key["error"] and "pins" in key["error"]
    assert node["controller"] == 1 and "says it is broker 2, not broker 1" in node["error"]


def test_a_failing_decoder_or_garbage_output_names_the_controller(lab: dict[str, Any], tmp_path: Path) -> None:
    """Bad input is a clear error naming the controller, never a crash: the next controller is read."""
    empty = tmp_path / "formatted-empty"
    empty.mkdir()
    (empty / "meta.properties").write_text("version=1\nnode.id=2\ncluster.id=EpwKlK0lR6qKZW0cGwZz8w\n")
    i = kraft_inventory(
        lab,
        [{"id": 2, "metadata_log_dir": str(empty)}, {"id": 3, "metadata_log_dir": str(lab["meta"][3])}],
    )
    found = steps.discover(i, connect=connect)
    assert found["metadata_source"]["controller"] == 3
    [failed] = found["controller_errors"]
    assert failed["controller"] == 2 and "the decoder exited 2" in failed["error"] and str(empty) in failed["error"]

    endpoints = [i.controller_endpoint(3)]
    header = json.dumps({"kind": "cluster_metadata", "source": "kraft", "node_id": 3})
    for program, said in (
        (b"print('not json at all')", "not JSON Lines (line 1"),
        (b"print('[1, 2]')", "line 1 is not a record with a kind"),
        (b"", "the decoder printed nothing"),
        (f"print({header!r})".encode(), "ends without a complete cluster_metadata_end record"),
        (b"import sys; sys.stderr.write('Traceback: boom'); sys.exit(3)", "the decoder exited 3: Traceback: boom"),
        (b'print(\'{"kind": "zk_snapshot"}\')', "does not start with a KRaft cluster_metadata record"),
    ):
        reads, errors = kraft.read_controllers(endpoints, connect, program=program)
        assert reads == [] and len(errors) == 1, program
        assert (
            errors[0]["error"].startswith(f"controller 3 (127.0.0.1:{i.broker(3).ssh_port}, ")
            and said in (errors[0]["error"])
        ), errors[0]["error"]


def test_no_controller_readable_is_an_error_not_a_crash(lab: dict[str, Any], tmp_path: Path) -> None:
    s = Settings(inventory=tmp_path / "inventory.json", data_root=tmp_path / "data")
    nothing = tmp_path / "nothing-here"
    i = kraft_inventory(lab, [{"id": n, "metadata_log_dir": str(nothing)} for n in (1, 2)])
    found = steps.discover(i, connect=connect)
    assert found["metadata_source"] is None and found["registered"] == [] and found["only_in_inventory"] == []
    assert found["metadata_error"].startswith("no controller's metadata log could be read: controller 1 (")
    assert "no meta.properties" in found["metadata_error"] and "controller 2 (" in found["metadata_error"]
    with pytest.raises(kraft.MetadataReadError, match="no controller's metadata log could be read"):
        steps.snapshot_metadata(found, s.store, layout.staging("r3"), connect=connect)
    assert s.store.read_json(layout.staging("r3").metadata_source)["error"] == found["metadata_error"]
    assert not s.store.is_file(layout.staging("r3").cluster_metadata)
    area = layout.staging("r3")
    facts = steps.write_broker_facts(found, s.store, area)
    assert not s.store.is_file(area.controllers) and facts["metadata_source"] is None
    assert facts["metadata_error"] == found["metadata_error"]
    # the run's metadata, once staged, is what its snapshot step uses: read once per run, a retry reads nothing
    steps.snapshot_metadata(steps.discover(lab["inv"], connect=connect), s.store, area, connect=connect)
    unreachable = {"n": 0}

    def counted(endpoint: dict[str, Any]) -> Any:
        unreachable["n"] += 1
        raise OSError("unreachable")

    assert steps.snapshot_metadata(found, s.store, area, connect=counted) > 0 and unreachable["n"] == 0
    facts = steps.write_broker_facts(found, s.store, area)
    assert s.store.is_file(area.cluster_metadata) and facts["metadata_error"] is None
    assert facts["metadata_source"]["controller"] in (1, 2, 3)  # the freshest: the leader's NoOpRecords move every log


def test_a_kraft_run_reads_its_controllers_once(lab: dict[str, Any], tmp_path: Path) -> None:
    """discover reads every controller's metadata log and stages it for the run; the snapshot step uses that read,
    not a second one that could pick another controller (issue 27)."""
    s = Settings(inventory=tmp_path / "inventory.json", data_root=tmp_path / "data")
    reads: list[int] = []

    def counting(endpoint: dict[str, Any]) -> Any:
        reads.append(int(endpoint["controller_id"]))
        return connect(endpoint)

    area = layout.staging("once")
    found = steps.discover(kraft_inventory(lab), connect=counting, store=s.store, area=area)
    assert sorted(reads) == [1, 2, 3]
    n = steps.snapshot_metadata(found, s.store, area, connect=counting)
    assert sorted(reads) == [1, 2, 3] and n == len(s.store.read_jsonl(area.cluster_metadata))
    source = s.store.read_json(area.metadata_source)
    assert source["source"] == found["metadata_source"] and source["records"] == n
    assert steps.write_broker_facts(found, s.store, area)["metadata_source"] == found["metadata_source"]


# --------------------------------------------------------------------------------------------
# the KRaft lab's own quorum, live
def test_discover_and_snapshot_on_the_live_kraft_lab(lab: dict[str, Any], tmp_path: Path) -> None:
    from fleet_lab import fleet

    i = lab["inv"]
    assert i.kraft and [c.id for c in i.controllers] == [1, 2, 3]
    found = steps.discover(i, connect=connect)
    assert found["registered"] == [1, 2, 3] and found["fenced"] == [] and found["only_in_inventory"] == []
    assert found["controller_errors"] == [] and found["metadata_error"] is None
    source = found["metadata_source"]
    # the freshest log: with the leader's NoOpRecords (3.3+) every log moves, the one read last is often ahead
    assert source["controller"] in (1, 2, 3) and source["cluster_id"] == lab["state"].cluster_id
    assert (source["quorum_leader_id"], source["quorum_leader_epoch"]) == fleet.quorum_leader(lab["state"])
    mdir = Path(i.controller(source["controller"]).metadata_log_dir) / inv.CLUSTER_METADATA_DIR
    assert source["snapshot"] and (mdir / source["snapshot"]).is_file()
    s = Settings(inventory=lab["state"].inventory_path, data_root=tmp_path / "data")
    steps.snapshot_metadata(found, s.store, layout.staging("live"), connect=connect)
    staged = s.store.read_jsonl(layout.staging("live").cluster_metadata)
    assert {r["topic"] for r in staged if r["kind"] == "topic"} >= {"orders", "payments", "clickstream"}
    assert sorted(r["broker_id"] for r in staged if r["kind"] == "broker" and not r["fenced"]) == [1, 2, 3]
    headers = s.store.read_jsonl(layout.staging("live").controllers)
    assert [h["controller_id"] for h in headers if h["kind"] == "cluster_metadata"] == [1, 2, 3]


def test_the_active_controller_is_the_quorums_whichever_log_is_the_freshest(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    """The demo's quorum-state-divergent: a follower's quorum-state names another leader at the leader's epoch (the
    running node never reads it again). The leader's NoOpRecords move every log, so the controller read last is
    usually a batch ahead and gives the cluster's facts; its own view must not become the cluster's controller: the
    repair plan flags that one and restarts it last, and its hash covers it, so two audits must agree (a stale-plan
    abort in the browser repair of the demo's KRaft cluster came from this)."""
    from fleet_lab import fleet, incidents

    state = lab["state"]
    fleet.wait_healthy(state, timeout=60)
    leader = fleet.quorum_leader(state)
    assert leader is not None
    follower = max(b.id for b in state.brokers if b.id != leader[0])
    qs = Path(state.broker(follower).log_dirs[0]) / inv.CLUSTER_METADATA_DIR / "quorum-state"
    saved = qs.read_bytes()
    try:
        done = incidents.inject(state, "quorum-state-divergent", broker=follower)
        assert done.details["leader_written"] != leader[0]
        ordered = [i for i in (1, 2, 3) if i != follower] + [follower]  # the diverged node read last
        i = kraft_inventory(lab, [{"id": n, "metadata_log_dir": state.broker(n).log_dirs[0]} for n in ordered])
        s = Settings(inventory=state.inventory_path, data_root=tmp_path / "data")
        for run in ("q1", "q2", "q3"):
            found = steps.discover(i, connect=connect, store=s.store, area=layout.staging(run))
            source = found["metadata_source"]
            assert (source["active_controller"], source["active_controller_epoch"]) == leader, source
            [cluster] = [r for r in s.store.read_jsonl(layout.staging(run).cluster_metadata) if r["kind"] == "cluster"]
            assert (cluster["controller_id"], cluster["controller_epoch"]) == leader
            text = report.metadata_source_text(source)
            assert f"; quorum leader {leader[0]} (epoch {leader[1]})" in text
            if source["controller"] == follower:  # its own view, named beside the quorum's
                assert f", though its quorum-state names {done.details['leader_written']}" in text
    finally:
        qs.write_bytes(saved)


def test_live_fallback_when_a_controllers_host_is_gone(lab: dict[str, Any]) -> None:
    from fleet_lab import fleet

    fleet.kill_sshd(lab["state"], 1)
    try:
        found = steps.discover(lab["inv"], connect=connect)
    finally:
        fleet.start_sshd(lab["state"], 1)
    assert found["metadata_source"]["controller"] in (2, 3) and found["registered"] == [1, 2, 3]
    assert [e["controller"] for e in found["controller_errors"]] == [1]


def test_a_controller_of_another_cluster_is_not_used(lab: dict[str, Any], tmp_path: Path) -> None:
    """An inventory that names another cluster's metadata log dir (greenlemon's node 3) as controller 3: identity
    holds (host key, node.id 3), but its cluster.id is not the other controllers'; the most up-to-date log overall
    would be greenlemon's (epoch 189), yet the lab's are used and controller 3 is reported."""
    state = lab["state"]
    mixed = [{"id": n, "metadata_log_dir": state.broker(n).log_dirs[0]} for n in (1, 2)]
    i = kraft_inventory(lab, [*mixed, {"id": 3, "metadata_log_dir": str(lab["meta"][3])}])
    found = steps.discover(i, connect=connect)
    assert found["metadata_source"]["controller"] in (1, 2)  # the freshest of the lab's (NoOpRecords move both)
    assert found["metadata_source"]["cluster_id"] == state.cluster_id
    [foreign] = found["controller_errors"]
    assert foreign["controller"] == 3 and "names cluster.id 'EpwKlK0lR6qKZW0cGwZz8w'" in foreign["error"]
    assert f"controller(s) 1, 2 name {state.cluster_id!r}: not the same cluster" in foreign["error"]
    s = Settings(inventory=state.inventory_path, data_root=tmp_path / "data")
    steps.snapshot_metadata(found, s.store, layout.staging("mixed"), connect=connect)
    assert [h["controller_id"] for h in s.store.read_jsonl(layout.staging("mixed").controllers)] == [1, 2]
    greenlemon_first = kraft_inventory(lab, [{"id": 3, "metadata_log_dir": str(lab["meta"][3])}, mixed[0]])
    tie = steps.discover(greenlemon_first, connect=connect)  # one each: the first controller's cluster
    assert tie["metadata_source"]["controller"] == 3 and [e["controller"] for e in tie["controller_errors"]] == [1]


def test_a_stopped_broker_is_fenced_and_its_stale_log_not_used(lab: dict[str, Any]) -> None:
    """Broker 2 stopped (combined: its controller too): the quorum fences it, and its own metadata log stops where it
    left; listed first in the inventory, its log is still not the one the audit takes the cluster's facts from."""
    from fleet_lab import fleet

    state = lab["state"]
    assert fleet.run_service(state.broker(2), "stop").returncode == 0
    try:
        fleet.wait_healthy(state, timeout=30, expect_down=frozenset({2}))
        i = kraft_inventory(lab, [{"id": n, "metadata_log_dir": state.broker(n).log_dirs[0]} for n in (2, 1, 3)])
        found = steps.discover(i, connect=connect)
        assert found["registered"] == [1, 3] and found["fenced"] == [2] and found["only_in_inventory"] == [2]
        assert found["metadata_source"]["controller"] in (1, 3)
        assert [b["registered"] for b in found["brokers"]] == [True, False, True]
    finally:
        assert fleet.run_service(state.broker(2), "start").returncode == 0
        fleet.wait_healthy(state, timeout=60)


def test_the_dags_own_connections_reach_the_controllers(
    lab: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the DAG's discover and snapshot_metadata use without a ``connect``: the SSH provider's hook on the
    connections the inventory generates (a combined controller's is its broker's), host key pinned in their extras."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    conns = json.loads((lab["state"].path / "airflow-connections.json").read_text())
    assert sorted(conns) == ["kafka_ssh_lab_1", "kafka_ssh_lab_2", "kafka_ssh_lab_3"]  # no ZooKeeper in KRaft
    for cid, conn in conns.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_{cid.upper()}", json.dumps(conn))
    wrong = {**conns["kafka_ssh_lab_1"], "extra": {**conns["kafka_ssh_lab_1"]["extra"]}}
    wrong["extra"]["host_key"] = conns["kafka_ssh_lab_2"]["extra"]["host_key"]
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_SSH_LAB_1", json.dumps(wrong))  # broker 1's connection pins 2's key
    found = steps.discover(lab["inv"])
    assert found["registered"] == [1, 2, 3] and found["metadata_source"]["controller"] in (2, 3)  # not 1's
    [refused] = found["controller_errors"]
    assert refused["controller"] == 1 and "cannot connect: BadHostKeyException" in refused["error"]
    s = Settings(inventory=lab["state"].inventory_path, data_root=tmp_path / "data")
    assert steps.snapshot_metadata(found, s.store, layout.staging("af")) > 0


def test_the_decoders_output_is_kept_as_printed_and_only_the_facts_read_here_parsed(tmp_path: Path) -> None:
    """The worker streams the decoder's output (spooled to disk past 32 MiB) and keeps each line as printed: only
    the header, the cluster, the brokers, the problems and the end record become dicts (a dict costs about four
    times its line); the staged cluster metadata is those lines, written without a second copy."""
    import io

    from fleet_doctor import cluster_metadata as cm

    printed = cm.read_cluster_metadata(str(kraft_sample_dir()))
    text = cm.format_records(printed).encode()
    lines, kept = kraft._parse("controller 1", io.BytesIO(text), len(text))
    assert b"".join(lines) == text and [json.loads(line) for line in lines] == printed
    assert [r["kind"] for r in kept] == [r["kind"] for r in printed if r["kind"] in kraft.KEPT_KINDS]
    assert {"topic", "partition_state"} <= {r["kind"] for r in printed} - kraft.KEPT_KINDS
    read = kraft.ControllerRead({"controller_id": 1}, lines, "pinned", "", kept)
    assert read.records == printed and read.brokers() and read.header == printed[0]
    area = layout.staging("r1")
    store = Settings(inventory=tmp_path / "i.json", data_root=tmp_path / "data").store
    endpoint = {"controller_id": 1, "host": "h", "ssh_port": 22, "metadata_log_dir": "/m"}
    read.endpoint = endpoint
    account = steps.stage_kraft_metadata(store, area, [endpoint], [read], [])
    assert store.read_bytes(area.cluster_metadata) == text and account["records"] == len(printed)
    read.only_own_records()
    assert [r["kind"] for r in read.records] == [r["kind"] for r in read.kept] == ["cluster_metadata"]


def kraft_sample_dir() -> Path:
    from harness.corpus import CORPUS

    return CORPUS / "kraft-3.5-3broker-greenlemon" / "kafka1"
