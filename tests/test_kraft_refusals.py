"""Every refusal a KRaft repair or restore must make (``repair.kraft_refusals``; issue 30, "What a KRaft repair
does, and what it refuses"), each with the file it names and the reason Kafka gives, and what stays allowed: the
quarantine of an untrimmed or corrupt index, of cleaner leftovers, of a stray replica's files."""

from __future__ import annotations

import pytest

from fleet_doctor.repair.kraft_refusals import (
    action_refusal,
    impaired_refusal,
    plan_refusals,
    zookeeper_write_refusal,
)
from fleet_doctor.repair.plan import FileAction
from fleet_doctor.repair.quorum import QuorumView, Voter

DATA = "/var/lib/kafka/data"  # a combined node's log dir: also its metadata log dir
META = f"{DATA}/__cluster_metadata-0"


def act(action: str, path: str, rule: str = "index-untrimmed") -> FileAction:
    return FileAction(action, path, rule, "orders", 0, "test")


@pytest.mark.parametrize(
    ("action", "path", "says"),
    [
        ("remove", f"{DATA}/orders-0/partition.metadata", "KAFKA-16814"),
        ("quarantine", f"{DATA}/orders-0/partition.metadata", "-stray"),
        ("restore", f"{DATA}/orders-0/partition.metadata", "isStrayKraftReplica"),
        ("remove", f"{META}/quorum-state", "vote twice in one epoch"),
        ("restore", f"{META}/quorum-state", "vote twice"),
        ("remove", f"{META}/00000000000000000000.log", "roll back"),
        ("quarantine", f"{META}/00000000000000000000.index", "kafka-storage.sh"),
        ("remove", f"{META}/00000000000000004096-0000000002.checkpoint", "missing committed records"),
        ("restore", f"{META}/00000000000000000000.log", "format with the same cluster id"),
        ("remove", f"{META}/../{'__cluster_metadata-0'}/leader-epoch-checkpoint", "__cluster_metadata-0"),
        ("remove", f"{DATA}/.kafka_cleanshutdown", "KIP-966"),
        ("restore", f"{DATA}/meta.properties", "node.id and directory.id"),
        ("remove", f"{DATA}/meta.properties", "re-formatted"),
    ],
)
def test_each_refused_change_names_its_file_and_kafkas_reason(action: str, path: str, says: str) -> None:
    why = action_refusal(act(action, path), [DATA])
    assert why is not None and says in why and why.startswith(path.replace("/../__cluster_metadata-0", "")[:20])


@pytest.mark.parametrize(
    ("action", "path"),
    [
        ("quarantine", f"{DATA}/orders-0/00000000000000000000.index"),  # seed-000 on a KRaft broker
        ("quarantine", f"{DATA}/orders-0/00000000000000000000.timeindex"),
        ("quarantine", f"{DATA}/orders-0/00000000000000000000.log.swap"),  # cleaner leftovers
        ("quarantine", f"{DATA}/orders-0/00000000000000000000.log.cleaned"),
        ("quarantine", f"{DATA}/orders-0/00000000000000000000.log.deleted"),
        ("quarantine", f"{DATA}/orders-0.0123456789abcdef0123456789abcdef-stray/00000000000000000000.log"),
        ("restore", f"{DATA}/orders-0/00000000000000000000.index"),  # a restore of what was quarantined
    ],
)
def test_what_a_kraft_repair_does_stays_allowed(action: str, path: str) -> None:
    assert action_refusal(act(action, path), [DATA]) is None


def test_a_plan_gets_every_refusal_in_order() -> None:
    actions = [
        act("quarantine", f"{DATA}/orders-0/00000000000000000000.index"),
        act("remove", f"{DATA}/orders-1/partition.metadata", "topic-id-mismatch"),
        act("remove", f"{META}/quorum-state", "quorum-state-divergent"),
    ]
    found = plan_refusals(actions, [DATA])
    assert [w.split(":")[0] for w in found] == [f"{DATA}/orders-1/partition.metadata", f"{META}/quorum-state"]
    assert plan_refusals(actions[:1], [DATA]) == []


def test_the_zookeeper_write_and_more_than_one_impaired_voter_are_refused() -> None:
    assert "no ZooKeeper" in zookeeper_write_refusal("prod") and "Nothing was written" in zookeeper_write_refusal("p")
    one_down = QuorumView((Voter(1, 50, 1, 3), Voter(2, 50, 1, 3), Voter(3, None, error="cannot connect")), 0.0)
    assert impaired_refusal(one_down) is None  # one impaired: the quorum gate decides per node
    ok = [Voter(n, 50, 1, 3) for n in (1, 2, 3)]
    two = QuorumView((*ok, Voter(4, None, error="cannot connect"), Voter(5, 10, 1, 3)), 0.0)
    why = impaired_refusal(two)
    assert why is not None and "2 voters of 5 are impaired" in why
    assert "node 5: log end 10, high watermark 50" in why
    assert "node 4: cannot connect" in why and "no supported procedure" in why
    both_down = QuorumView((ok[0], Voter(2, None, error="down"), Voter(3, None, error="down")), 0.0)
    assert "3 voters of 3 are impaired" in (impaired_refusal(both_down) or "")  # no majority: nothing is committed
