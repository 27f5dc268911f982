"""The KRaft quorum gate (``repair.quorum``) on the live KRaft lab: 3 combined nodes (real sshd per node, the lab's
quorum with its leader's NoOpRecords every 500 ms), each voter read over SSH as the repair reads it (the decoder's
``--position``, identity checked). In file order:

1. a healthy quorum: the leader the gate sees is the lab's, and any one voter may go;
2. a voter stopped (controlled shutdown; its host still answers): its log end stops while the leader's NoOps move
   the others', so it falls behind within seconds; then no other voter may go, while the stopped one itself may;
   started again, it catches up and every voter may go again;
3. a voter whose host is gone (its sshd killed): it cannot be read, and the gate holds every other voter, naming it;
4. the active controller stopped: the others elect a new leader, which the gate follows.
The rule itself, on every quorum size: tests/test_quorum_gate.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor import inventory as inv
from fleet_doctor.repair.quorum import QuorumView, read_quorum, restart_refusal
from fleet_lab import fleet
from harness.ssh import controller_connect

pytestmark = pytest.mark.timeout(600)
VOTERS = (1, 2, 3)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("kraft-gates")
    state = fleet.up(root / "lab", brokers=3, metadata="kraft")
    try:
        i = inv.load(state.inventory_path)
        yield {"state": state, "endpoints": [i.controller_endpoint(c.id) for c in i.controllers]}
    finally:
        fleet.down(root / "lab")


connect = controller_connect


def observe(lab: dict[str, Any]) -> tuple[QuorumView, QuorumView]:
    """Two reads of every voter, one after the other (the second judged with the first: "caught up" within the
    fetch timeout)."""
    earlier = read_quorum(lab["endpoints"], connect)
    return earlier, read_quorum(lab["endpoints"], connect)


def until(what: str, ok: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.2)


def refusals(lab: dict[str, Any]) -> dict[int, str | None]:
    earlier, view = observe(lab)
    return {t: restart_refusal(view, t, earlier) for t in VOTERS}


def until_it_may_go(lab: dict[str, Any], node: int) -> dict[int, str | None]:
    """The gates' answers of the first round (within 10 s) in which ``node`` may go, the other two voters caught up.
    Polled as the gate polls: in one round a running follower can read one NoOpRecord behind the leader's log end
    without having moved since the round before (then ``node`` may not go either); it fetches within the next."""
    found: dict[int, str | None] = {}

    def may_go() -> bool:
        found.update(refusals(lab))
        return found[node] is None

    until(f"node {node} may go (the other two voters caught up)", may_go, timeout=10)
    return found


def test_a_healthy_quorum_lets_any_one_voter_go(lab: dict[str, Any]) -> None:
    fleet.wait_healthy(lab["state"], timeout=60)
    until("every voter may go", lambda: set(refusals(lab).values()) == {None})
    _earlier, view = observe(lab)  # the second read judged with the first
    assert view.leader == fleet.quorum_leader(lab["state"])[0]  # type: ignore[index]
    assert view.problems == () and view.high_watermark is not None
    # the leader's NoOps (one per metadata.max.idle.interval.ms): the log never idles, a later read finds its end moved
    # (two reads back to back can fall within one interval)
    until(
        "the high watermark moves on an idle cluster",
        lambda: (read_quorum(lab["endpoints"], connect).high_watermark or 0) > (view.high_watermark or 0),
        timeout=10,
    )


def test_a_stopped_voter_falls_behind_and_holds_every_other(lab: dict[str, Any]) -> None:
    state = lab["state"]
    leader = fleet.quorum_leader(state)[0]  # type: ignore[index]
    down = next(v for v in VOTERS if v != leader)
    assert fleet.run_service(state.broker(down), "stop").returncode == 0
    try:
        until(f"node {down} behind", lambda: refusals(lab)[leader] is not None, timeout=30)
        found = until_it_may_go(lab, down)  # the stopped one itself may go: the two others are caught up
        for t in set(VOTERS) - {down}:
            assert found[t] is not None and f"node {down}: log end" in found[t], found  # type: ignore[operator]
    finally:
        assert fleet.run_service(state.broker(down), "start").returncode == 0
    fleet.wait_healthy(state, timeout=60)
    until("every voter may go again", lambda: set(refusals(lab).values()) == {None})


def test_a_voter_that_cannot_be_read_holds_every_other(lab: dict[str, Any]) -> None:
    state = lab["state"]
    fleet.kill_sshd(state, 2)
    try:
        found = until_it_may_go(lab, 2)
    finally:
        fleet.start_sshd(state, 2)
    for t in (1, 3):
        why = found[t] or ""
        assert "node 2: controller 2 (127.0.0.1:" in why and "cannot connect" in why, found
    until("every voter may go again", lambda: set(refusals(lab).values()) == {None})


def test_after_the_active_controller_stops_the_gate_follows_the_new_leader(lab: dict[str, Any]) -> None:
    state = lab["state"]
    old = fleet.quorum_leader(state)[0]  # type: ignore[index]
    assert fleet.run_service(state.broker(old), "stop").returncode == 0
    try:
        until("a new leader", lambda: (fleet.quorum_leader(state) or (old,))[0] != old, timeout=30)
        new = fleet.quorum_leader(state)[0]  # type: ignore[index]
        until("the gate sees the new leader", lambda: observe(lab)[1].leader == new, timeout=30)
    finally:
        assert fleet.run_service(state.broker(old), "start").returncode == 0
    fleet.wait_healthy(state, timeout=60)
    until("every voter may go again", lambda: set(refusals(lab).values()) == {None})


def test_the_position_read_is_one_small_record(lab: dict[str, Any], tmp_path: Path) -> None:
    from fleet_doctor.audit import kraft

    endpoint = lab["endpoints"][0]
    client = connect(endpoint)
    try:
        pos = kraft.read_position(client, endpoint)
    finally:
        client.close()
    assert pos["kind"] == "metadata_position" and pos["node_id"] == 1 and pos["error"] is None
    assert pos["cluster_id"] == lab["state"].cluster_id and pos["log_end_offset"] > 0


# ---- the partition gates' view (repair.kraft_cluster): the committed image, followed
@pytest.fixture
def kraft_cluster(lab: dict[str, Any]) -> Iterator[Callable[[], Any]]:
    """Makes a KraftCluster over the lab's inventory; the connections each keeps to the voters are closed when the
    test ends (their sshd session processes outlive the lab's sshd otherwise, and their transports the module)."""
    from fleet_doctor.repair.kraft_cluster import KraftCluster

    with ExitStack() as made:
        yield lambda: made.enter_context(KraftCluster(inv.load(lab["state"].inventory_path), connect))


def lab_image(lab: dict[str, Any]) -> dict[tuple[str, int], tuple[list[int], list[int], int]]:
    """(topic, partition) -> (replicas, isr, leader) as the lab's own leader holds them (its metadata log replayed by
    the lab, not by the follower)."""
    return {
        (r["topic"], r["partition"]): (r["replicas"], r["isr"], r["leader"])
        for r in fleet.read_metadata(lab["state"])
        if r.get("kind") == "partition_state"
    }


def view_of(cluster: Any) -> dict[tuple[str, int], tuple[list[int], list[int], int]]:
    return {(p["topic"], p["partition"]): (p["replicas"], p["isr"], p["leader"]) for p in cluster.partitions()}


def test_the_gates_keep_one_connection_per_voter_and_open_it_again_when_it_breaks(
    lab: dict[str, Any], kraft_cluster: Callable[[], Any]
) -> None:
    import socket

    fleet.wait_healthy(lab["state"], timeout=60)
    cluster = kraft_cluster()
    sessions = cluster.follower.sessions
    try:
        for _ in range(4):
            cluster.refresh()
        assert sessions.opened == len(VOTERS)  # one per voter, however many polls
        for client in sessions.clients.values():  # a dead host is noticed in seconds, not at TCP's give-up
            sock = client.get_transport().sock
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 10_000
        leader = cluster.controller()
        broken = sessions.clients[leader]
        broken.get_transport().sock.shutdown(socket.SHUT_RDWR)  # the network drops it between two polls
        view = cluster.refresh()
        assert all(v.log_end_offset is not None for v in view.voters), view  # every voter read all the same
        assert sessions.opened == len(VOTERS) + 1 and sessions.clients[leader] is not broken
        assert broken.get_transport() is None  # the broken one closed
    finally:
        cluster.close()
    assert sessions.clients == {}


def test_the_cluster_view_follows_the_committed_image_a_few_records_at_a_time(
    lab: dict[str, Any], kraft_cluster: Callable[[], Any]
) -> None:
    state = lab["state"]
    fleet.wait_healthy(state, timeout=60)
    cluster = kraft_cluster()
    assert cluster.registered() == set(VOTERS) and cluster.controller() == fleet.quorum_leader(state)[0]  # type: ignore[index]
    assert cluster.cluster_id() == state.cluster_id
    until("the view is the lab's image", lambda: view_of(cluster) == lab_image(lab))
    assert all(p["min_isr"] >= 1 and p["min_isr_source"] for p in cluster.partitions())
    follower = cluster.follower
    first = follower.records
    reads = follower.reads
    for _ in range(5):  # the leader's NoOps move the high watermark: each poll reads only what is new
        cluster.refresh()
    assert follower.reads > reads and follower.image is not None
    assert follower.records - first <= 10, "a poll re-read the image instead of following it"
    assert follower.resume is not None  # the next read starts at the byte the last one stopped

    down = next(v for v in VOTERS if v != cluster.controller())
    assert fleet.run_service(state.broker(down), "stop").returncode == 0  # controlled shutdown
    try:
        until(f"broker {down} fenced", lambda: down not in cluster.registered(), timeout=30)
        assert down in cluster.fenced()
        parts = cluster.partitions()
        assert not any(down in p["isr"] for p in parts if len(p["replicas"]) > 1), "the stop shrinks the ISR"
        problems = cluster.problems(set(VOTERS))
        assert f"broker {down} not registered" in problems
        assert cluster.problems(set(VOTERS), frozenset({down})) == []  # the broker being repaired is tolerated

        # the quorum's word on the stopped voter, polled as the gate polls: in one round a follower can read one
        # NoOpRecord behind the leader's log end without having moved since the round before (impaired for that round:
        # with the stopped voter, two impaired and every change refused); it fetches within the next ones
        def word_on_the_stopped_voter() -> bool:
            why = cluster.restart_refusal(down)
            return why is None or "caught up" in why

        until("the quorum's word on the stopped voter", word_on_the_stopped_voter, timeout=10)
    finally:
        assert fleet.run_service(state.broker(down), "start").returncode == 0
    until(f"broker {down} unfenced and back in ISR", lambda: cluster.problems(set(VOTERS)) == [], timeout=60)
    until("the view is the lab's image again", lambda: view_of(cluster) == lab_image(lab))
    assert follower.records - first < 200  # the whole run followed the log: never the image again


def test_the_cluster_view_fails_closed_when_no_majority_can_be_read(
    lab: dict[str, Any], kraft_cluster: Callable[[], Any]
) -> None:
    from fleet_doctor.repair.kraft_cluster import GateUnreadable

    state = lab["state"]
    cluster = kraft_cluster()
    fleet.kill_sshd(state, 2)
    fleet.kill_sshd(state, 3)
    try:
        with pytest.raises(GateUnreadable, match="fewer than a majority of the 3 voters could be read"):
            cluster.registered()
    finally:
        fleet.start_sshd(state, 2)
        fleet.start_sshd(state, 3)
    assert cluster.registered() == set(VOTERS)
