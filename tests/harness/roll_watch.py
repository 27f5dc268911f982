"""A watcher of a ZooKeeper lab's partition states while a roll runs (the roll benchmark's and the roll fault test's):
what the cluster's metadata said at every moment, read by the test itself, never from the product under test."""

from __future__ import annotations

import json
import threading
import time

from fleet_lab import fleet


class Watcher(threading.Thread):
    """Samples every partition's state and each topic's min ISR from ZooKeeper every ``every_s`` until ``done``:
    ``samples`` of (time, partitions, {partition: (preferred replica, leader)}, the partitions below min ISR)."""

    def __init__(self, state: fleet.LabState, every_s: float) -> None:
        super().__init__(daemon=True, name="watcher")
        self.state, self.every_s = state, every_s
        # (ts, partitions, {partition: (preferred replica, leader)}, below min ISR)
        self.samples: list[tuple[float, int, dict[str, tuple[int, int]], list[str]]] = []
        self.done = threading.Event()

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
            while not self.done.is_set():
                ts = time.time()
                pending = [(t, p, zk.get_async(path)) for t, p, path in paths]
                below, leaders = [], {}
                for t, p, res in pending:
                    st = json.loads(res.get(timeout=10)[0])
                    if len(st["isr"]) < min_isr[t]:
                        below.append(f"{t}-{p} ISR {st['isr']} < {min_isr[t]}")
                    leaders[f"{t}-{p}"] = (topics[t][p][0], st["leader"])
                self.samples.append((ts, len(paths), leaders, below))
                self.done.wait(self.every_s)

    def below_min_isr(self) -> list[tuple[float, list[str]]]:
        """The samples in which some partition was below its min ISR, and which."""
        return [(ts, below) for ts, _n, _leaders, below in self.samples if below]
