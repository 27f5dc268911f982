"""min.insync.replicas as Kafka resolves it, on a real ZooKeeper (the lab's server): topic override
(/config/topics/<t>) > dynamic cluster-wide default (/config/brokers/<default>) > the brokers' static default (the
inventory or a parameter, passed to Cluster) > 1. Issue 15 item 14: the broker-level default was invisible, so the
pre-check let a stop take a partition with 2 in-sync replicas down to 1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor import inventory, layout
from fleet_doctor.audit.steps import snapshot_zookeeper
from fleet_doctor.repair import approval_text
from fleet_doctor.repair.plan import BrokerPlan, Plan
from fleet_doctor.repair.planner import FleetFacts, restart_risk
from fleet_doctor.store import Store
from fleet_doctor.zookeeper import session
from fleet_doctor.zookeeper.cluster import Cluster
from fleet_lab.zk_server import ZooKeeperServer

CHROOT = "/kafka"
DEFAULT = "/config/brokers/<default>"


def _config(min_isr: str | None) -> bytes:
    return json.dumps({"version": 1, "config": {} if min_isr is None else {"min.insync.replicas": min_isr}}).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    with ZooKeeperServer(tmp_path_factory.mktemp("zk")) as running:
        yield running


@pytest.fixture(scope="module")
def zk(server: ZooKeeperServer) -> Iterator[Any]:
    """Kafka's znodes for topic t: t-0 replicas [1, 2, 3] with ISR [1, 2] (broker 3 fell behind), t-1 ISR [2, 3, 1];
    no /config/topics/t (the topic has no override, as most topics)."""
    with session(server.connect) as root:
        root.ensure_path(CHROOT)
    with session(server.connect + CHROOT) as client:
        for b in (1, 2, 3):
            client.create(f"/brokers/ids/{b}", json.dumps({"host": "h", "port": 9092}).encode(), makepath=True)
        assignment = {"0": [1, 2, 3], "1": [2, 3, 1]}
        client.create("/brokers/topics/t", json.dumps({"version": 2, "partitions": assignment}).encode(), makepath=True)
        for p, isr in (("0", [1, 2]), ("1", [2, 3, 1])):
            state = {"controller_epoch": 1, "leader": isr[0], "version": 1, "leader_epoch": 0, "isr": isr}
            client.create(f"/brokers/topics/t/partitions/{p}/state", json.dumps(state).encode(), makepath=True)
        client.create("/controller", json.dumps({"version": 1, "brokerid": 1}).encode())
        client.ensure_path("/config/topics")
        client.ensure_path("/config/brokers")
        yield client


def _set(zk: Any, path: str, min_isr: str | None) -> None:
    """``min_isr`` None: the znode is absent."""
    if min_isr is None:
        if zk.exists(path):
            zk.delete(path)
    elif zk.exists(path):
        zk.set(path, _config(min_isr))
    else:
        zk.create(path, _config(min_isr))


@pytest.fixture
def configs(zk: Any) -> Iterator[Any]:
    yield zk
    _set(zk, DEFAULT, None)
    _set(zk, "/config/topics/t", None)


def test_cluster_wide_default_refuses_a_stop_that_leaves_one_in_sync_replica(configs: Any) -> None:
    zk = configs
    assert Cluster(zk).below_min_isr_if_stopped(1) == []  # nothing set anywhere: Kafka's default, 1
    _set(zk, DEFAULT, "2")
    below = Cluster(zk).below_min_isr_if_stopped(1)
    assert below == ["t-0 (ISR [1, 2], min.insync.replicas 2 from /config/brokers/<default>)"]
    assert Cluster(zk).below_min_isr_if_stopped(2) == below  # t-0 again; t-1 keeps 2 of 3
    assert Cluster(zk).below_min_isr_if_stopped(3) == []  # not in t-0's ISR; t-1 keeps 2 of 3
    # the topic's own config wins over the cluster-wide default, both ways
    _set(zk, "/config/topics/t", "1")
    assert Cluster(zk).below_min_isr_if_stopped(1) == []
    _set(zk, "/config/topics/t", "3")
    assert {b.split(" ")[0] for b in Cluster(zk).below_min_isr_if_stopped(3)} == {"t-1"}
    # a topic config znode without the key falls back to the default
    zk.set("/config/topics/t", _config(None))
    assert len(Cluster(zk).below_min_isr_if_stopped(1)) == 1


def test_a_brokers_own_dynamic_value_counts_for_its_partitions(configs: Any) -> None:
    """Issue 28 item 8: ``/config/brokers/<id>`` (a per-broker dynamic min.insync.replicas) stands above the
    cluster-wide default for that broker; a partition takes the strictest of its replicas' brokers (whichever leads
    enforces its own), and a topic override still wins."""
    zk = configs
    _set(zk, DEFAULT, "1")
    _set(zk, "/config/brokers/3", "2")  # broker 3 is a replica of t-0 (not in its ISR) and of t-1
    try:
        below = Cluster(zk).below_min_isr_if_stopped(1)
        assert below == ["t-0 (ISR [1, 2], min.insync.replicas 2 from /config/brokers/3)"]
        p1 = next(p for p in Cluster(zk).partitions() if p["partition"] == 1)
        assert (p1["min_isr"], p1["min_isr_source"]) == (2, "/config/brokers/3")
        _set(zk, "/config/brokers/3", "3")
        assert {b.split(" ")[0] for b in Cluster(zk).below_min_isr_if_stopped(2)} == {"t-0", "t-1"}
        _set(zk, "/config/topics/t", "1")  # the topic's own config wins over any broker's
        assert Cluster(zk).below_min_isr_if_stopped(2) == []
        _set(zk, "/config/brokers/3", "zero")
        _set(zk, "/config/topics/t", None)
        with pytest.raises(ValueError, match=r"/config/brokers/3.*'zero'"):
            Cluster(zk).below_min_isr_if_stopped(1)
    finally:
        _set(zk, "/config/brokers/3", None)


def test_static_default_from_the_inventory_or_a_parameter(configs: Any) -> None:
    zk = configs
    below = Cluster(zk, default_min_isr=2).below_min_isr_if_stopped(1)
    assert len(below) == 1 and "min.insync.replicas 2 from the brokers' static default" in below[0]
    # the dynamic cluster-wide default overrides server.properties, as in Kafka
    _set(zk, DEFAULT, "1")
    assert Cluster(zk, default_min_isr=2).below_min_isr_if_stopped(1) == []
    _set(zk, DEFAULT, None)
    _set(zk, "/config/topics/t", "1")
    assert Cluster(zk, default_min_isr=2).below_min_isr_if_stopped(1) == []
    p = next(p for p in Cluster(zk, default_min_isr=2).partitions() if p["partition"] == 0)
    assert p["min_isr"] == 1 and p["min_isr_source"] == "/config/topics/t"
    with pytest.raises(ValueError, match="default_min_isr"):
        Cluster(zk, default_min_isr=0)


def test_an_invalid_value_is_refused_not_read_as_one(configs: Any) -> None:
    _set(configs, DEFAULT, "two")
    with pytest.raises(ValueError, match=r"/config/brokers/<default>.*'two'"):
        Cluster(configs).below_min_isr_if_stopped(1)


def _risk_line(facts: FleetFacts, static: int | None = None) -> tuple[dict[str, Any], str]:
    """The plan's risk for restarting brokers 1 and 3, as ``tasks.plan_from`` counts it, and its Risk line."""
    known, cluster_default = facts.cluster_default_min_isr()
    risk = restart_risk(facts, [1, 3], static, cluster_default, known)
    plan = Plan("c1", "run1", {}, [BrokerPlan(b, False, True, [], None) for b in (1, 3)], [], [], risk)
    lines = approval_text.repair_markdown(plan).splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("- **Risk:**"))
    return risk, "\n".join([lines[start], *(x for x in lines[start + 1 :] if x.startswith("  - "))])


