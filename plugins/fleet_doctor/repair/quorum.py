"""The KRaft quorum gate: may this controller (or combined node) be stopped now? Strimzi's rule
(``KafkaQuorumCheck``; ../shared/docs/kraft-reference.md §8), on what every voter's metadata log says.

A leader must be known, and the caught-up voters other than the target must be at least ``(N + 2) // 2`` of the N
voters (both others of 3, 3 of the 4 others of 5), so that the quorum keeps a caught-up majority
while the target is down. Fewer than 3 voters: refused unless the approver accepted
that the cluster loses its quorum while the node is down.

"Caught up" without Kafka's DescribeQuorum: the high watermark is the log end offset a majority of the voters have
reached (what Raft commits); a voter is caught up when its log end offset has reached a high watermark seen at most
``controller.quorum.fetch.timeout.ms`` ago (Strimzi: its last caught-up time within that timeout of the leader's).
With one observation only, the high watermark of that very observation. Only committed metadata counts: a tail one
controller wrote that the majority does not hold yet is above the high watermark, so it moves nothing here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

FETCH_TIMEOUT_S = 2.0  # controller.quorum.fetch.timeout.ms, Kafka's default 2000


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
    at: float
    problems: tuple[str, ...] = ()  # what makes the view itself untrustworthy (voters that disagree on the quorum)

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
        """The leader the readable voters follow at the newest epoch any of them knows, when they agree on one and
        it is a voter that could be read; else None (an election is going on, or the leader is down)."""
        known = [v for v in self.voters if v.leader_epoch is not None and v.log_end_offset is not None]
        if not known:
            return None
        epoch = max(v.leader_epoch for v in known if v.leader_epoch is not None)
        leaders = {v.leader_id for v in known if v.leader_epoch == epoch}
        (leader,) = leaders if len(leaders) == 1 else (None,)
        readable = {v.node_id for v in self.voters if v.log_end_offset is not None}
        return leader if leader in readable else None


def caught_up(
    view: QuorumView, earlier: QuorumView | None = None, fetch_timeout_s: float = FETCH_TIMEOUT_S
) -> set[int]:
    """The voters whose log end offset reached a high watermark seen at most ``fetch_timeout_s`` before ``view``
    (``earlier``, when recent enough and known; else ``view``'s own)."""
    hw = view.high_watermark
    if earlier is not None and view.at - earlier.at <= fetch_timeout_s and earlier.high_watermark is not None:
        hw = earlier.high_watermark if hw is None else min(hw, earlier.high_watermark)
    if hw is None:
        return set()
    return {v.node_id for v in view.voters if v.log_end_offset is not None and v.log_end_offset >= hw}


def restart_refusal(
    view: QuorumView,
    target: int,
    earlier: QuorumView | None = None,
    *,
    allow_quorum_loss: bool = False,
    fetch_timeout_s: float = FETCH_TIMEOUT_S,
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
    up = caught_up(view, earlier, fetch_timeout_s) - {target}
    need = (n + 2) // 2 if n >= 3 else 0
    behind = sorted(set(others) - up)
    if len(up) < need:
        detail = ", ".join(f"node {i}: {unread.get(i) or _lag(view, i)}" for i in behind)
        return (
            f"{len(up)} of the other {len(others)} voter(s) caught up ({sorted(up)}), {need} needed to keep a "
            f"caught-up majority while node {target} is down; behind: {detail}"
        )
    return None


def _lag(view: QuorumView, node_id: int) -> str:
    v = next(v for v in view.voters if v.node_id == node_id)
    hw = view.high_watermark
    return f"log end {v.log_end_offset}, high watermark {hw}"


def read_quorum(
    endpoints: Iterable[dict[str, Any]], connect: Any = None, *, timeout: float | None = None
) -> QuorumView:
    """Every voter (the inventory's controllers, ``Inventory.controller_endpoint``) read now over SSH
    (``connect(endpoint)``, default its Airflow connection): the decoder's ``--position`` on each, a walk of its
    newest segment's batch headers. A voter that cannot be read is one with no log end offset, its error kept; voters
    whose logs name another cluster id than most, or whose ``quorum-state`` names other voters than the inventory,
    make the view untrustworthy (``problems``): the gate then holds."""
    from fleet_doctor.audit import kraft

    connect = connect or kraft.airflow_connect
    endpoints = list(endpoints)
    ids = sorted(int(e["controller_id"]) for e in endpoints)
    program = kraft.decoder_program()
    read: dict[int, dict[str, Any]] = {}
    voters: list[Voter] = []
    for endpoint in endpoints:
        cid = int(endpoint["controller_id"])
        try:
            try:
                client = connect(endpoint)
            except Exception as e:  # paramiko's and the SSH hook's errors have no common base
                raise kraft.MetadataReadError(f"controller {cid}: cannot connect: {type(e).__name__}: {e}") from e
            try:
                extra = {} if timeout is None else {"timeout": timeout}
                pos = kraft.read_position(client, endpoint, program=program, **extra)
            finally:
                client.close()
        except kraft.MetadataReadError as e:
            voters.append(Voter(cid, None, error=str(e)))
            continue
        read[cid] = pos
        leader = pos.get("quorum_leader_id")
        leader = leader if isinstance(leader, int) and leader >= 0 else None  # -1: no leader known to it
        voters.append(Voter(cid, pos["log_end_offset"], leader, pos.get("quorum_leader_epoch")))
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
    return QuorumView(tuple(voters), time.monotonic(), tuple(problems))
