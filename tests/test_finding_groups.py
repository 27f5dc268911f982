"""Repeated findings grouped by (broker, rule, cause), on the findings the corpus fleet gives (recorded in
tests/data/detection-findings: every rule firing on real Kafka files and their mutations)."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from fleet_doctor.finding_groups import cause_of, group_findings

DATA = Path(__file__).parent / "data" / "detection-findings"


@pytest.fixture(scope="module")
def mutated() -> list[dict]:
    with gzip.open(DATA / "mutated.jsonl.gz", "rt") as f:
        return [r for r in map(json.loads, f) if "rule" in r]


def test_every_finding_is_in_exactly_one_group(mutated: list[dict]) -> None:
    groups = group_findings(mutated)
    assert sum(g.count for g in groups) == len(mutated)
    seen = Counter(json.dumps(f, sort_keys=True) for g in groups for f in g.findings)
    assert seen == Counter(json.dumps(f, sort_keys=True) for f in mutated)
    assert len(groups) < len(mutated) / 5  # repeated findings said once


def test_an_unclean_brokers_untrimmed_indexes_are_one_group(mutated: list[dict]) -> None:
    untrimmed = [f for f in mutated if f["rule"] == "index-untrimmed"]
    groups = [g for g in group_findings(untrimmed)]
    brokers = {f["broker_id"] for f in untrimmed}
    assert sorted(g.broker_id for g in groups) == sorted(brokers)  # offset and time index alike: one cause
    for g in groups:
        assert {f["broker_id"] for f in g.findings} == {g.broker_id}
        assert g.paths == sorted(g.paths) and all(p.endswith(("index", ".timeindex")) for p in g.paths)


def test_different_causes_of_one_rule_stay_apart(mutated: list[dict]) -> None:
    ahead = [f for f in mutated if f["rule"] == "leader-epoch-ahead" and f["broker_id"] == 2]
    causes = {g.cause for g in group_findings(ahead)}
    assert len(causes) == 2, causes  # above ZooKeeper's epoch / starting beyond the log end
    assert all("<path>" in c and "$FLEET" not in c for c in causes)


def test_groups_come_worst_first_and_carry_the_worst_severity() -> None:
    rows = [
        {
            "rule": "index-untrimmed",
            "broker_id": 1,
            "severity": "info",
            "message": "/d/t-0/0.index: x",
            "path": "/d/t-0/0.index",
        },
        {
            "rule": "index-untrimmed",
            "broker_id": 1,
            "severity": "warning",
            "message": "/d/t-1/0.index: x",
            "path": "/d/t-1/0.index",
        },
        {
            "rule": "topic-id-split",
            "broker_id": None,
            "severity": "critical",
            "message": "topic t: split",
            "topic": "t",
        },
    ]
    groups = group_findings(rows)
    assert [(g.rule, g.severity, g.count) for g in groups] == [
        ("topic-id-split", "critical", 1),
        ("index-untrimmed", "warning", 2),
    ]


def test_cause_leaves_out_what_varies_per_file() -> None:
    a = {
        "message": f"/k/payments-3/partition.metadata holds topic ID {'A' * 22} but ZooKeeper /brokers/topics/payments "
        f"has {'B' * 22}",
        "path": "/k/payments-3/partition.metadata",
        "topic": "payments",
    }
    b = {
        "message": f"/k/orders-0/partition.metadata holds topic ID {'C' * 22} but ZooKeeper /brokers/topics/orders "
        f"has {'D' * 22}",
        "path": "/k/orders-0/partition.metadata",
        "topic": "orders",
    }
    assert cause_of(a) == cause_of(b) == "<path> holds topic ID <topic-id> but ZooKeeper <path> has <topic-id>"
    assert cause_of({"message": None}) == ""