def test_the_audit_stages_the_cluster_default_and_the_risk_line_counts_with_it(
    server: ZooKeeperServer, configs: Any, tmp_path: Path
) -> None:
    """The audit's ZooKeeper snapshot (the live reader, staged as the run's cluster metadata) carries
    /config/brokers/<default>, so the approval's Risk line counts with the default the pre-check will use: set to 2
    through kazoo, stopping broker 1 takes t-0 (ISR [1, 2]) under it, as the gate says; absent, the static default
    counts (known, not "not known"); a bad value is an error naming the znode, and the line says the default is not
    known (the gate refuses it)."""
    store = Store(tmp_path / "store")

    def staged(run: str) -> FleetFacts:
        snapshot_zookeeper(server.connect + CHROOT, store, layout.staging(run).cluster_metadata)
        return FleetFacts.load(store, layout.staging(run))

    _set(configs, DEFAULT, "2")
    facts = staged("two")
    (c,) = [r for r in facts.zk if r["kind"] == "cluster"]
    assert c["cluster_default_config"] == {"min.insync.replicas": "2"} and c["cluster_default_min_insync_replicas"] == 2
    assert c["error"] is None and facts.cluster_default_min_isr() == (True, 2)
    risk, line = _risk_line(facts, static=1)  # ZooKeeper's default over the static one, as the gate
    assert risk["min_isr"] == 2 and risk["cluster_default_known"] and "thinnest" not in risk
    assert risk["brokers"]["1"]["under_min_isr"] == 1 and risk["brokers"]["3"]["under_min_isr"] == 0
    assert "while broker 1 is down, 1 partition(s) go under min.insync.replicas (`t-0`)" in line
    assert "not known" not in line and "broker 3" not in line
    assert [p.split(" ")[0] for p in Cluster(configs, default_min_isr=1).below_min_isr_if_stopped(1)] == ["t-0"]

    _set(configs, DEFAULT, None)
    facts = staged("none")
    assert facts.cluster_default_min_isr() == (True, None)  # read: ZooKeeper holds none
    risk, line = _risk_line(facts, static=2)
    assert risk["min_isr_source"] == "the brokers' static default (inventory or form)" and "`t-0`" in line
    risk, line = _risk_line(facts)
    assert risk["min_isr"] == 1 and "none seen at audit time" in line and "Kafka's default" in line
    assert "not known" not in line and Cluster(configs).below_min_isr_if_stopped(1) == []

    _set(configs, DEFAULT, "two")
    facts = staged("bad")
    (c,) = [r for r in facts.zk if r["kind"] == "cluster"]
    assert c["cluster_default_min_insync_replicas"] is None
    assert "znode /kafka/config/brokers/<default>: min.insync.replicas 'two' is not a positive integer" in c["error"]
    assert facts.cluster_default_min_isr() == (False, None)
    risk, line = _risk_line(facts)
    assert "cluster default min.insync.replicas not known" in line and "`t-0`" in line  # the thinnest partition
    with pytest.raises(ValueError, match=r"/config/brokers/<default>.*'two'"):
        Cluster(configs).below_min_isr_if_stopped(1)


def _inv(**extra: Any) -> dict[str, Any]:
    broker = {
        "id": 1,
        "host": "127.0.0.1",
        "ssh_port": 22,
        "ssh_user": "k",
        "ssh_key_file": "/k",
        "host_key": "ssh-ed25519 AAAA",
        "log_dirs": ["/d"],
        "kafka_version": "3.6.2",
        "service": {"stop": "x", "start": "y", "status": "z"},
    }
    return {"inventory_version": 1, "cluster": "c1", "zookeeper": "h:2181/kafka", "brokers": [broker], **extra}


def test_inventory_min_insync_replicas(tmp_path: Path) -> None:
    assert inventory.parse(_inv()).min_insync_replicas is None
    inv = inventory.parse(_inv(min_insync_replicas=2))
    assert inv.min_insync_replicas == 2
    inv.save(tmp_path / "inv.json")
    assert inventory.load(tmp_path / "inv.json") == inv
    for bad in (0, -1, "2", True, 1.5):
        with pytest.raises(inventory.InventoryError, match="min_insync_replicas"):
            inventory.parse(_inv(min_insync_replicas=bad))
