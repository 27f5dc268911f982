"""A rolling restart as data: which brokers restart, in which batches and order, what each restart is predicted to
cost, and which partitions each broker leads again afterwards. Pure functions over what the roll's plan task read
from the live cluster (``ClusterHealth``: partitions with their ISR and min ISR, racks, the controller, the voters)
and from the newest audit (each broker's restart preview); ``repair.roll`` runs the plan.

**Batches** (opt in): brokers that share no partition restart together, so a batch takes at most one replica of any
partition out of its ISR. A broker joins a batch only if every partition whose ISR holds it keeps at least
``min.insync.replicas`` + the plan's ``isr_margin`` in-sync replicas without it; one that does not goes alone (and
when it would take a partition under min ISR even alone, the pre-check refuses it at run time, as for any restart).
When every broker has a rack and every partition's replicas sit in distinct racks, the brokers of one rack share no
partition by construction: the batches are the racks (Strimzi's and Cruise Control's rack-aware rule, turned into a
restart plan). Otherwise the batches are a greedy colouring of the brokers' "share a partition" graph, the most
connected first, brokers of one rack kept together where the graph allows. ``max_batch`` caps a batch's size.

**Order**: brokers that are down already first, together (Strimzi rolls its unready pods first: starting them costs
no replica that is in sync now); then the batches of plain brokers; on KRaft the voters (controllers, combined nodes)
one at a time after them (kraft-reference.md §8: controllers one at a time, the quorum healthy without each); the
active controller last and alone (kafka-reference.md §7: Strimzi, cp-ansible and Yelp's roller all defer it).

**Leadership back** (``preferred_elections``): after a broker is back in ISR, a preferred-leader election for exactly
the partitions whose preferred replica (the first of its replicas) it is and does not lead; a partition whose
preferred replica is not in its ISR cannot move back, and says so.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleet_doctor.repair.plan import BrokerPlan, Plan, RestartPreview
from fleet_doctor.rules import KafkaVersion

ROLL_REASONS = ("config-change", "os-patch", "upgrade", "other")
BATCHING = ("one-at-a-time", "partition-disjoint")
# a broker's restart step by step when no roll of this cluster was measured yet: its controlled shutdown, its start
# to registration, and the leadership election after its ISR is back (the ISR wait is the plan's healthy polls)
DEFAULT_STOP_S = 15.0
DEFAULT_START_S = 10.0
DEFAULT_ELECTION_S = 5.0


# how a broker's partitions move back to it after its restart (``leadership_way``)
LEADERSHIP_VIA_TOOL = "kafka-leader-election.sh"
LEADERSHIP_VIA_ZOOKEEPER = "zookeeper"
LEADERSHIP_OFF = "none"
ELECTION_TOOL_SINCE = KafkaVersion(2, 4)  # kafka-leader-election.sh and the ElectLeaders API (KIP-460)


def leadership_way(inventory: Any) -> dict[str, str]:
    """How a roll of this cluster moves leadership back (hashed into the plan, shown in its approval): the
    inventory's ``leader_election`` command (``kafka-leader-election.sh``, Kafka 2.4+) when every broker has one;
    on ZooKeeper otherwise ``/admin/preferred_replica_election`` (what Kafka's own tool wrote before 2.4, and what the
    controller still acts on in every ZooKeeper-mode release); on KRaft without the command, none, and why."""
    brokers = list(inventory.brokers)
    old = [b.id for b in brokers if KafkaVersion.parse(b.kafka_version) < ELECTION_TOOL_SINCE]
    if brokers and not old and all(b.service.get("leader_election") for b in brokers):
        return {"via": LEADERSHIP_VIA_TOOL, "why": "every broker's inventory entry has service.leader_election"}
    if not inventory.kraft:
        why = f"Kafka before 2.4 on broker(s) {old}" if old else "the inventory has no service.leader_election command"
        return {"via": LEADERSHIP_VIA_ZOOKEEPER, "why": f"{why}: the controller's /admin/preferred_replica_election"}
    return {
        "via": LEADERSHIP_OFF,
        "why": "a KRaft cluster's inventory without service.leader_election (kafka-leader-election.sh): leadership "
        "stays where the restarts leave it",
    }


DOWN_FIRST = "down already: started first (nothing in sync is stopped)"


@dataclass(frozen=True)
class Batch:
    brokers: tuple[int, ...]
    why: str  # how it was formed: "rack a", "partition-disjoint", "the active controller, last", ...

    def to_dict(self) -> dict[str, Any]:
        return {"brokers": list(self.brokers), "why": self.why}


def _replica_sets(partitions: Iterable[Mapping[str, Any]]) -> list[tuple[str, set[int]]]:
    return [(f"{p['topic']}-{p['partition']}", set(p["replicas"])) for p in partitions]


def unbatchable(partitions: Iterable[Mapping[str, Any]], broker_id: int, isr_margin: int) -> list[str]:
    """The partitions that would keep fewer than ``min.insync.replicas`` + ``isr_margin`` in-sync replicas without
    ``broker_id`` (its ISR holds it): a broker with any goes alone."""
    return [
        f"{p['topic']}-{p['partition']} (ISR {list(p['isr'])}, min ISR {p['min_isr']})"
        for p in partitions
        if broker_id in p["isr"] and len(p["isr"]) - 1 < p["min_isr"] + isr_margin
    ]


def spans_racks(partitions: Iterable[Mapping[str, Any]], racks: Mapping[int, str | None]) -> bool:
    """Every replica of every partition has a rack, and no two replicas of a partition share one."""
    for p in partitions:
        rs = [racks.get(r) for r in p["replicas"]]
        if any(r is None for r in rs) or len(set(rs)) != len(rs):
            return False
    return True


def plan_batches(
    brokers: Sequence[int],
    partitions: Sequence[Mapping[str, Any]],
    racks: Mapping[int, str | None],
    *,
    controller: int | None,
    voters: Iterable[int] = (),
    down: Iterable[int] = (),
    batched: bool = False,
    isr_margin: int = 0,
    max_batch: int = 0,
) -> list[Batch]:
    """``brokers`` in the batches and order they restart (module docstring). ``partitions``: ``ClusterHealth``'s
    (topic, partition, replicas, isr, min_isr); ``racks``: each broker's registered rack (None: none); ``down``: the
    brokers not registered now; ``max_batch`` 0: no cap."""
    quorum = set(voters)
    stopped = [b for b in brokers if b in set(down)]
    plain = [b for b in brokers if b not in quorum and b != controller and b not in stopped]
    ordered_voters = [b for b in brokers if b in quorum and b != controller and b not in stopped]
    out: list[Batch] = [Batch(tuple(stopped), DOWN_FIRST)] if stopped else []
    if not batched:
        out += [Batch((b,), "one at a time") for b in plain]
    else:  # batched as the ISR will be once the brokers down now are back (the batch gate reads it live again)
        back = set(stopped)
        after = [
            dict(p, isr=[*p["isr"], *(r for r in p["replicas"] if r in back and r not in p["isr"])]) for p in partitions
        ]
        out += _disjoint_batches(plain, after, racks, isr_margin, max_batch)
    out += [Batch((b,), "a KRaft voter: one at a time, the quorum healthy without it") for b in ordered_voters]
    if controller is not None and controller in brokers:
        out.append(Batch((controller,), "the active controller, last"))
    return out


def _disjoint_batches(
    brokers: list[int],
    partitions: list[Mapping[str, Any]],
    racks: Mapping[int, str | None],
    isr_margin: int,
    max_batch: int,
) -> list[Batch]:
    cap = max_batch if max_batch > 0 else len(brokers) or 1
    alone = {b: unbatchable(partitions, b, isr_margin) for b in brokers}
    lonely = [b for b in brokers if alone[b]]
    batchable = [b for b in brokers if not alone[b]]
    out: list[Batch] = []
    if batchable and spans_racks(partitions, racks):
        by_rack: dict[str, list[int]] = defaultdict(list)
        for b in batchable:
            by_rack[str(racks[b])].append(b)
        for rack, members in sorted(by_rack.items()):
            for i in range(0, len(members), cap):
                out.append(Batch(tuple(members[i : i + cap]), f"rack {rack}: every partition spans racks"))
    elif batchable:
        shares: dict[int, set[int]] = {b: set() for b in batchable}
        for _name, replicas in _replica_sets(partitions):
            hosted = [r for r in replicas if r in shares]
            for r in hosted:
                shares[r].update(x for x in hosted if x != r)
        groups: list[list[int]] = []
        for b in sorted(batchable, key=lambda b: (-len(shares[b]), b)):
            fits = [g for g in groups if len(g) < cap and not shares[b] & set(g)]
            same_rack = [g for g in fits if racks.get(b) is not None and racks.get(g[0]) == racks.get(b)]
            target = (same_rack or fits or [None])[0]
            if target is None:
                groups.append([b])
            else:
                target.append(b)
        out += [Batch(tuple(sorted(g)), "partition-disjoint: no two share a partition") for g in groups]
    for b in lonely:
        out.append(Batch((b,), f"alone: without it {alone[b][0]} would keep too few in-sync replicas to share a stop"))
    return out


def shared_partitions(batch: Iterable[int], partitions: Iterable[Mapping[str, Any]]) -> list[str]:
    """The partitions two or more of ``batch`` host (a plan's batch has none; the executor checks again)."""
    members = set(batch)
    return [name for name, replicas in _replica_sets(partitions) if len(replicas & members) > 1]


def batch_below_min_isr(
    batch: Iterable[int], partitions: Iterable[Mapping[str, Any]], isr_margin: int = 0
) -> list[str]:
    """The partitions that would keep fewer than ``min.insync.replicas`` (+ ``isr_margin`` when more than one broker
    stops) in-sync replicas with all of ``batch`` stopped: the batch's gate, read live before its stop."""
    members = set(batch)
    margin = isr_margin if len(members) > 1 else 0
    out = []
    for p in partitions:
        isr = set(p["isr"])
        if isr & members and len(isr - members) < p["min_isr"] + margin:
            out.append(f"{p['topic']}-{p['partition']} (ISR {sorted(isr)}, min ISR {p['min_isr']})")
    return out


def preferred_elections(
    partitions: Iterable[Mapping[str, Any]], broker_id: int
) -> tuple[list[tuple[str, int]], list[str]]:
    """The partitions ``broker_id`` should lead again (it is their preferred replica, the first of their replicas,
    and does not lead them), as (topic, partition), and those of them that cannot move back now, with why."""
    elect, blocked = [], []
    for p in partitions:
        if not p["replicas"] or p["replicas"][0] != broker_id or p["leader"] == broker_id:
            continue
        if broker_id not in p["isr"]:
            blocked.append(f"{p['topic']}-{p['partition']}: its preferred replica {broker_id} is not in ISR {p['isr']}")
        else:
            elect.append((p["topic"], int(p["partition"])))
    return sorted(elect), blocked


def leadership_balance(partitions: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """How many partitions each broker leads, and how many are led by a replica other than their preferred one."""
    leads: dict[int, int] = defaultdict(int)
    off = 0
    total = 0
    for p in partitions:
        total += 1
        if p["leader"] is not None and p["leader"] >= 0:
            leads[int(p["leader"])] += 1
        if p["replicas"] and p["leader"] != p["replicas"][0]:
            off += 1
    return {"partitions": total, "not_preferred": off, "leaders": dict(sorted(leads.items()))}


# --------------------------------------------------------------------------------------------
# the prediction the approver sees
@dataclass(frozen=True)
class StepTimes:
    """A broker's restart, step by step, in seconds: measured on this cluster's last roll, or the defaults."""

    stop_s: float = DEFAULT_STOP_S
    start_s: float = DEFAULT_START_S
    election_s: float = DEFAULT_ELECTION_S
    source: str = "defaults (no roll of this cluster measured yet)"
    healthy_s: float | None = None  # measured: back in ISR and the healthy polls (None: the plan's polls)
    # measured: a log recovery's bytes per second on this cluster (None: planner.RECOVERY_BYTES_PER_S), and where from
    recovery_bytes_per_s: float | None = None
    recovery_source: str = ""

    @classmethod
    def measured(cls, data: Mapping[str, Any] | None) -> StepTimes:
        """The step times ``measure_steps`` and the recovery rate ``measure_recovery`` wrote after the cluster's last
        rolls that measured them; the defaults for what none measured."""
        data = data or {}
        recovery = data.get("recovery") or {}
        rate = float(recovery["bytes_per_s"]) if recovery.get("bytes_per_s") else None
        rated = (
            f"measured on roll {str(recovery.get('roll', ''))[:12]} of {_day(recovery.get('measured_at'))}, median of "
            f"{recovery.get('brokers')} broker(s) that recovered"
            if rate
            else ""
        )
        if "stop_s" not in data:
            return cls(recovery_bytes_per_s=rate, recovery_source=rated)
        return cls(
            float(data["stop_s"]),
            float(data["start_s"]),
            float(data["election_s"]),
            f"measured on roll {str(data.get('roll', ''))[:12]} of {_day(data.get('measured_at'))}, medians of "
            f"{data.get('brokers')} broker(s)",
            float(data["healthy_s"]),
            rate,
            rated,
        )


def _day(ts: Any) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(float(ts or 0)))


MIN_MEASURED_RECOVERY_S = 2.0  # a recovery shorter than this says more about the poll than about the rate


def measure_recovery(
    journal: Mapping[str, Any], plan_hash: str, recovery_bytes: Mapping[int, int]
) -> dict[str, Any] | None:
    """The cluster's log recovery rate from a roll: the median, over its brokers that recovered their logs at their
    start for at least ``MIN_MEASURED_RECOVERY_S`` (journaled ``recovery`` by ``Executor.wait_registered``), of the
    bytes the plan predicted for that recovery (``recovery_bytes``) over the seconds it took. None without one."""
    rates = []
    for bid, b in journal.get("brokers", {}).items():
        seconds = float((b.get("recovery") or {}).get("seconds") or 0)
        size = recovery_bytes.get(int(bid), 0)
        if seconds >= MIN_MEASURED_RECOVERY_S and size > 0:
            rates.append(size / seconds)
    if not rates:
        return None
    return {
        "bytes_per_s": round(statistics.median(rates)),
        "brokers": len(rates),
        "roll": plan_hash,
        "measured_at": time.time(),
    }


def recovery_bytes(plan: Any) -> dict[int, int]:
    """The bytes each broker of ``plan`` recovers at its start as the plan predicted it (``recovery_s``)."""
    return {b.broker_id: _recovered_bytes(b.preview)[0] for b in plan.brokers if b.preview is not None}


def measure_steps(journal: Mapping[str, Any], plan_hash: str) -> dict[str, Any] | None:
    """A broker's restart step by step (stop, start to registered, back in ISR and healthy, leadership back), the
    medians over the brokers a finished roll restarted while running (its journal's timestamps; a broker that was
    down already is left out: its stop took nothing); None when there is none."""
    spans: dict[str, list[float]] = defaultdict(list)
    pairs = (
        ("stop_s", "prechecked", "stopped"),
        ("start_s", "stopped", "started"),
        ("healthy_s", "started", "healthy"),
    )
    pairs += (("election_s", "healthy", "verified"),)
    n = 0
    for b in journal.get("brokers", {}).values():
        last = {h["state"]: h["ts"] for h in b.get("history", []) if isinstance(h.get("ts"), (int, float))}
        if b.get("state") != "done" or not all(k in last for k in ("prechecked", "stopped", "started", "verified")):
            continue
        if (b.get("step") or {}).get("why") == DOWN_FIRST:
            continue  # its stop took nothing
        n += 1
        for name, start, end in pairs:
            if start in last and end in last:
                spans[name].append(max(0.0, last[end] - last[start]))
    if not n or len(spans) < len(pairs):
        return None
    out: dict[str, Any] = {k: round(statistics.median(v), 1) for k, v in spans.items()}
    return out | {"brokers": n, "roll": plan_hash, "measured_at": time.time()}


def recovery_s(preview: RestartPreview | None, recovery_bytes_per_s: float) -> tuple[float, float]:
    """A broker's log recovery at its next start: (predicted, if its stop is not clean). A running broker stopped
    cleanly recovers nothing but the indexes it lacks; one down after an unclean stop, or killed because its
    controlled shutdown did not finish, recovers every segment from the one holding its recovery point
    (kafka-reference.md §2.4)."""
    now, unclean = _recovered_bytes(preview)
    rate = max(recovery_bytes_per_s, 1.0)
    return round(now / rate, 1), round(unclean / rate, 1)


def _recovered_bytes(preview: RestartPreview | None) -> tuple[int, int]:
    """The bytes a broker recovers at its next start: (predicted, if its stop is not clean) (``recovery_s``)."""
    if preview is None:
        return 0, 0
    unclean = preview.bytes_above_recovery_point + preview.bytes_to_rebuild
    return (preview.bytes_to_rebuild if preview.running or preview.last_stop_clean else unclean), unclean


def predict(
    batches: Sequence[Batch],
    previews: Mapping[int, RestartPreview | None],
    *,
    isr_wait_s: float,
    pause_s: float,
    recovery_bytes_per_s: float,
    times: StepTimes = StepTimes(),
) -> dict[str, Any]:
    """The roll's predicted time, batched as planned and one broker at a time, and each broker's share: a batch
    takes as long as its slowest broker (they stop, start and are gated together), then the pause."""
    per_broker: dict[str, dict[str, float]] = {}
    healthy = isr_wait_s if times.healthy_s is None else times.healthy_s
    for batch in batches:
        for b in batch.brokers:
            rec, if_unclean = recovery_s(previews.get(b), recovery_bytes_per_s)
            total = times.stop_s + rec + times.start_s + healthy + times.election_s
            per_broker[str(b)] = {"recovery_s": rec, "recovery_if_unclean_s": if_unclean, "restart_s": round(total, 1)}
    pauses = max(len(batches) - 1, 0) * pause_s
    batched = sum(max(per_broker[str(b)]["restart_s"] for b in batch.brokers) for batch in batches) + pauses
    n = sum(len(batch.brokers) for batch in batches)
    single = sum(v["restart_s"] for v in per_broker.values()) + max(n - 1, 0) * pause_s
    return {
        "batched_s": round(batched, 1),
        "one_at_a_time_s": round(single, 1),
        "brokers": per_broker,
        "step_times": {"stop_s": times.stop_s, "start_s": times.start_s, "election_s": times.election_s},
        "step_times_source": times.source,
        "recovery_bytes_per_s": recovery_bytes_per_s,
        "recovery_source": times.recovery_source or "the default rate (no recovery measured on this cluster yet)",
    }


# --------------------------------------------------------------------------------------------
# the plan
def build_roll_plan(
    cluster: str,
    brokers: Sequence[int],
    *,
    reason: Mapping[str, str],
    partitions: Sequence[Mapping[str, Any]],
    racks: Mapping[int, str | None],
    controller: int | None,
    voters: Iterable[int] = (),
    down: Iterable[int] = (),
    previews: Mapping[int, RestartPreview | None] | None = None,
    hold_out: Iterable[int] = (),
    batched: bool = False,
    isr_margin: int = 0,
    max_batch: int = 0,
    gates: Mapping[str, Any] | None = None,
    audit_run: str = "",
    kraft: bool = False,
    cluster_id: str | None = None,
    leadership: Mapping[str, str] | None = None,
    recovery_bytes_per_s: float,
    isr_wait_s: float,
    pause_s: float,
    times: StepTimes = StepTimes(),
    standing: Mapping[int, str] | None = None,
) -> Plan:
    """The roll's plan, whole and frozen: its scope (the reason, the brokers, the held-out ones, the batching and
    the batches, the gates: all hashed, all in the approval), one ``BrokerPlan`` per broker in restart order (no file
    action; its restart preview from the audit), and for the approver (not hashed) the predicted time batched and one
    at a time, the leadership balance as the plan found it, and the operator's holds and skips standing now
    (``standing``: broker -> what, from ``roll_status``; they may change before the roll reaches the broker)."""
    if reason.get("kind") not in ROLL_REASONS:
        raise ValueError(f"a roll's reason is one of {', '.join(ROLL_REASONS)} ({reason.get('kind')!r})")
    held = sorted(set(hold_out))
    rolled = [b for b in sorted(set(brokers)) if b not in held]
    quorum = sorted(set(voters))
    batches = plan_batches(
        rolled,
        partitions,
        racks,
        controller=controller,
        voters=quorum,
        down=down,
        batched=batched,
        isr_margin=isr_margin,
        max_batch=max_batch,
    )
    scope: dict[str, Any] = {
        "kind": "roll",
        "reason": {"kind": reason["kind"], "text": str(reason.get("text") or "")},
        "brokers": rolled,
        "hold_out": held,
        "batching": BATCHING[1] if batched else BATCHING[0],
        "isr_margin": isr_margin,
        "max_batch": max_batch,
        "batches": [b.to_dict() for b in batches],
        "leadership": dict(leadership or {"via": LEADERSHIP_OFF, "why": "not asked for"}),
    }
    if gates is not None:
        scope["gates"] = dict(gates)
    if cluster_id:
        scope["cluster_id"] = cluster_id
    if kraft:
        scope["metadata_mode"] = "kraft"
    previews = previews or {}
    plans = [BrokerPlan(b, b == controller, True, (), previews.get(b)) for batch in batches for b in batch.brokers]
    skipped = [{"broker_id": b, "rule": "roll", "why": "broker held out of this roll"} for b in held]
    risk = {
        "predicted": predict(
            batches,
            previews,
            isr_wait_s=isr_wait_s,
            pause_s=pause_s,
            recovery_bytes_per_s=recovery_bytes_per_s,
            times=times,
        ),
        "leadership": leadership_balance(partitions),
        "racks": {str(b): racks.get(b) for b in rolled},
        "voters": quorum,
    }
    if standing:
        risk["controls"] = {str(b): why for b, why in sorted(standing.items()) if b in rolled}
    return Plan(cluster, audit_run, scope, tuple(plans), (), tuple(skipped), risk)


def is_roll(plan: Plan) -> bool:
    return plan.scope.get("kind") == "roll"


def batches_of(plan: Plan) -> list[Batch]:
    """The batches the approver saw (the plan's scope)."""
    return [Batch(tuple(b["brokers"]), b["why"]) for b in plan.scope.get("batches") or ()]
