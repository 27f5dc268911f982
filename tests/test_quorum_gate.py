"""The KRaft quorum gate's rule (``repair.quorum``), on quorums of 1 to 5 voters: a leader known, the caught-up voters
other than the target at least (N + 2) // 2 (both others of 3, 3 of the 4 others of 5), a high watermark only a
majority makes (an uncommitted tail moves nothing), "caught up" as holding what was committed a round earlier and
still fetching (a voter stopped right at the high watermark is not), and fewer than 3
voters refused unless the quorum's loss is accepted. The same gate on the live KRaft lab: tests/test_kraft_gates.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleet_doctor.repair.quorum import QuorumView, Voter, caught_up, restart_refusal


def view(ends: dict[int, int | None], leader: int | None = 1, epoch: int = 5, at: float = 100.0) -> QuorumView:
    return QuorumView(
        tuple(
            Voter(n, end, leader if end is not None else None, epoch if end is not None else None, None)
            for n, end in ends.items()
        ),
        at,
    )


def test_a_healthy_quorum_of_three_lets_any_one_voter_go() -> None:
    v = view({1: 120, 2: 120, 3: 120})
    assert v.high_watermark == 120 and v.leader == 1
    assert [restart_refusal(v, t) for t in (1, 2, 3)] == [None, None, None]


def test_with_one_voter_of_three_down_no_other_may_go() -> None:
    v = view({1: 120, 2: 120, 3: None})
    assert restart_refusal(v, 3) is None  # the one that is down itself: the others are both caught up
    why = restart_refusal(v, 2)
    assert (
        why is not None and "1 of the other 2 voter(s) caught up ([1]), 2 needed" in why and "node 3: not read" in why
    )


def test_a_voter_behind_the_high_watermark_is_not_caught_up_and_an_uncommitted_tail_moves_nothing() -> None:
    earlier = view({1: 110, 2: 95, 3: 110}, at=100.0)
    v = view({1: 130, 2: 100, 3: 120}, at=101.0)  # leader 1 wrote 130, only it holds 121-130: the quorum committed 120
    assert v.high_watermark == 120
    assert caught_up(v, earlier) == {1, 3}  # 3 holds what was committed a round ago and moved; 2 is behind it
    assert caught_up(v) == {1}  # one round only: just the voters at the leader's log end
    why = restart_refusal(v, 3, earlier)
    assert why is not None and "node 2: log end 100, high watermark 120" in why
    assert restart_refusal(v, 2, earlier) is None  # the one behind may go: 1 and 3 hold everything committed


def test_caught_up_means_holding_what_was_committed_a_round_earlier_and_still_fetching() -> None:
    earlier = view({1: 100, 2: 100, 3: 100}, at=100.0)
    busy = view({1: 140, 2: 140, 3: 110}, at=101.5)  # node 3 one fetch behind, past what was committed before
    assert caught_up(busy) == {1, 2}
    assert caught_up(busy, earlier) == {1, 2, 3}
    assert restart_refusal(busy, 2, earlier) is None
    stale = view({1: 100, 2: 100, 3: 100}, at=90.0)  # a round 11.5 s before: too long ago to compare with
    assert caught_up(busy, stale) == {1, 2}


def test_a_voter_that_stopped_right_at_the_high_watermark_is_not_caught_up() -> None:
    """Node 2 stopped just after reaching the high watermark; node 3 is behind: the high watermark is node 2's end,
    so "at the high watermark" alone would count it. It did not move while the leader's NoOps did: not caught up,
    and node 3 may not go (the quorum would be left with one live voter)."""
    earlier = view({1: 100, 2: 100, 3: 90}, at=100.0)
    now = view({1: 105, 2: 100, 3: 95}, at=101.0)
    assert now.high_watermark == 100
    assert caught_up(now, earlier) == {1}
    why = restart_refusal(now, 3, earlier)
    assert why is not None and "1 of the other 2 voter(s) caught up ([1]), 2 needed" in why


def test_five_voters_need_three_of_the_four_others() -> None:
    v = view({1: 50, 2: 50, 3: 50, 4: None, 5: 50})
    assert restart_refusal(v, 2) is None  # 1, 3, 5 caught up: 3 of the 4 others
    v = view({1: 50, 2: 50, 3: 50, 4: None, 5: 10})
    why = restart_refusal(v, 2)
    assert why is not None and "2 of the other 4 voter(s) caught up ([1, 3]), 3 needed" in why


def test_no_known_leader_holds_every_stop() -> None:
    # two leaders named at one epoch, neither by a majority: none known
    split = QuorumView((Voter(1, 10, 1, 7), Voter(2, 10, 2, 7), Voter(3, 10, 1, 7), Voter(4, 10, 2, 7)), 0.0)
    assert split.leader is None
    assert "no quorum leader known" in (restart_refusal(split, 2) or "")
    # a minority's quorum-state naming another leader at that epoch (edited by hand): the majority's leader stands
    divergent = QuorumView((Voter(1, 10, 1, 7), Voter(2, 10, 2, 7), Voter(3, 10, 1, 7)), 0.0)
    assert divergent.leader == 1
    # the newest epoch known to one voter only (just elected, the others not told yet): not yet a known leader
    lone = QuorumView((Voter(1, 12, 1, 8), Voter(2, 10, 2, 7), Voter(3, 10, 2, 7)), 0.0)
    assert lone.leader is None
    leader_down = view({1: None, 2: 10, 3: 10}, leader=1)
    assert leader_down.leader is None and "unreadable: {1: 'not read'}" in (restart_refusal(leader_down, 2) or "")
    newer = QuorumView((Voter(1, 10, 1, 7), Voter(2, 12, 2, 8), Voter(3, 12, 2, 8)), 0.0)  # 1 has not heard yet
    assert newer.leader == 2 and restart_refusal(newer, 1) is None


def test_fewer_than_three_voters_are_refused_unless_the_quorums_loss_is_accepted() -> None:
    for ends in ({1: 10}, {1: 10, 2: 10}):
        v = view(ends)
        why = restart_refusal(v, 1)
        assert why is not None and "loses it" in why and "allow_quorum_loss" in why
        assert restart_refusal(v, 1, allow_quorum_loss=True) is None
    with pytest.raises(ValueError, match="not a voter"):
        restart_refusal(view({1: 1, 2: 1, 3: 1}), 9)
    assert view({1: None, 2: None, 3: 5}).high_watermark is None  # no majority read: nothing committed is known


REAL_METADATA_DIRS = (
    "kraft-3.2-3broker-replicated-nurlan/kafka1",
    "kraft-3.2-3broker-replicated-nurlan/kafka3",
    "kraft-3.5-3broker-greenlemon/kafka1",
    "kraft-3.5-3broker-greenlemon/kafka2",
    "kraft-3.7-ldipoc/kraft-combined-logs",
    "kraft-4.0-multiseg-kscan/kafka-1",
)


@pytest.mark.parametrize("rel", REAL_METADATA_DIRS)
def test_the_position_read_agrees_with_the_full_replay_on_real_metadata_logs(corpus: Path, rel: str) -> None:
    """The gate's cheap poll (``--position``: the newest segment's batch headers) gives the log end, its newest
    epoch and the quorum-state's leader exactly as the audit's full replay does, on genuine Kafka metadata logs."""
    from fleet_doctor.cluster_metadata import metadata_position, read_cluster_metadata

    path = corpus / rel
    head = read_cluster_metadata(str(path))[0]
    pos = metadata_position(str(path))
    assert pos["kind"] == "metadata_position" and pos["error"] is None
    assert (pos["node_id"], pos["cluster_id"]) == (head["node_id"], head["cluster_id"])
    assert pos["log_end_offset"] == max(head["log_end_offset"] or 0, head["snapshot_end_offset"] or 0)
    assert pos["log_max_epoch"] == (
        head["log_max_epoch"] if head["log_max_epoch"] is not None else head["snapshot_epoch"]
    )
    assert (pos["quorum_leader_id"], pos["quorum_leader_epoch"]) == (
        head["quorum_leader_id"],
        head["quorum_leader_epoch"],
    )


def test_the_position_read_names_what_it_cannot_read(tmp_path: Path) -> None:
    from fleet_doctor.cluster_metadata import ClusterMetadataError, main, metadata_position

    mdir = tmp_path / "__cluster_metadata-0"
    mdir.mkdir()
    with pytest.raises(ClusterMetadataError, match="neither a metadata snapshot"):
        metadata_position(str(mdir))
    (mdir / "quorum-state").write_text("{torn")
    (mdir / "00000000000000000000.log").write_bytes(b"")
    pos = metadata_position(str(mdir))
    assert pos["log_end_offset"] == 0 and "quorum-state is not JSON" in pos["error"]
    assert main(["--position", "--bogus", str(mdir)]) == 2


def test_the_reads_of_one_poll_share_one_round_even_when_following_the_image_is_slow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``KraftCluster.current``: a gate's ``registered`` right after its ``partitions`` (or ``_next_batch``'s
    controller, voters and registrations) reads the voters once. Following the image takes longer than the window
    itself on a real quorum (~0.45 s on the lab), so the window counts from the end of the round."""
    import time as clock

    from fleet_doctor.repair import kraft_cluster

    rounds: list[float] = []

    def read_quorum(endpoints: object, connect: object = None, **kw: object) -> QuorumView:
        rounds.append(clock.monotonic())
        return QuorumView((Voter(1, 10, 1, 1),), clock.monotonic())

    def follow(self: object, view: QuorumView) -> None:
        clock.sleep(kraft_cluster.SAME_POLL_S * 1.5)  # slower than the window

    class Inventory:
        controllers = ()
        cluster_id = None

    monkeypatch.setattr(kraft_cluster, "read_quorum", read_quorum)
    monkeypatch.setattr(kraft_cluster.MetadataFollower, "follow", follow)
    cluster = kraft_cluster.KraftCluster(Inventory(), connect=lambda e: None)
    cluster.current()
    cluster.current()  # the same poll
    assert len(rounds) == 1
    clock.sleep(kraft_cluster.SAME_POLL_S * 1.2)
    cluster.current()  # the next poll
    assert len(rounds) == 2


