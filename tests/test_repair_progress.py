"""The repair's progress lines during long waits (repair.progress): the reporter on a clock the test drives, and a real
restart of one lab broker (real sshd, ZooKeeper 3.8, lab brokers, Spark post-verify) whose log says, while it waits,
what it waits for: the stop, the registration, the broker's partitions back in ISR, the healthy polls, the pause
between brokers and the post-verify."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor import inventory
from fleet_doctor.layout import RepairsDir
from fleet_doctor.repair import tasks
from fleet_doctor.repair.broker import ssh_hosts
from fleet_doctor.repair.executor import Executor
from fleet_doctor.repair.plan import BrokerPlan, FileAction, Plan
from fleet_doctor.repair.progress import Progress, heartbeat, pause
from fleet_doctor.settings import Settings
from fleet_doctor.zookeeper.cluster import Cluster
from fleet_lab import fleet
from harness.repair_lab import FAST
from harness.ssh import ssh_connect


class Clock:
    """A clock the test moves (and a sleep that moves it)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


class Captured(logging.Handler):
    """The records of ``fleet_doctor``'s loggers, on a handler of its own: pytest's caplog handler sits on the root
    logger, which the audit's imports (Airflow's logging setup) may replace in the middle of a test."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def logged() -> Iterator[Captured]:
    logger = logging.getLogger("fleet_doctor")
    handler, level = Captured(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _lines(logged: Captured, logger: str = "fleet_doctor") -> list[str]:
    return [r.getMessage() for r in list(logged.records) if r.name.startswith(logger)]


def test_a_wait_logs_at_most_every_n_seconds_with_elapsed_and_timeout(logged: Captured) -> None:
    clock = Clock()
    with Progress("broker 2: waiting for ISR", 900, every=5, clock=clock) as p:
        written = []
        for t, back in [(0, 0), (2, 1), (4.9, 2), (5, 3), (9, 3), (10.2, 4), (35, 4)]:
            clock.now = 1000.0 + t
            written.append(p.update(f"{back}/6 partitions back"))
        clock.now = 1040.4
        p.done("6/6 partitions back, 3/3 healthy polls")
    assert written == [True, False, False, True, False, True, True]
    assert _lines(logged) == [
        "broker 2: waiting for ISR, 0/6 partitions back, 0 s of 900 s",
        "broker 2: waiting for ISR, 3/6 partitions back, 5 s of 900 s",
        "broker 2: waiting for ISR, 4/6 partitions back, 10 s of 900 s",
        "broker 2: waiting for ISR, 4/6 partitions back, 35 s of 900 s",
        "broker 2: waiting for ISR: done, 6/6 partitions back, 3/3 healthy polls, after 40 s",
    ]


def test_a_wait_that_raises_ends_with_a_warning_naming_its_last_state(logged: Captured) -> None:
    clock = Clock()
    with pytest.raises(RuntimeError, match="did not stop"):
        with Progress("broker 1: waiting for the process to exit", 300, clock=clock) as p:
            p.update("still registered in /brokers/ids")
            clock.now += 300
            raise RuntimeError("broker 1 did not stop within 300 s")
    last = logged.records[-1]
    assert last.levelno == logging.WARNING
    assert last.getMessage() == (
        "broker 1: waiting for the process to exit: failed after 300 s of 300 s (last: still registered in "
        "/brokers/ids): RuntimeError: broker 1 did not stop within 300 s"
    )
    # a block that ends without done() still gets its final line, once
    logged.records.clear()
    with Progress("pause", None, clock=clock) as p:
        clock.now += 7
    assert _lines(logged) == ["pause: done, after 7 s"]


def test_the_pause_sleeps_its_whole_length_and_says_how_far_it_is(logged: Captured) -> None:
    clock = Clock()
    pause("pause after broker 2 before the next (1 left)", 60, every=20, clock=clock, sleep=clock.sleep)
    assert sum(clock.slept) == 60 and max(clock.slept) <= 20
    assert _lines(logged) == [
        "pause after broker 2 before the next (1 left), 0 s of 60 s",
        "pause after broker 2 before the next (1 left), 20 s of 60 s",
        "pause after broker 2 before the next (1 left), 40 s of 60 s",
        "pause after broker 2 before the next (1 left): done, after 60 s",
    ]
    clock.slept.clear()
    pause("pause", 7.5, every=5, clock=clock, sleep=clock.sleep)  # not a multiple of every: the rest at the end
    assert clock.slept == [5, 2.5]


def test_a_blocking_call_gets_a_heartbeat_until_it_returns(logged: Captured) -> None:
    """The heartbeat thread writes while the block runs; the block waits (on an event, not a fixed sleep) until it
    has seen two heartbeats, with the stage it set."""
    beats = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if sum("Spark detection running, " in m for m in _lines(logged)) >= 2:
                beats.set()

    handler = Seen()
    logging.getLogger("fleet_doctor").addHandler(handler)
    try:
        with heartbeat("re-verify run1-verify: a fresh audit", every=0.02) as p:
            p.detail = "Spark detection running"
            assert beats.wait(30), _lines(logged)
        with pytest.raises(ValueError):
            with heartbeat("post-verify", every=0.02):
                raise ValueError("bad probe output")
    finally:
        logging.getLogger("fleet_doctor").removeHandler(handler)
    lines = _lines(logged)
    assert lines[0] == "re-verify run1-verify: a fresh audit: started"
    # the first beat may come before the block set its stage ("running"): every beat says the one it had then
    beats_seen = [ln for ln in lines[1:] if ln.startswith("re-verify run1-verify: a fresh audit, ")]
    assert beats_seen and all(
        re.fullmatch(r"re-verify run1-verify: a fresh audit, (running|Spark detection running), \d+ s", ln)
        for ln in beats_seen
    ), beats_seen
    assert any("Spark detection running" in ln for ln in beats_seen)
    assert re.fullmatch(
        r"re-verify run1-verify: a fresh audit: done, after \d+ s", lines[lines.index("post-verify: started") - 1]
    )
    assert re.fullmatch(r"post-verify: failed after \d+ s: ValueError: bad probe output", lines[-1])
    assert logged.records[-1].levelno == logging.WARNING
    n = len(_lines(logged))
    assert not [t for t in threading.enumerate() if t.name.startswith("progress: ")]  # the threads ended
    assert len(_lines(logged)) == n  # and write nothing more


# ---------------------------------------------------------------------------------------- on the fleet lab
@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A healthy 3-broker lab (no scenario, no audit)."""
    lab_dir = tmp_path_factory.mktemp("repair-progress") / "lab"
    state = fleet.up(lab_dir, brokers=3)
    try:
        yield {"state": state, "inv": inventory.load(lab_dir / "inventory.json"), "tmp": lab_dir.parent}
    finally:
        fleet.down(lab_dir)


