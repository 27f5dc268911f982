"""The KRaft quorum gate: may this controller (or combined node) be stopped now? Strimzi's rule
(``KafkaQuorumCheck``; ../shared/docs/kraft-reference.md §8), on what every voter's metadata log says.

A leader must be known, and the caught-up voters other than the target must be at least ``(N + 2) // 2`` of the N
voters (both others of 3, 3 of the 4 others of 5), so that the quorum keeps a caught-up majority
while the target is down. Fewer than 3 voters: refused unless the approver accepted
that the cluster loses its quorum while the node is down.

"Caught up" without Kafka's DescribeQuorum (Strimzi: a voter's last caught-up time within
``controller.quorum.fetch.timeout.ms`` of the leader's): every voter is read at once (in parallel, over SSH), twice;
the high watermark is the log end offset a majority of the voters have reached (what Raft commits); a voter is caught
up when it holds what was committed at the first round and it is fetching: its log end moved between the rounds, or
it is at the leader's log end. Timestamps taken over SSH would measure the reads more than the voters; the moving
log end measures the voter (on 3.3+ the leader writes a NoOpRecord every 500 ms, so a voter that stopped falls
behind at once, and a slow read never makes a live voter look stopped). Only committed metadata counts: a tail one
controller wrote that the majority does not hold yet is above the high watermark, so it moves nothing here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fleet_doctor.cluster_metadata import majority_leader

MAX_ROUND_GAP_S = 10.0  # two rounds of reads further apart than this are not compared


@dataclass(frozen=True)
class Voter:
    """One voter as its metadata log and ``quorum-state`` say (``log_end_offset`` None: it could not be read)."""

    node_id: int
    log_end_offset: int | None
    leader_id: int | None = None  # whom its quorum-state follows
    leader_epoch: int | None = None
    error: str | None = None  # why it could not be read


@dataclass(frozen=True)
class QuorumView:
    """Every voter at one moment (``at``: seconds on the reader's monotonic clock)."""

    voters: tuple[Voter, ...]
    at: float  # when the reads ended
    problems: tuple[str, ...] = ()  # what makes the view itself untrustworthy (voters that disagree on the quorum)
    started: float = -1.0  # when the reads began (default: ``at``)

    def __post_init__(self) -> None:
        if self.started < 0:
            object.__setattr__(self, "started", self.at)

    @property
    def majority(self) -> int:
        return len(self.voters) // 2 + 1

    @property
    def high_watermark(self) -> int | None:
        """The log end offset a majority of the voters have reached: what the quorum has committed (None: fewer
        than a majority could be read)."""
        ends = sorted((v.log_end_offset for v in self.voters if v.log_end_offset is not None), reverse=True)
        return ends[self.majority - 1] if len(ends) >= self.majority else None

    @property
    def leader(self) -> int | None:
        """The leader a majority of the voters follow at the newest epoch any readable voter knows, when it is a
        voter that could be read; else None (an election is going on, or the leader is down). Raft has one leader
        per epoch: a minority naming another at that epoch (a ``quorum-state`` restored or edited by hand, which
        Kafka reads only at startup) does not unseat the one the majority follows."""
        readable = {v.node_id for v in self.voters if v.log_end_offset is not None}
        views = [(v.leader_id, v.leader_epoch) for v in self.voters if v.node_id in readable]
        leader, _epoch = majority_leader(views, len(self.voters))
        return leader if leader in readable else None


def caught_up(view: QuorumView, earlier: QuorumView | None = None, max_gap_s: float = MAX_ROUND_GAP_S) -> set[int]:
    """The voters caught up in ``view``, judged with ``earlier`` (the round of reads just before, when it ended at
    most ``max_gap_s`` before ``view`` began): a voter is caught up when it holds what the quorum had committed by the
    earlier round (its log end at least that high watermark) and it is fetching: its log end moved since that round,
    or it has nothing to fetch (it reached the leader's log end). A voter that stopped just after reaching the high
    watermark does not move while the leader's NoOpRecords do (3.3+), so it is not counted. Without an earlier round:
    only the voters at the leader's log end."""
    hw = view.high_watermark
    if hw is None:
        return set()
    before = {v.node_id: v.log_end_offset for v in earlier.voters} if earlier is not None else {}
    recent = earlier is not None and view.started - earlier.at <= max_gap_s and earlier.high_watermark is not None
    committed = min(hw, earlier.high_watermark) if recent and earlier is not None else hw  # type: ignore[type-var]
    ends = {v.node_id: v.log_end_offset for v in view.voters}
    leader_end = ends.get(view.leader) if view.leader is not None else None
    out = set()
    for v in view.voters:
        end = v.log_end_offset
        if end is None or end < committed:
            continue
        prev = before.get(v.node_id) if recent else None
        moving = prev is not None and end > prev
        idle = leader_end is not None and end >= leader_end
        if moving or idle or v.node_id == view.leader:
            out.add(v.node_id)
    return out


def restart_refusal(
    view: QuorumView,
    target: int,
    earlier: QuorumView | None = None,
    *,
    allow_quorum_loss: bool = False,
) -> str | None:
    """Why ``target`` may not be stopped now (None: it may). Fails closed: a voter that cannot be read is not caught
    up, a leader that cannot be told is no leader."""
    ids = [v.node_id for v in view.voters]
    if target not in ids:
        raise ValueError(f"node {target} is not a voter ({ids})")
    if view.problems:
        return f"the quorum cannot be judged: {'; '.join(view.problems)}: node {target} waits"
    unread = {v.node_id: v.error or "not read" for v in view.voters if v.log_end_offset is None}
    n = len(ids)
    if n < 3 and not allow_quorum_loss:
        return (
            f"the quorum has {n} voter(s) {ids}: stopping node {target} loses it (no majority left) until it is "
            "back; allowed only when the approver accepts that the cluster loses its quorum (allow_quorum_loss)"
        )
    if view.leader is None:
        why = f"; unreadable: {unread}" if unread else ""
        return f"no quorum leader known (an election going on, or the leader is down){why}: node {target} waits"
    others = [i for i in ids if i != target]
    up = caught_up(view, earlier) - {target}
    need = (n + 2) // 2 if n >= 3 else 0
    behind = sorted(set(others) - up)
    if len(up) < need:
        detail = ", ".join(f"node {i}: {unread.get(i) or _lag(view, i)}" for i in behind)
        return (
            f"{len(up)} of the other {len(others)} voter(s) caught up ({sorted(up)}), {need} needed to keep a "
            f"caught-up majority while node {target} is down; behind: {detail}"
        )
    return None


def impaired_refusal(view: QuorumView, earlier: QuorumView | None = None) -> str | None:
    """Refuse every change when more than one voter is impaired (not readable, or not caught up with the quorum's
    high watermark)."""
    ok = caught_up(view, earlier)
    impaired = sorted(v.node_id for v in view.voters if v.node_id not in ok)
    if len(impaired) <= 1:
        return None
    why = "; ".join(
        f"node {v.node_id}: {v.error or f'log end {v.log_end_offset}, high watermark {view.high_watermark}'}"
        for v in view.voters
        if v.node_id in impaired
    )
    return (
        f"{len(impaired)} voters of {len(view.voters)} are impaired ({why}): Apache Kafka has no supported procedure "
        "with more than one voter impaired, and a restart needs the quorum; nothing is planned or changed until at "
        "most one is"
    )


def _lag(view: QuorumView, node_id: int) -> str:
    v = next(v for v in view.voters if v.node_id == node_id)
    hw = view.high_watermark
    return f"log end {v.log_end_offset}, high watermark {hw}"


def read_quorum(
    endpoints: Iterable[dict[str, Any]],
    connect: Any = None,
    *,
    timeout: float | None = None,
    sessions: Any = None,
) -> QuorumView:
    """Every voter (the inventory's controllers, ``Inventory.controller_endpoint``) read now over SSH
    (``connect(endpoint)``, default its Airflow connection; or over the connections ``sessions``, an
    ``audit.kraft.Sessions``, keeps open between reads): the decoder's ``--position`` on each, a walk of its newest
    segment's batch headers. A voter that cannot be read is one with no log end offset, its error kept; voters whose
    logs name another cluster id than most, or whose ``quorum-state`` names other voters than the inventory, make the
    view untrustworthy (``problems``): the gate then holds."""
    from fleet_doctor.audit import kraft

    endpoints = list(endpoints)
    ids = sorted(int(e["controller_id"]) for e in endpoints)
    program = kraft.decoder_program()
    extra = {} if timeout is None else {"timeout": timeout}
    reads = sessions if sessions is not None else kraft.Sessions(connect or kraft.airflow_connect)

    def one(endpoint: dict[str, Any]) -> tuple[Voter, dict[str, Any] | None]:
        cid = int(endpoint["controller_id"])
        try:
            pos = reads.read(endpoint, lambda client: kraft.read_position(client, endpoint, program=program, **extra))
        except kraft.MetadataReadError as e:
            return Voter(cid, None, error=str(e)), None
        leader = pos.get("quorum_leader_id")
        leader = leader if isinstance(leader, int) and leader >= 0 else None  # -1: no leader known to it
        return Voter(cid, pos["log_end_offset"], leader, pos.get("quorum_leader_epoch")), pos

    started = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=max(1, len(endpoints)), thread_name_prefix="quorum-read") as pool:
            results = list(pool.map(one, endpoints))  # every voter at about the same moment: their ends compare
    finally:
        if sessions is None:
            reads.close()
    voters = [v for v, _ in results]
    read = {v.node_id: pos for v, pos in results if pos is not None}
    problems = []
    clusters = [p.get("cluster_id") for p in read.values()]
    if clusters:
        common = max(set(clusters), key=clusters.count)
        odd = sorted(c for c, p in read.items() if p.get("cluster_id") != common)
        if odd:
            problems.append(f"controller(s) {odd} name another cluster id than {common!r}")
    for cid, p in sorted(read.items()):
        named = p.get("quorum_voters")
        if isinstance(named, list) and named and sorted(int(v) for v in named) != ids:
            problems.append(f"the quorum-state of controller {cid} names voters {sorted(named)}, the inventory {ids}")
    return QuorumView(tuple(voters), time.monotonic(), tuple(problems), started)
