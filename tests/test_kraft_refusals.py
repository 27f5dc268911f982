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


# ---- the KRaft planner: what it plans, what it leaves out (repair.planner with kraft=True)
STRAY_DIR = f"{DATA}/orders-0.0123456789abcdef0123456789abcdef-stray"
LIVE_ID, OLD_ID, GONE_ID = "LiveLiveLiveLiveLive0A", "OldOldOldOldOldOldOl0A", "GoneGoneGoneGoneGone0A"


def kraft_facts(stray_topic_id: str | None, topic: str = "orders") -> object:
    from fleet_doctor.repair.planner import FleetFacts

    probe = {
        2: [
            {"kind": "partition", "path": f"{DATA}/orders-0", "topic": "orders", "partition": 0, "topic_id": LIVE_ID},
            {"kind": "partition", "path": STRAY_DIR, "topic": topic, "partition": 0, "topic_id": stray_topic_id},
            {"kind": "segment", "path": f"{DATA}/orders-0", "base_offset": 0, "has_index": True, "has_timeindex": True},
        ]
    }
    image = [
        {"kind": "cluster", "cluster_id": "CLUSTERCLUSTERCLUSTE0A", "controller_id": 1},
        {"kind": "topic", "topic": "orders", "topic_id": LIVE_ID, "partitions": {"0": [1, 2, 3]}},
        {"kind": "partition_state", "topic": "orders", "partition": 0, "leader": 1, "isr": [1, 2, 3]},
    ]
    return FleetFacts(probe, image)


def stray_finding(path: str = STRAY_DIR) -> dict[str, object]:
    return {"rule": "stray-dir", "broker_id": 2, "topic": "orders", "partition": 0, "segment": None, "path": path}


@pytest.mark.parametrize(
    ("on_disk", "proof"),
    [(OLD_ID, f"an older incarnation of orders (now {LIVE_ID})"), (GONE_ID, "an older incarnation")],
)
def test_a_stray_replica_proven_by_its_topic_id_is_quarantined_whole(on_disk: str, proof: str) -> None:
    from fleet_doctor.repair.plan import planned_path_ok
    from fleet_doctor.repair.planner import build_plan

    plan = build_plan("c", "r", [stray_finding()], kraft_facts(on_disk), kraft=True, metadata_log_dirs=[DATA])  # type: ignore[arg-type]
    (b,) = [b for b in plan.brokers if b.restart]
    (a,) = b.actions
    assert (b.broker_id, a.action, a.path, a.rule) == (2, "quarantine", STRAY_DIR, "stray-dir")
    assert proof in a.reason and "fleet-doctor-stray-quarantine" in a.reason and plan.skipped == ()
    assert b.backup_paths == []  # moved whole, never copied into a backup
    assert planned_path_ok("quarantine", STRAY_DIR, [DATA]) and not planned_path_ok("remove", STRAY_DIR, [DATA])


def test_a_stray_replica_not_proven_stray_is_left_alone_with_the_reason() -> None:
    from fleet_doctor.repair.planner import build_plan

    cases = [
        (kraft_facts(LIVE_ID), True, "is in the metadata image"),
        (kraft_facts(None), True, "holds no topic ID"),
        (kraft_facts(OLD_ID), False, "on a ZooKeeper cluster"),
    ]
    for facts, kraft, why in cases:
        plan = build_plan("c", "r", [stray_finding()], facts, kraft=kraft, metadata_log_dirs=[DATA])  # type: ignore[arg-type]
        assert not any(b.actions for b in plan.brokers)
        (skipped,) = plan.skipped
        assert why in skipped["why"], skipped
    delete = stray_finding(f"{DATA}/orders-0.0123456789abcdef0123456789abcdef-delete")
    plan = build_plan("c", "r", [delete], kraft_facts(OLD_ID), kraft=True)  # type: ignore[arg-type]
    assert "Kafka's to delete" in plan.skipped[0]["why"]