def _replicas_of(zk: Any, broker_id: int) -> list[tuple[str, int]]:
    """The partitions with a replica on the broker, read from ZooKeeper here (not through the product)."""
    out = []
    for topic in zk.get_children("/brokers/topics"):
        for p, replicas in json.loads(zk.get(f"/brokers/topics/{topic}")[0])["partitions"].items():
            if broker_id in replicas:
                out.append((topic, int(p)))
    return sorted(out)


@pytest.mark.timeout(600)
def test_a_restart_logs_what_it_waits_for(lab: dict[str, Any], logged: Captured) -> None:
    """Two brokers restarted by the real executor, one file each (leader-epoch-checkpoint, which Kafka re-creates at
    load): the log has the stop, the registration, "k/n partitions back" with n the broker's partitions in ZooKeeper,
    "1/3" and "2/3 healthy polls" then "3/3", the pause between them, and the post-verify's start and end."""
    state: fleet.LabState = lab["state"]
    zk = state.zk_client()
    try:
        brokers, mine = [], {}
        for bid in (1, 2):
            mine[bid] = _replicas_of(zk, bid)
            topic, p = next(x for x in mine[bid] if x[0] == "orders")
            pdir = next(
                Path(d) / f"{topic}-{p}" for d in state.broker(bid).log_dirs if (Path(d) / f"{topic}-{p}").is_dir()
            )
            action = FileAction("remove", str(pdir / "leader-epoch-checkpoint"), "test", topic, p, "progress test")
            brokers.append(BrokerPlan(bid, False, True, [action]))
        controller = json.loads(zk.get("/controller")[0])["brokerid"]
        plan = Plan(state.cluster, "progress", {}, sorted(brokers, key=lambda b: b.broker_id == controller), [], [])
        gates = replace(FAST, healthy_polls=3, poll_interval_s=1, pause_between_brokers_s=2, progress_every_s=0)
        ex = Executor(
            plan,
            RepairsDir(lab["tmp"] / "repairs").attempt(plan.hash, "manual"),
            lab["inv"],
            ssh_hosts(lab["inv"], ssh_connect(lab["inv"])),
            Cluster(zk),
            gates,
        )
        assert ex.run()["status"] == "done"
    finally:
        zk.stop()
    lines = _lines(logged, "fleet_doctor.repair")
    first, second = (b.broker_id for b in plan.brokers)
    for bid in (first, second):
        n = len(mine[bid])
        assert n > 0
        said = [x for x in lines if x.startswith(f"broker {bid}: ")]
        assert any(
            re.fullmatch(
                rf"broker {bid}: waiting for the process to exit and its /brokers/ids entry to go: done, after \d+ s", x
            )
            for x in said
        ), said
        assert any(
            re.fullmatch(rf"broker {bid}: started, waiting for its /brokers/ids entry: done, after \d+ s", x)
            for x in said
        ), said
        isr = [x for x in said if x.startswith(f"broker {bid}: waiting for ISR")]
        for k in (1, 2):
            assert any(
                re.fullmatch(
                    rf"broker {bid}: waiting for ISR, \d+/{n} partitions back, {k}/3 healthy polls, \d+ s of 60 s", x
                )
                for x in isr
            ), isr
        assert re.fullmatch(
            rf"broker {bid}: waiting for ISR: done, {n}/{n} partitions back, 3/3 healthy polls, after \d+ s", isr[-1]
        ), isr
        post = [x for x in said if "post-verify" in x]
        assert post[0] == f"broker {bid}: post-verify of 1 file(s) (a fresh probe, Spark detection): started", post
        assert re.fullmatch(
            rf"broker {bid}: post-verify of 1 file\(s\) \(a fresh probe, Spark detection\): done, after \d+ s", post[-1]
        ), post
    pauses = [x for x in lines if x.startswith(f"pause after broker {first} before the next (1 left)")]
    assert pauses[0] == f"pause after broker {first} before the next (1 left), 0 s of 2 s", pauses
    assert re.fullmatch(rf"pause after broker {first} before the next \(1 left\): done, after 2 s", pauses[-1]), pauses
    # in order: the first broker's ISR wait ends before the pause, the second broker's stop comes after it
    at = {x: i for i, x in enumerate(lines)}
    assert at[pauses[-1]] < min(i for x, i in at.items() if x.startswith(f"broker {second}: waiting for the process"))


