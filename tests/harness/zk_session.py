"""A ZooKeeper session expired on purpose, as a network partition longer than its timeout expires it."""

from __future__ import annotations

import time
from typing import Any


def expire(hosts: str, zk: Any, timeout: float = 30.0) -> None:
    """Expire the kazoo client ``zk``'s session (a second client attaches to the same session on ``hosts`` and
    closes it) and wait until kazoo has reconnected with a new session."""
    from kazoo.client import KazooClient

    old = zk.client_id
    twin = KazooClient(hosts=hosts, client_id=old)
    twin.start(timeout=15)
    twin.stop()
    twin.close()
    deadline = time.monotonic() + timeout
    while not (zk.connected and zk.client_id and zk.client_id[0] != old[0]):
        assert time.monotonic() < deadline, "kazoo did not reconnect with a new session"
        time.sleep(0.05)
