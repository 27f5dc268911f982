"""The roll's plan (``repair.roll_plan``): partition-disjoint and rack-aware batches, the order (voters after the
brokers, the active controller last and alone), the batch gate, the preferred elections, the prediction."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from fleet_doctor.repair.plan import Plan, RestartPreview
from fleet_doctor.repair.roll_plan import (
    Batch,
    batch_below_min_isr,
    batches_of,
    build_roll_plan,
    leadership_balance,
    plan_batches,
    predict,
    preferred_elections,
    shared_partitions,
    spans_racks,
)


def rack_aware_cluster(brokers: int = 30, racks: int = 3, topics: int = 10, parts: int = 12, rf: int = 3):
    """Kafka's rack-aware assignment in spirit: brokers interleaved by rack, each partition's replicas on ``rf``
    consecutive brokers of that interleaving (so on ``rf`` distinct racks), its first replica the preferred leader."""
    rack_of = {b: f"rack-{b % racks}" for b in range(1, brokers + 1)}
    interleaved = sorted(rack_of, key=lambda b: (b // racks, b % racks))
    partitions = []
    n = 0
    for t in range(topics):
        for p in range(parts):
            start = n % brokers
            n += 1
            replicas = [interleaved[(start + i) % brokers] for i in range(rf)]
            partitions.append(
                {
                    "topic": f"t{t}",
                    "partition": p,
                    "replicas": replicas,
                    "isr": list(replicas),
                    "leader": replicas[0],
                    "min_isr": 2,
                }
            )
    return rack_of, partitions


def test_rack_aware_batches_are_the_racks_and_share_no_partition() -> None:
    racks, partitions = rack_aware_cluster()
    assert spans_racks(partitions, racks)
    batches = plan_batches(sorted(racks), partitions, racks, controller=7, batched=True)
    assert [b.brokers for b in batches][-1] == (7,)
    assert batches[-1].why == "the active controller, last"
    body = batches[:-1]
    assert len(body) == 3
    for batch in body:
        assert len({racks[b] for b in batch.brokers}) == 1, batch
        assert shared_partitions(batch.brokers, partitions) == []
        assert batch_below_min_isr(batch.brokers, partitions) == []
    assert sorted(itertools.chain.from_iterable(b.brokers for b in batches)) == sorted(racks)


def test_without_racks_the_batches_are_still_partition_disjoint() -> None:
    _racks, partitions = rack_aware_cluster(brokers=12, racks=3)
    batches = plan_batches(list(range(1, 13)), partitions, {}, controller=None, batched=True)
    assert all(b.why.startswith("partition-disjoint") for b in batches)
    assert len(batches) < 12  # some brokers do share a stop
    for batch in batches:
        assert shared_partitions(batch.brokers, partitions) == []
    assert sorted(itertools.chain.from_iterable(b.brokers for b in batches)) == list(range(1, 13))


def test_a_broker_that_would_leave_a_partition_at_min_isr_goes_alone() -> None:
    racks, partitions = rack_aware_cluster(brokers=6, racks=3, topics=2, parts=6)
    strict = dict(partitions[0], min_isr=3)  # RF 3, min ISR 3: none of its replicas may share a stop (nor stop)
    partitions = [strict, *partitions[1:]]
    batches = plan_batches(sorted(racks), partitions, racks, controller=None, batched=True)
    alone = [b for b in batches if b.why.startswith("alone")]
    assert sorted(b.brokers[0] for b in alone) == sorted(strict["replicas"])
    assert all("t0-0" in b.why for b in alone)
    # a margin of one asks for 3 in-sync replicas left of every RF 3 partition: nobody shares a stop
    margin = plan_batches(sorted(racks), partitions, racks, controller=None, batched=True, isr_margin=1)
    assert all(len(b.brokers) == 1 for b in margin)


def test_max_batch_caps_a_batch_and_one_at_a_time_is_the_default() -> None:
    racks, partitions = rack_aware_cluster()
    capped = plan_batches(sorted(racks), partitions, racks, controller=None, batched=True, max_batch=4)
    assert max(len(b.brokers) for b in capped) == 4
    assert len(capped) == 9  # 3 racks of 10: 4 + 4 + 2 each
    single = plan_batches(sorted(racks), partitions, racks, controller=3)
    assert [b.brokers for b in single] == [(b,) for b in sorted(racks) if b != 3] + [(3,)]


def test_kraft_voters_go_one_at_a_time_after_the_brokers_the_active_one_last() -> None:
    racks, partitions = rack_aware_cluster(brokers=9, racks=3, topics=3, parts=3)
    batches = plan_batches(sorted(racks), partitions, racks, controller=2, voters=(1, 2, 3), batched=True)
    tail = [b.brokers for b in batches[-3:]]
    assert tail == [(1,), (3,), (2,)]
    assert all(not ({1, 2, 3} & set(b.brokers)) for b in batches[:-3])


def test_the_batch_gate_counts_the_whole_batch() -> None:
    p = {"topic": "a", "partition": 0, "replicas": [1, 2, 3], "isr": [1, 2, 3], "leader": 1, "min_isr": 2}
    assert batch_below_min_isr([1], [p]) == []
    assert batch_below_min_isr([1, 2], [p]) == ["a-0 (ISR [1, 2, 3], min ISR 2)"]
    # the margin applies to a batch, not to a broker that stops alone (that is the plain pre-check's rule)
    assert batch_below_min_isr([1], [p], isr_margin=1) == []
    q = dict(p, replicas=[1, 2, 3, 4], isr=[1, 2, 3, 4])
    assert batch_below_min_isr([1, 5], [q], isr_margin=1) == []
    assert batch_below_min_isr([1, 5], [q], isr_margin=2) != []


def test_preferred_elections_name_exactly_the_brokers_partitions() -> None:
    parts = [
        {"topic": "a", "partition": 0, "replicas": [2, 1, 3], "isr": [1, 2, 3], "leader": 1, "min_isr": 1},
        {"topic": "a", "partition": 1, "replicas": [2, 3, 1], "isr": [2, 3, 1], "leader": 2, "min_isr": 1},
        {"topic": "a", "partition": 2, "replicas": [2, 3, 1], "isr": [3, 1], "leader": 3, "min_isr": 1},
        {"topic": "b", "partition": 0, "replicas": [1, 2, 3], "isr": [1, 2, 3], "leader": 3, "min_isr": 1},
    ]
    elect, blocked = preferred_elections(parts, 2)
    assert elect == [("a", 0)]
    assert blocked == ["a-2: its preferred replica 2 is not in ISR [3, 1]"]
    assert leadership_balance(parts) == {"partitions": 4, "not_preferred": 3, "leaders": {1: 1, 2: 1, 3: 2}}


def preview(running: bool, clean: bool | None, above: int, rebuild: int = 0) -> RestartPreview:
    return RestartPreview(clean, running, 2, above, 0, rebuild, 0.0)


def test_the_prediction_counts_recovery_and_the_slowest_of_a_batch() -> None:
    batches = [Batch((1, 2), "x"), Batch((3,), "y")]
    rate = 100.0
    previews = {1: preview(True, None, 10_000), 2: preview(False, False, 2_000), 3: preview(False, True, 500, 100)}
    got = predict(batches, previews, isr_wait_s=30, pause_s=60, recovery_bytes_per_s=rate)
    b = got["brokers"]
    assert b["1"] == {"recovery_s": 0.0, "recovery_if_unclean_s": 100.0, "restart_s": 60.0}
    assert b["2"]["recovery_s"] == 20.0  # down after an unclean stop: it recovers, whatever the next stop
    assert b["3"]["recovery_s"] == 1.0  # clean, but an index to rebuild
    assert got["batched_s"] == 80.0 + 61.0 + 60
    assert got["one_at_a_time_s"] == 60.0 + 80.0 + 61.0 + 2 * 60


def test_the_roll_plan_is_hashed_whole_and_reads_back() -> None:
    racks, partitions = rack_aware_cluster(brokers=6, racks=3, topics=2, parts=6)
    kw: dict[str, Any] = dict(
        reason={"kind": "os-patch", "text": "kernel 6.1.119"},
        partitions=partitions,
        racks=racks,
        controller=1,
        hold_out=[6],
        batched=True,
        gates={"healthy_polls": 3},
        recovery_bytes_per_s=1e8,
        isr_wait_s=30,
        pause_s=10,
    )
    plan = build_roll_plan("c", sorted(racks), **kw)
    assert plan.scope["kind"] == "roll"
    assert plan.restart_order[-1] == 1
    assert 6 not in plan.restart_order and plan.skipped[0]["broker_id"] == 6
    assert [b.brokers for b in batches_of(plan)] == [tuple(b["brokers"]) for b in plan.scope["batches"]]
    assert Plan.from_json(plan.to_json()).hash == plan.hash
    assert build_roll_plan("c", sorted(racks), **kw).hash == plan.hash
    other = build_roll_plan("c", sorted(racks), **{**kw, "batched": False})
    assert other.hash != plan.hash
    assert plan.risk["predicted"]["batched_s"] < plan.risk["predicted"]["one_at_a_time_s"]
    with pytest.raises(ValueError, match="reason"):
        build_roll_plan("c", sorted(racks), **{**kw, "reason": {"kind": "because"}})


def test_the_roll_approval_says_what_runs_and_how_long() -> None:
    from fleet_doctor.repair import approval_text

    racks, partitions = rack_aware_cluster(brokers=6, racks=3, topics=2, parts=6)
    previews = {2: RestartPreview(False, False, 3, 300_000_000, 0, 0, 0.0)}  # down after an unclean stop
    plan = build_roll_plan(
        "prod-eu",
        sorted(racks),
        reason={"kind": "upgrade", "text": "3.7.2 -> 3.9.1"},
        partitions=partitions,
        racks=racks,
        controller=1,
        down=[2],
        previews=previews,
        hold_out=[6],
        batched=True,
        gates={"healthy_polls": 3},
        leadership={"via": "kafka-leader-election.sh", "why": "every broker's inventory entry has it"},
        recovery_bytes_per_s=100 * 1024 * 1024,
        isr_wait_s=30,
        pause_s=0,
    )
    asked = approval_text.roll_request(plan)
    steps = len(plan.scope["batches"])
    assert (
        asked.subject
        == f"Kafka roll `prod-eu` plan {plan.hash[:12]}: restart 5 broker(s) in {steps} step(s) (`upgrade`)"
    )
    assert asked.option == f"Approve: restart 5 broker(s) in {steps} step(s) (roll {plan.hash[:12]})"
    body = asked.body
    assert "`3.7.2 -> 3.9.1`" in body and "**Held out:** broker(s) 6." in body
    assert "| 1 | 2 | `rack-2` | `down already: started first (nothing in sync is stopped)` |" in body
    assert "| 5 | 1 | `rack-1` | `the active controller, last` |" in body
    assert "**Log recovery**" in body and "| 2 | 3 s | 3 s |" in body  # 300 MB at 100 MiB/s, certain: it is down
    assert "- **Leadership back:** `kafka-leader-election.sh`" in body and "**Gates:** `healthy_polls` `3`" in body
    assert approval_text.hashes_in(body) == [plan.hash]
