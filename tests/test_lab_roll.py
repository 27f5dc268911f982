"""The fleet lab where a rolling restart depends on it (issue 31), on both metadata modes, against the real things
(sshd per broker, ZooKeeper or the KRaft quorum, the lab brokers): a rack in each broker's registration, leadership
that moves off a stopping broker and back on a preferred election run as ``kafka-leader-election.sh`` over SSH, and a
log recovery after an unclean stop that takes the bytes past the recovery point at the lab's rate, with the broker in
Kafka's RECOVERY state meanwhile. Every check reads the cluster's metadata itself (ZooKeeper, the decoder)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor import inventory as inv
from fleet_doctor.cluster_metadata import read_cluster_metadata
from fleet_doctor.remote import Remote
from fleet_lab import fleet
from harness.roll_watch import past_recovery_point
from harness.ssh import ssh_client

pytestmark = [pytest.mark.timeout(300), pytest.mark.live]
RATE = 40_000.0  # bytes per second of recovery: a lab broker's few hundred KB take seconds


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"{what} within {timeout} s")


@pytest.fixture(scope="module", params=["zookeeper", "kraft"])
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[fleet.LabState]:
    d = tmp_path_factory.mktemp(f"roll-{request.param}")
    state = fleet.up(d, brokers=3, metadata=request.param, racks=3, recovery_bytes_per_s=RATE)
    try:
        yield state
    finally:
        fleet.down(d)


def quorum_metadata(state: fleet.LabState) -> list[dict[str, Any]] | None:
    """The quorum leader's metadata; None while there is none (an election after the leader stopped)."""
    try:
        return fleet.read_metadata(state)
    except fleet.LabError:
        return None


def partitions(state: fleet.LabState) -> dict[str, dict[str, Any]]:
    """topic-partition -> replicas, leader, isr, as the cluster's metadata holds them now."""
    if state.kraft:
        records = wait_for(lambda: quorum_metadata(state), 15, "a quorum leader")
        out = {}
        assigned = {r["topic"]: r["partitions"] for r in records if r["kind"] == "topic"}
        for r in records:
            if r["kind"] == "partition_state":
                out[f"{r['topic']}-{r['partition']}"] = {
                    "replicas": assigned[r["topic"]][str(r["partition"])],
                    "leader": r["leader"],
                    "isr": r["isr"],
                }
        return out
    with state.zk_session() as zk:
        out = {}
        for t in zk.get_children("/brokers/topics"):
            znode = json.loads(zk.get(f"/brokers/topics/{t}")[0])
            for p, replicas in znode["partitions"].items():
                st = json.loads(zk.get(f"/brokers/topics/{t}/partitions/{p}/state")[0])
                out[f"{t}-{p}"] = {"replicas": replicas, "leader": st["leader"], "isr": st["isr"]}
        return out


def racks(state: fleet.LabState) -> dict[int, str | None]:
    if state.kraft:
        records = wait_for(lambda: quorum_metadata(state), 15, "a quorum leader")
        return {r["broker_id"]: r.get("rack") for r in records if r["kind"] == "broker" and not r.get("fenced")}
    with state.zk_session() as zk:
        return {int(b): json.loads(zk.get(f"/brokers/ids/{b}")[0]).get("rack") for b in zk.get_children("/brokers/ids")}


def remote(state: fleet.LabState, broker: int) -> tuple[Remote, inv.BrokerEntry]:
    entry = inv.load(state.inventory_path).broker(broker)
    return Remote(ssh_client(entry), broker), entry


def test_each_broker_registers_its_rack(lab: fleet.LabState) -> None:
    assert racks(lab) == {1: "rack-0", 2: "rack-1", 3: "rack-2"}
    # the lab's assignment spans racks: no two replicas of a partition in one rack
    for name, p in partitions(lab).items():
        assert len({lab.rack(b) for b in p["replicas"]}) == len(p["replicas"]), name