class _Transport:
    def __init__(self) -> None:
        self.active = True

    def is_active(self) -> bool:
        return self.active


class _Client:
    """A connection as ``audit.kraft.Sessions`` uses it: its transport, and close."""

    def __init__(self, n: int) -> None:
        self.n, self.closed, self.transport = n, False, _Transport()

    def get_transport(self) -> _Transport:
        return self.transport

    def close(self) -> None:
        self.closed = True


def _sessions() -> tuple[Any, list[_Client]]:
    from fleet_doctor.audit import kraft

    opened: list[_Client] = []

    def connect(endpoint: dict[str, object]) -> _Client:
        opened.append(_Client(len(opened)))
        return opened[-1]

    return kraft.Sessions(connect), opened


def test_the_gates_keep_one_connection_per_voter_and_open_a_new_one_for_a_stale_or_broken_one() -> None:
    from fleet_doctor.audit.kraft import MetadataReadError

    sessions, opened = _sessions()
    one, two = {"controller_id": 1}, {"controller_id": 2}
    assert sessions.read(one, lambda c: c.n) == 0
    assert sessions.read(one, lambda c: c.n) == 0  # kept
    assert sessions.read(two, lambda c: c.n) == 1  # each voter its own
    opened[0].transport.active = False  # the controller's sshd went away
    assert sessions.read(one, lambda c: c.n) == 2 and opened[0].closed

    def broken_under_the_read(c: _Client) -> int:  # a kept connection that breaks is tried once more on a new one
        if c.n == 2:
            try:
                raise EOFError("the peer closed the connection")
            except EOFError as e:
                raise MetadataReadError("controller 1: the decoder could not run: session dropped") from e
        return c.n

    assert sessions.read(one, broken_under_the_read) == 3 and opened[2].closed

    def broken_then_down(c: _Client) -> int:  # broken, and the controller's host down: both said
        if c.n == 3:
            c.transport.active = False
            raise MetadataReadError("controller 1: the decoder could not run: session dropped")
        raise MetadataReadError(f"controller 1 (h:22): cannot connect (connection {c.n})")

    with pytest.raises(MetadataReadError, match=r"cannot connect \(connection 4\).*kept connection broke.*dropped"):
        sessions.read(one, broken_then_down)
    assert opened[3].closed and opened[4].closed and len(opened) == 5
    assert sessions.read(one, lambda c: c.n) == 5  # nothing failing is kept

    def decoder_fails(c: _Client) -> int:  # the read's own failure on a working connection: not tried again
        raise MetadataReadError(f"controller 1: the decoder exited 3 (connection {c.n})")

    with pytest.raises(MetadataReadError, match="connection 5"):
        sessions.read(one, decoder_fails)
    assert opened[5].closed and len(opened) == 6  # no second run on the controller
    assert sessions.read(one, lambda c: c.n) == 6  # the next read on a new connection
    sessions.close()
    assert all(c.closed for c in opened) and sessions.clients == {}


