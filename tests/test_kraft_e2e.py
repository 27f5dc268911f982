"""The audit DAG end to end on a 3-node KRaft fleet lab (combined mode, no ZooKeeper): real sshd, the lab's quorum
writing Kafka's metadata log, Spark (local) and Airflow (SQLite, `airflow dags test`). The cluster facts come from
the controllers' metadata logs read over SSH; expected findings come from what the incidents did on disk."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_lab import demo
from fleet_lab import fleet as lab
from fleet_lab.incidents import inject

pytestmark = pytest.mark.timeout(1800)

# (incident, options): one per new KRaft rule that leaves the quorum running, and KRaft's take on old ones
INCIDENTS: list[tuple[str, dict[str, Any]]] = [
    ("kraft-stray-replica", {"topic": "clickstream"}),  # RF 2: a node holds no replica
    ("topic-id-mismatch", {"broker": 3, "topic": "payments"}),
    ("quorum-state-divergent", {"broker": 3}),
    ("stray-dir", {"broker": 1, "topic": "clickstream", "suffix": "stray"}),
    ("index-bad-size", {"broker": 1, "topic": "orders"}),
]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("kraft-audit")
    lab_dir, home, data = root / "lab", root / "airflow", root / "data"
    state = lab.up(lab_dir, brokers=3, metadata="kraft")
    try:
        env = demo.airflow_environ(home, lab_dir, data)
        env["FLEET_DOCTOR_STAGE_RETRY_DELAY"] = "1"
        demo.prepare(env)
        store = Path(demo.store_of(data).base)  # the lab cluster's store: clusters/lab/
        yield {"state": state, "env": env, "data": data, "home": home, "lab_dir": lab_dir, "store": store}
    finally:
        lab.down(lab_dir)


def audit(fleet: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    r = demo.run_audit(fleet["env"], timeout=900)
    out = r.stdout[-4000:] + r.stderr[-4000:]
    assert r.returncode == 0, out
    summary = demo.latest_summary(fleet["data"])
    assert summary is not None, out
    rows_path = fleet["store"] / "history" / f"audit_run={summary['audit_run']}" / "findings.jsonl"
    return summary, [json.loads(line) for line in rows_path.read_text().splitlines()], out


def open_findings(rows: list[dict[str, Any]], *severities: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["severity"] in severities and r["status"] != "resolved"]


def test_kraft_audit_end_to_end(fleet: dict[str, Any]) -> None:
    state: lab.LabState = fleet["state"]
    inventory = json.loads((fleet["lab_dir"] / "inventory.json").read_text())
    assert inventory["metadata_mode"] == "kraft" and "zookeeper" not in inventory
    leader = lab.quorum_leader(state)
    assert leader is not None

    # 1. a healthy KRaft lab: every broker audited, the cluster facts from a controller's metadata log, no finding
    summary, rows, _ = audit(fleet)
    assert summary["audited"] == [1, 2, 3] and summary["not_audited"] == []
    assert summary["metadata_mode"] == "kraft"
    source = summary["metadata_source"]
    assert source["controller"] in (1, 2, 3) and source["log_end_offset"] > 0, source
    assert (source["active_controller"], source["active_controller_epoch"]) == leader, source
    assert open_findings(rows, "critical", "warning", "info") == [], rows
    staged = fleet["store"] / "staging"
    cluster_files = sorted(staged.glob("*/cluster-metadata.jsonl"))
    assert cluster_files, "no cluster metadata staged"
    records = [json.loads(line) for line in cluster_files[-1].read_text().splitlines()]
    assert records[0]["kind"] == "cluster_metadata" and records[-1]["kind"] == "cluster_metadata_end"
    # the staged facts are the lab's metadata as the decoder reads it on the host: same topics, IDs, assignments
    truth = lab.read_metadata(state)
    topics = {r["topic"]: (r["topic_id"], r["partitions"]) for r in records if r["kind"] == "topic"}
    assert topics == {r["topic"]: (r["topic_id"], r["partitions"]) for r in truth if r["kind"] == "topic"}
    controllers = [json.loads(line) for line in sorted(staged.glob("*/controllers.jsonl"))[-1].read_text().splitlines()]
    assert sorted(r["node_id"] for r in controllers if r["kind"] == "cluster_metadata") == [1, 2, 3]
    html = Path(summary["report"]).read_text()
    assert f"controller {source['controller']}" in html

    # 2. incidents on different nodes: each found with its rule and node, and its files
    injected = [inject(state, name, **opts) for name, opts in INCIDENTS]
    summary, rows, _ = audit(fleet)
    for inj in injected:
        hits = [
            f
            for f in rows
            if f["rule"] == inj.rule
            and f.get("broker_id") == inj.broker_id
            and (inj.topic is None or f.get("topic") == inj.topic)
            and (inj.partition is None or f.get("partition") == inj.partition)
        ]
        assert hits, f"{inj.incident}: no {inj.rule} finding on node {inj.broker_id} ({inj.topic}-{inj.partition})"
        if inj.paths:
            assert any(str(f.get("path")).startswith(tuple(inj.paths)) for f in hits), (inj.paths, hits)
        assert all(f["status"] == "new" for f in hits)
    by_rule = {f["rule"]: f for f in rows}
    # KRaft wording, not ZooKeeper's
    assert "ZooKeeper" not in by_rule["topic-id-mismatch"]["message"], by_rule["topic-id-mismatch"]["message"]
    assert by_rule["quorum-state-divergent"]["severity"] == "critical"
    # a 3.7 broker renames a stray replica aside at its next start: a warning, not data loss
    assert by_rule["stray-replica"]["severity"] == "warning"


def test_the_kraft_plan_leaves_out_what_kafka_refuses_there(fleet: dict[str, Any]) -> None:
    """The repair's plan on the audited KRaft lab (its incidents above): the index is quarantined; the replica whose
    partition.metadata holds another topic ID is not touched (on KRaft a missing file makes the replica stray:
    KAFKA-16814), the refusal saying why and what to do instead; no ZooKeeper write is planned."""
    from fleet_doctor.repair import tasks
    from fleet_doctor.settings import Settings

    state: lab.LabState = fleet["state"]
    settings = Settings(inventory=state.inventory_path, data_root=fleet["data"], cluster=state.cluster)
    planned = tasks.make_plan(settings, {"audit_run": "latest"})
    plan = json.loads((settings.repairs / planned["hash"] / "plan.json").read_text())
    actions = [a for b in plan["brokers"] for a in b["actions"]]
    assert actions and {a["action"] for a in actions} == {"quarantine"}, actions
    assert {a["rule"] for a in actions} == {"index-size"}  # the index-bad-size incident's rule
    assert not any(a["path"].endswith("partition.metadata") for a in actions)
    refused = [s for s in plan["skipped"] if "KAFKA-16814" in (s.get("why") or "")]
    assert refused and all(s["rule"] == "topic-id-mismatch" and s["broker_id"] == 3 for s in refused), refused
    assert plan["zookeeper"] == [] and planned["counts"]["zookeeper_actions"] == 0
    assert "KAFKA-16814" in planned["markdown"]  # the approver reads why it was left out