def test_the_kraft_plan_leaves_out_the_topic_id_files_and_the_zookeeper_write_with_the_refusal() -> None:
    from fleet_doctor.repair.planner import build_plan

    mismatch = {**stray_finding(f"{DATA}/orders-0/partition.metadata"), "rule": "topic-id-mismatch"}
    facts = kraft_facts(OLD_ID)
    facts.probe[2][0]["topic_id"] = OLD_ID  # type: ignore[attr-defined]
    facts.probe[2][0]["partition_metadata_present"] = True  # type: ignore[attr-defined]
    missing_id = {**stray_finding(None), "rule": "topic-id-missing-in-zk", "topic": "orders"}  # type: ignore[arg-type]
    plan = build_plan("c", "r", [mismatch, missing_id], facts, kraft=True, metadata_log_dirs=[DATA])  # type: ignore[arg-type]
    assert not any(b.actions for b in plan.brokers) and plan.zookeeper == ()
    whys = [s["why"] for s in plan.skipped]
    assert sum("KAFKA-16814" in w for w in whys) == 1  # the finding's whole remedy, not half of it
    assert any("it has no ZooKeeper" in w for w in whys), whys


def leftover_facts(*names: str, pdir: str = f"{DATA}/orders-0") -> object:
    """Broker 2's probe with segment_leftover file records of ``names`` in ``pdir`` (as the probe prints them)."""
    from fleet_doctor.probe import parse_segment_file_name

    facts = kraft_facts(LIVE_ID)
    for name in names:
        base, ext, suffix = parse_segment_file_name(name)  # type: ignore[misc]
        rec = {"kind": "file", "file_type": "segment_leftover", "path": f"{pdir}/{name}", "base_offset": base}
        facts.probe[2].append(rec | {"segment_file": ext, "leftover": suffix})  # type: ignore[attr-defined]
    return facts


def leftover_finding(name: str, pdir: str = f"{DATA}/orders-0") -> dict[str, object]:
    base = int(name[:20])
    return {"rule": "segment-leftover", "broker_id": 2, "topic": "orders", "partition": 0, "segment": base} | {
        "path": f"{pdir}/{name}"
    }


@pytest.mark.parametrize("kraft", [True, False], ids=["kraft", "zookeeper"])
def test_cleaner_and_deletion_leftovers_are_quarantined_and_a_swap_is_left_to_kafka(kraft: bool) -> None:
    """Issue 30: leftover .deleted / .cleaned files are quarantined (Kafka deletes them at start anyway), never copied
    into a backup; a .swap is left alone (Kafka completes it, and it may hold the only copy of its records), and so
    is a .cleaned beside a .swap (Kafka decides which swaps to delete from the lowest .cleaned base offset)."""
    from fleet_doctor.repair.plan import planned_path_ok
    from fleet_doctor.repair.planner import build_plan

    names = [
        "00000000000000000000.log.deleted",
        "00000000000000000000.index.deleted",
        "00000000000000000007.log.cleaned",
    ]
    findings = [leftover_finding(n) for n in names]
    plan = build_plan("c", "r", findings, leftover_facts(*names), kraft=kraft, metadata_log_dirs=[DATA])  # type: ignore[arg-type]
    (b,) = [b for b in plan.brokers if b.restart]
    assert [(a.action, a.path.rsplit("/", 1)[1]) for a in b.actions] == [("quarantine", n) for n in sorted(names)]
    assert all("Kafka deletes it at its next start" in a.reason for a in b.actions) and plan.skipped == ()
    assert b.backup_paths == []  # moved, never copied: a .log.deleted is up to a segment's size
    assert all(planned_path_ok("quarantine", a.path, [DATA]) for a in b.actions)
    assert not planned_path_ok("quarantine", f"{DATA}/orders-0/00000000000000000000.log.swap", [DATA])
    assert not planned_path_ok("quarantine", f"{DATA}/orders-0/00000000000000000000.log", [DATA])
    from fleet_doctor.repair.approval_text import repair_markdown

    text = repair_markdown(plan)  # the approver reads that they are moved, not copied, and nothing is backed up
    assert "quarantine 3 leftover .deleted / .cleaned file(s) (Kafka deletes them at its next start" in text, text
    assert "0 file(s) backed up first, 0 removed, 3 quarantined" in text and "moved, never copied" in text

    swapping = ["00000000000000000000.log.swap", "00000000000000000000.index.cleaned"]
    plan = build_plan("c", "r", [leftover_finding(n) for n in swapping], leftover_facts(*swapping), kraft=kraft)  # type: ignore[arg-type]
    assert not any(b.actions for b in plan.brokers)
    whys = {s["path"].rsplit("/", 1)[1]: s["why"] for s in plan.skipped}
    assert "Kafka completes a .swap at its next start" in whys["00000000000000000000.log.swap"]
    assert "KAFKA-6264" in whys["00000000000000000000.index.cleaned"]

    # a leftover no longer there when the plan is built from the probe is not planned; one in a -delete dir is Kafka's
    gone = build_plan("c", "r", [leftover_finding(names[0])], leftover_facts(), kraft=kraft)  # type: ignore[arg-type]
    assert not any(b.actions for b in gone.brokers)
    doomed = f"{DATA}/orders-0.0123456789abcdef0123456789abcdef-delete"
    plan = build_plan(
        "c", "r", [leftover_finding(names[0], doomed)], leftover_facts(names[0], pdir=doomed), kraft=kraft
    )  # type: ignore[arg-type]
    assert not any(b.actions for b in plan.brokers) and "not in a live partition dir" in plan.skipped[0]["why"]