def test_a_kept_connection_is_shown_to_be_its_controller_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet_doctor.audit import kraft

    checks: list[int] = []
    monkeypatch.setattr(kraft, "verify_identity", lambda remote, cid, *a, **k: checks.append(cid) or f"node {cid}")
    endpoint = {"controller_id": 1, "host": "h", "ssh_port": 22, "metadata_log_dir": "/m", "host_key": "ssh-ed25519 A"}
    kept, other = _Client(0), _Client(1)
    assert kraft._verified(kept, endpoint)[3] == kraft._verified(kept, endpoint)[3] == "node 1"
    assert checks == [1]
    kraft._verified(other, endpoint)  # a new connection: checked again
    kraft._verified(kept, {**endpoint, "host_key": "ssh-ed25519 B"})  # another pinned key: checked again
    assert checks == [1, 1, 1]


def test_a_read_over_a_kept_connection_still_needs_the_node_id_of_meta_properties(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The identity check runs once per connection: each read then stands on the node id the decoder reads from the
    metadata log dir's meta.properties, and a decoder that could not read it refuses the read, as the check did."""
    import json as js
    from types import SimpleNamespace

    from fleet_doctor.audit import kraft

    said: dict[str, object] = {}

    class Remote:
        def stream(self, command: str, program: bytes, sink: Any, timeout: float) -> Any:
            sink((js.dumps({"kind": "metadata_position", **said}) + "\n").encode())
            return SimpleNamespace(exit_status=0, stderr="")

    monkeypatch.setattr(kraft, "_verified", lambda client, endpoint: (1, "controller 1", Remote(), "node 1"))
    endpoint = {"controller_id": 1, "metadata_log_dir": "/m"}
    said.update(node_id=1, cluster_id="c")
    assert kraft.read_position(object(), endpoint, program=b"")["node_id"] == 1
    said.update(node_id=None, error="/m/meta.properties cannot be read: ENOENT")
    with pytest.raises(kraft.MetadataReadError, match=r"could not read the metadata log dir's node id: .*ENOENT"):
        kraft.read_position(object(), endpoint, program=b"")
    said.update(node_id=2)
    with pytest.raises(kraft.MetadataReadError, match="belongs to node 2, not controller 1"):
        kraft.read_position(object(), endpoint, program=b"")
