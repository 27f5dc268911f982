"""The lab's stand-ins for what a roll asks of a broker host besides its service: Kafka's preferred-leader election
tool and the broker's state gauges.

``kafka-service leader-election`` takes ``kafka-leader-election.sh``'s options (``--bootstrap-server H:P
--election-type PREFERRED`` and one of ``--path-to-json-file F``, ``--topic T --partition N``,
``--all-topic-partitions``) and prints what ``LeaderElectionCommand`` prints (Kafka 2.4+)::

    Successfully completed leader election (PREFERRED) for partitions t-0, t-1
    Valid replica already elected for partitions t-2
    Error completing leader election (PREFERRED) for partition: t-3: org.apache.kafka.common.errors.Preferred...

exiting 1 when some partition could not be elected. The election itself is the controller's, as in Kafka: on a
ZooKeeper lab the tool hands the partitions to the controller through ``/admin/preferred_replica_election`` (the
znode Kafka's controller watches; an Admin API request reaches the same election) and waits until the controller
deleted it; on a KRaft lab through a request file in the node's run dir that the active controller answers with
PartitionChangeRecords (``fleet_lab.quorum``). A partition moves back only to a preferred replica that is alive and
in its ISR (PreferredReplicaPartitionLeaderElectionStrategy).

``kafka-service state`` prints Kafka's ``BrokerState`` gauge (``kafka.server:type=KafkaServer,name=BrokerState``)
and, while the broker recovers its logs, LogManager's ``remainingLogsToRecover`` and ``remainingSegmentsToRecover``
(KIP-831, Kafka 3.3+): what Strimzi's KafkaAgent reads to tell a broker in recovery from a broker that failed.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from pathlib import Path
from typing import Any

PREFERRED_PATH = "/admin/preferred_replica_election"
ELECT_REQUEST = "elect-leaders.json"  # KRaft: in the requesting node's run dir, answered by the active controller
ELECT_RESULT = "elect-leaders.result.json"
NOT_AVAILABLE = "org.apache.kafka.common.errors.PreferredLeaderNotAvailableException"
UNKNOWN = "org.apache.kafka.common.errors.UnknownTopicOrPartitionException"
NOT_NEEDED = "noop"  # ElectionNotNeededException: the preferred replica already leads
# the lab state file's states as Kafka's BrokerState (metadata/BrokerState.java)
BROKER_STATES = {
    "starting": "STARTING",
    "recovering": "RECOVERY",
    "running": "RUNNING",
    "shutting-down": "PENDING_CONTROLLED_SHUTDOWN",
}


def not_available(name: str) -> str:
    return (
        f"{NOT_AVAILABLE}: Failed to elect leader for partition {name} under strategy "
        "PreferredReplicaPartitionLeaderElectionStrategy"
    )


def preferred_result(replicas: list[int], leader: int, isr: list[int], alive: set[int], name: str) -> str | None:
    """A preferred election's outcome for one partition: None (elected), ``NOT_NEEDED``, or the error."""
    if not replicas:
        return f"{UNKNOWN}: This server does not host this topic-partition."
    if leader == replicas[0]:
        return NOT_NEEDED
    if replicas[0] in isr and replicas[0] in alive:
        return None
    return not_available(name)


def print_results(results: dict[str, str | None]) -> int:
    """LeaderElectionCommand's output; 1 when some partition could not be elected."""
    done = sorted(k for k, v in results.items() if v is None)
    noop = sorted(k for k, v in results.items() if v == NOT_NEEDED)
    failed = {k: v for k, v in sorted(results.items()) if v not in (None, NOT_NEEDED)}
    if done:
        print(f"Successfully completed leader election (PREFERRED) for partitions {', '.join(done)}")
    if noop:
        print(f"Valid replica already elected for partitions {', '.join(noop)}")
    for k, v in failed.items():
        print(f"Error completing leader election (PREFERRED) for partition: {k}: {v}")
    if failed:
        print(
            f'Exception in thread "main" kafka.common.AdminCommandFailedException: {len(failed)} replica(s) '
            "could not be elected"
        )
    return 1 if failed else 0


def _requested(args: argparse.Namespace) -> list[tuple[str, int]] | None:
    """The partitions asked for (None: all of them)."""
    if args.path_to_json_file:
        data = json.loads(Path(args.path_to_json_file).read_text(encoding="utf-8"))
        return [(p["topic"], int(p["partition"])) for p in data["partitions"]]
    if args.topic is not None:
        return [(args.topic, int(args.partition))]
    return None