def test_leadership_moves_off_a_stopped_broker_and_back_on_a_preferred_election(lab: fleet.LabState) -> None:
    # every partition to its preferred leader first (a lab just up has its leaders where registration order left them)
    r, entry = remote(lab, 2)
    try:
        every = r.run(
            f"{entry.service['leader_election']} --election-type PREFERRED --all-topic-partitions", check=False
        )
    finally:
        r.close()
    assert every.exit_status == 0, every.stdout + every.stderr

    def all_preferred() -> dict[str, dict[str, Any]] | None:
        now = partitions(lab)
        return now if all(p["leader"] == p["replicas"][0] for p in now.values()) else None

    before = wait_for(all_preferred, 10, "every partition led by its preferred replica")
    led = sorted(n for n, p in before.items() if p["replicas"][0] == 1)
    assert led, before
    b = lab.broker(1)
    assert fleet.run_service(b, "stop").returncode == 0
    moved = wait_for(
        lambda: all(partitions(lab)[n]["leader"] not in (1, -1) for n in led), 30, "leadership moved off broker 1"
    )
    assert moved
    assert fleet.run_service(b, "start").returncode == 0
    wait_for(lambda: all(1 in partitions(lab)[n]["isr"] for n in led), 60, "broker 1 back in ISR")
    assert all(partitions(lab)[n]["leader"] != 1 for n in led)  # nothing moves it back by itself
    r, entry = remote(lab, 1)
    try:
        listed = json.dumps(
            {"partitions": [{"topic": n.rsplit("-", 1)[0], "partition": int(n.rsplit("-", 1)[1])} for n in led]}
        )
        path = f"{entry.tmp_dir}/elect.json"
        r.stream(f"cat > {path}", listed.encode(), lambda _b: None, 30)
        done = r.run(
            f"{entry.service['leader_election']} --election-type PREFERRED --path-to-json-file {path}", check=False
        )
        assert done.exit_status == 0, done.stdout + done.stderr
        assert done.stdout.startswith("Successfully completed leader election (PREFERRED) for partitions "), done.stdout
        assert sorted(done.stdout.strip().split("partitions ", 1)[1].split(", ")) == led
        after = partitions(lab)
        wait_for(lambda: all(partitions(lab)[n]["leader"] == 1 for n in led), 10, "broker 1 leads again")
        again = r.run(
            f"{entry.service['leader_election']} --election-type PREFERRED --path-to-json-file {path}", check=False
        )
        assert again.exit_status == 0 and again.stdout.startswith("Valid replica already elected for partitions ")
    finally:
        r.close()
    assert set(after) == set(before)


def test_a_partition_whose_preferred_replica_is_out_of_isr_is_not_elected(lab: fleet.LabState) -> None:
    b = lab.broker(2)
    mine = sorted(n for n, p in partitions(lab).items() if p["replicas"][0] == 2)
    assert fleet.run_service(b, "stop").returncode == 0
    try:
        wait_for(lambda: all(2 not in partitions(lab)[n]["isr"] for n in mine), 30, "broker 2 out of ISR")
        r, entry = remote(lab, 1)
        try:
            topic, p = mine[0].rsplit("-", 1)
            done = r.run(
                f"{entry.service['leader_election']} --election-type PREFERRED --topic {topic} --partition {p}",
                check=False,
            )
        finally:
            r.close()
        assert done.exit_status == 1
        assert (
            f"Error completing leader election (PREFERRED) for partition: {mine[0]}: "
            "org.apache.kafka.common.errors.PreferredLeaderNotAvailableException"
        ) in done.stdout
    finally:
        assert fleet.run_service(b, "start").returncode == 0
        wait_for(lambda: all(2 in partitions(lab)[n]["isr"] for n in mine), 60, "broker 2 back in ISR")


def test_recovery_after_an_unclean_stop_takes_its_time_in_the_recovery_state(lab: fleet.LabState) -> None:
    b = lab.broker(3)
    total = sum(past_recovery_point(Path(d)) for d in b.log_dirs)
    assert total > 0
    assert fleet.run_service(b, "kill").returncode == 0
    r, entry = remote(lab, 3)
    try:
        t0 = time.monotonic()
        started = r.run(entry.service["start"], check=False)
        assert started.exit_status == 0 and "recovering" in started.stdout, started.stdout
        seen = wait_for(
            lambda: (
                (s := r.run(entry.service["broker_state"], check=False).stdout).startswith("BrokerState=RECOVERY") and s
            ),
            10,
            "the broker state shows the recovery",
        )
        assert re.fullmatch(r"BrokerState=RECOVERY remainingLogsToRecover=\d+ remainingSegmentsToRecover=\d+\n", seen)
        wait_for(
            lambda: r.run(entry.service["broker_state"], check=False).stdout == "BrokerState=RUNNING\n", 120, "running"
        )
        took = time.monotonic() - t0
    finally:
        r.close()
    assert took >= 0.8 * total / RATE, (took, total)
    wait_for(lambda: 3 in racks(lab), 30, "broker 3 registered again")
    if lab.kraft:
        assert read_cluster_metadata(lab.broker(1).log_dirs[0])