@pytest.mark.timeout(600)
def test_the_reverify_logs_its_start_heartbeats_and_end(lab: dict[str, Any], logged: Captured) -> None:
    """The re-verify before a repair (a fresh audit of the whole fleet: staging over SSH, Spark detection) is one
    blocking call: its start, a heartbeat every 5 s while it runs, its end with the time it took and what it found."""
    settings = Settings(inventory=lab["tmp"] / "lab" / "inventory.json", data_root=lab["tmp"] / "data")
    run, fresh = tasks.reverify(settings, "manual__progress", {}, ssh_connect(lab["inv"]))
    what = f"re-verify {run}: a fresh audit of the whole fleet (every broker probed, Spark detection)"
    lines = [x for x in _lines(logged, "fleet_doctor.repair") if x.startswith(f"re-verify {run}")]
    assert lines[0] == f"{what}: started", lines
    done = re.fullmatch(rf"{re.escape(what)}: done, after (\d+) s", lines[-2])
    assert done, lines
    beats = [x for x in lines[1:-2] if re.fullmatch(rf"{re.escape(what)}, running, \d+ s", x)]
    assert len(beats) == len(lines) - 3  # nothing else between the start and the end
    if int(done[1]) >= 10:  # it ran long enough that the thread must have beaten at least once
        assert beats, lines
    found = len(settings.store.read_jsonl(f"verify/{run}/findings.jsonl"))
    assert lines[-1] == f"re-verify {run}: {found} finding(s), the fleet now gives plan {fresh.hash[:12]}"
