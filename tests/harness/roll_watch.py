"""What the roll's tests and benchmark read from the lab themselves, never from the product under test: a watcher of
a ZooKeeper lab's partition states while a roll runs (what the metadata said at every moment), and the bytes an
unclean stop leaves a broker to recover."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from fleet_doctor.probe import parse_offset_checkpoint
from fleet_lab import fleet


class Watcher(threading.Thread):
    """Samples every partition's state and each topic's min ISR from ZooKeeper every ``every_s`` until ``done``, and
    once more after it is set (so that the last sample is of the state after what was watched): ``samples`` of (time,
    partitions, {partition: (preferred replica, leader)}, the partitions below min ISR)."""

    def __init__(self, state: fleet.LabState, every_s: float) -> None:
        super().__init__(daemon=True, name="watcher")
        self.state, self.every_s = state, every_s
        # (ts, partitions, {partition: (preferred replica, leader)}, below min ISR)
        self.samples: list[tuple[float, int, dict[str, tuple[int, int]], list[str]]] = []
        self.done = threading.Event()
        self.registrations: dict[int, list[int]] = {}  # broker -> the czxids of its /brokers/ids entry, in turn

    def run(self) -> None:
        with self.state.zk_session() as zk:
            topics = {
                t: json.loads(zk.get(f"/brokers/topics/{t}")[0])["partitions"]
                for t in zk.get_children("/brokers/topics")
            }
            min_isr = {}
            for t in topics:
                cfg = json.loads(zk.get(f"/config/topics/{t}")[0]) if zk.exists(f"/config/topics/{t}") else {}
                min_isr[t] = int((cfg.get("config") or {}).get("min.insync.replicas", 1))
            paths = [(t, p, f"/brokers/topics/{t}/partitions/{p}/state") for t, ps in topics.items() for p in ps]
            while True:  # one sample more once ``done`` is set: the last sample is of the state after the roll
                last = self.done.is_set()
                ts = time.time()
                brokers = [(int(b), zk.exists_async(f"/brokers/ids/{b}")) for b in zk.get_children("/brokers/ids")]
                pending = [(t, p, zk.get_async(path)) for t, p, path in paths]
                below, leaders = [], {}
                for t, p, res in pending:
                    st = json.loads(res.get(timeout=10)[0])
                    if len(st["isr"]) < min_isr[t]:
                        below.append(f"{t}-{p} ISR {st['isr']} < {min_isr[t]}")
                    leaders[f"{t}-{p}"] = (topics[t][p][0], st["leader"])
                self.samples.append((ts, len(paths), leaders, below))
                for b, res in brokers:
                    stat = res.get(timeout=10)
                    seen = self.registrations.setdefault(b, [])
                    if stat is not None and (not seen or seen[-1] != stat.czxid):
                        seen.append(stat.czxid)
                if last:
                    return
                self.done.wait(self.every_s)

    def registered_again(self, expected: dict[int, int]) -> dict[int, int]:
        """Brokers that registered more often than ``expected`` (broker -> its restarts while watched): a ZooKeeper
        session that expired and was made again (a starved lab broker on a busy machine), no restart of the roll's."""
        return {
            b: len(czxids) - 1 - expected.get(b, 0)
            for b, czxids in self.registrations.items()
            if len(czxids) - 1 > expected.get(b, 0)
        }

    def below_min_isr(self) -> list[tuple[float, list[str]]]:
        """The samples in which some partition was below its min ISR, and which."""
        return [(ts, below) for ts, _n, _leaders, below in self.samples if below]


def past_recovery_point(log_dir: Path) -> int:
    """The bytes an unclean stop leaves to recover in ``log_dir`` (kafka-reference.md §2.4): each partition's
    segments from the one holding its checkpointed recovery point on."""
    entries, _ = parse_offset_checkpoint((log_dir / "recovery-point-offset-checkpoint").read_bytes(), "rp")
    points = {f"{t}-{p}": o for t, p, o in entries}
    total = 0
    for part in log_dir.iterdir():
        if part.is_dir() and not part.name.startswith("__cluster_metadata") and "-" in part.name:
            logs = sorted((int(f.name.split(".")[0]), f) for f in part.glob("*.log"))
            point = points.get(part.name, 0)
            start = max([base for base, _ in logs if base <= point], default=logs[0][0] if logs else 0)
            total += sum(f.stat().st_size for base, f in logs if base >= start)
    return total
