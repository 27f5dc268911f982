"""Kafka's ZooKeeper, as Fleet Doctor reads and (for a repair) writes it.

- ``snapshot``: the read side for detection: Kafka's metadata as JSON Lines, live or from a snapshot file.
- ``cluster``: what the repair's health gates read (registered brokers, controller, partition state, min ISR), and
  the one write a repair makes to Kafka's znodes (a topic's lost ``topic_id``, version-checked).
- ``lock``: the repair lock of a cluster (one repair at a time, surviving a crashed worker).

``session`` opens a kazoo client (imported only when used: DAG parsing imports this package).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def session(
    connect: str,
    timeout: float = 10.0,
    read_only: bool = False,
    retries: int | None = None,
    start_timeout: float | None = None,
) -> Iterator[Any]:
    """A started kazoo client for ``connect`` (Kafka's ``zookeeper.connect``: HOST:PORT[,...][/chroot]), stopped and
    closed on leaving the block. ``timeout``: the session timeout (an ephemeral znode outlives a crashed holder by
    about this long); ``start_timeout``: how long to wait for the connection (default ``timeout``); ``retries``:
    connection and command retries (kazoo's default: retry forever)."""
    from kazoo.client import KazooClient

    opts: dict[str, Any] = {}
    if retries is not None:
        retry = {"max_tries": retries, "delay": 0.1, "max_delay": 1.0}
        opts = {"connection_retry": retry, "command_retry": retry}
    zk = KazooClient(hosts=connect, timeout=timeout, read_only=read_only, **opts)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # kazoo warns when the chroot does not exist: callers report it
            zk.start(timeout=timeout if start_timeout is None else start_timeout)
        yield zk
    finally:
        zk.stop()
        zk.close()