# --------------------------------------------------------------------------------------------
# ZooKeeper
def elect_zookeeper(cfg: Any, wanted: list[tuple[str, int]] | None, timeout: float) -> dict[str, str | None]:
    from kazoo.client import KazooClient
    from kazoo.exceptions import NodeExistsError, NoNodeError

    zk = KazooClient(hosts=cfg.zookeeper, timeout=10)
    zk.start(timeout=15)
    try:
        states = _zk_states(zk)
        names = [f"{t}-{p}" for t, p in (wanted if wanted is not None else sorted(states))]
        results: dict[str, str | None] = {}
        ask = []
        alive = {int(b) for b in zk.get_children("/brokers/ids")}
        for name, tp in zip(names, wanted if wanted is not None else sorted(states), strict=True):
            replicas, leader, isr = states.get(tp, ([], -1, []))
            results[name] = preferred_result(replicas, leader, isr, alive, name)
            if results[name] is None:
                ask.append({"topic": tp[0], "partition": tp[1]})
        if not ask:
            return results
        payload = json.dumps({"version": 1, "partitions": ask}).encode()
        deadline = time.monotonic() + timeout
        while True:
            try:
                zk.create(PREFERRED_PATH, payload, makepath=True)
                break
            except NodeExistsError:  # an election in progress: Kafka's controller runs one at a time
                if time.monotonic() > deadline:
                    raise SystemExit("Timeout waiting for election results") from None
                time.sleep(0.1)
        while zk.exists(PREFERRED_PATH):
            if time.monotonic() > deadline:
                raise SystemExit("Timeout waiting for election results")
            time.sleep(0.05)
        after = _zk_states(zk)
        for a in ask:
            tp = (a["topic"], a["partition"])
            name = f"{tp[0]}-{tp[1]}"
            replicas, leader, _isr = after.get(tp, ([], -1, []))
            results[name] = None if replicas and leader == replicas[0] else not_available(name)
        return results
    except NoNodeError as e:
        raise SystemExit(f"the cluster's metadata changed while it was read: {e}") from e
    finally:
        zk.stop()
        zk.close()


def _zk_states(zk: Any) -> dict[tuple[str, int], tuple[list[int], int, list[int]]]:
    from kazoo.exceptions import NoNodeError

    out = {}
    for topic in zk.get_children("/brokers/topics"):
        znode = json.loads(zk.get(f"/brokers/topics/{topic}")[0])
        for p, replicas in znode.get("partitions", {}).items():
            try:
                st = json.loads(zk.get(f"/brokers/topics/{topic}/partitions/{p}/state")[0])
            except NoNodeError:
                continue
            out[(topic, int(p))] = (list(replicas), int(st["leader"]), list(st["isr"]))
    return out


# --------------------------------------------------------------------------------------------
# KRaft
def elect_kraft(cfg: Any, wanted: list[tuple[str, int]] | None, timeout: float) -> dict[str, str | None]:
    from fleet_lab.kafka_files import write_atomic

    run_dir = Path(cfg.run_dir)
    rid = uuid.uuid4().hex
    request = {"id": rid, "partitions": None if wanted is None else [list(tp) for tp in wanted]}
    write_atomic(run_dir / ELECT_REQUEST, json.dumps(request).encode())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = json.loads((run_dir / ELECT_RESULT).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            result = {}
        if result.get("id") == rid:
            return dict(result["results"])
        time.sleep(0.05)
    raise SystemExit("Timeout waiting for election results")


def controller_answers(run_dirs: list[Path], elect: Any) -> None:
    """The active controller's side (``fleet_lab.quorum``): every voter's pending request answered with
    ``elect(partitions or None) -> {name: result}``, once."""
    from fleet_lab.kafka_files import write_atomic

    for d in run_dirs:
        try:
            request = json.loads((d / ELECT_REQUEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        try:
            done = json.loads((d / ELECT_RESULT).read_text(encoding="utf-8")).get("id") == request.get("id")
        except (OSError, ValueError):
            done = False
        if done:
            continue
        wanted = request.get("partitions")
        results = elect(None if wanted is None else [(t, int(p)) for t, p in wanted])
        write_atomic(d / ELECT_RESULT, json.dumps({"id": request.get("id"), "results": results}).encode())


# --------------------------------------------------------------------------------------------
def leader_election(cfg: Any, argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kafka-leader-election.sh")
    p.add_argument("--bootstrap-server", required=True)
    p.add_argument("--election-type", required=True, type=str.upper, choices=["PREFERRED"])
    p.add_argument("--path-to-json-file")
    p.add_argument("--topic")
    p.add_argument("--partition", type=int)
    p.add_argument("--all-topic-partitions", action="store_true")
    p.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args(argv)
    given = sum(bool(x) for x in (args.path_to_json_file, args.topic is not None, args.all_topic_partitions))
    if given != 1:
        print("One and only one of the following options is required: topic, all-topic-partitions, path-to-json-file")
        return 1
    wanted = _requested(args)
    results = elect_kraft(cfg, wanted, args.timeout) if cfg.kraft else elect_zookeeper(cfg, wanted, args.timeout)
    return print_results(results)


def broker_state(cfg: Any, running: bool) -> int:
    """``BrokerState=<name>`` and, in recovery, the remaining logs and segments; exit 3 when not running."""
    try:
        fields = Path(cfg.state_file).read_text(encoding="utf-8").split()
    except OSError:
        fields = []
    if not running or not fields:
        print("BrokerState=NOT_RUNNING")
        return 3
    name = BROKER_STATES.get(fields[0], "UNKNOWN")
    line = f"BrokerState={name}"
    if name == "RECOVERY" and len(fields) >= 4:
        line += f" remainingLogsToRecover={fields[2]} remainingSegmentsToRecover={fields[3]}"
    print(line)
    return 0