def test_a_running_broker_is_not_restarted_for_its_leftovers_alone() -> None:
    """On a running broker a .deleted file is retention's or the cleaner's, deleted by the broker itself after
    file.delete.delay.ms, and a .cleaned file is the cleaner at work: leftovers alone plan no restart there. A broker
    the plan restarts anyway (here for a stray replica) has them moved aside."""
    from fleet_doctor.repair.planner import build_plan

    name = "00000000000000000000.log.deleted"
    facts = leftover_facts(name)
    facts.probe[2].append({"kind": "logdir", "path": DATA, "lock_held_by_pid": 4242})  # type: ignore[attr-defined]
    plan = build_plan("c", "r", [leftover_finding(name)], facts, kraft=True, metadata_log_dirs=[DATA])  # type: ignore[arg-type]
    assert not any(b.restart for b in plan.brokers)
    (skipped,) = plan.skipped
    assert "the broker was running at the audit and has nothing else to repair" in skipped["why"]
    facts.probe[2][1]["topic_id"] = OLD_ID  # type: ignore[attr-defined]  # its stray replica: proven stray
    plan = build_plan("c", "r", [leftover_finding(name), stray_finding()], facts, kraft=True, metadata_log_dirs=[DATA])  # type: ignore[arg-type]
    (b,) = [b for b in plan.brokers if b.restart]
    assert sorted(a.rule for a in b.actions) == ["segment-leftover", "stray-dir"] and plan.skipped == ()


def test_a_leftover_of_the_metadata_log_is_refused_on_kraft() -> None:
    """Kafka renames a metadata log segment a snapshot covers to .deleted before deleting it: on a voter it is the
    metadata log's, refused like the rest of __cluster_metadata-0."""
    from fleet_doctor.repair.planner import build_plan

    mdir, name = f"{DATA}/__cluster_metadata-0", "00000000000000000000.log.deleted"
    finding = leftover_finding(name, mdir)
    plan = build_plan("c", "r", [finding], leftover_facts(name, pdir=mdir), kraft=True, metadata_log_dirs=[DATA])  # type: ignore[arg-type]
    assert not any(b.actions for b in plan.brokers)
    (skipped,) = plan.skipped
    assert skipped["path"] == f"{mdir}/{name}" and "__cluster_metadata-0 is refused on a voter" in skipped["why"]
