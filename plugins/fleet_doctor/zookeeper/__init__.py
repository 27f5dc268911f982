"""Kafka's ZooKeeper, as Fleet Doctor reads and (for a repair) writes it.

- ``snapshot``: the read side for detection: Kafka's metadata as JSON Lines, live or from a snapshot file.
- ``cluster``: what the repair's health gates read (registered brokers, controller, partition state, min ISR), and
  the one write a repair makes to Kafka's znodes (a topic's lost ``topic_id``, version-checked).
- ``lock``: the repair lock of a cluster (one repair at a time, surviving a crashed worker).
- ``auth``: the product's ZooKeeper identity (digest or SASL, from the Airflow connection ``kafka_zk_<cluster>``)
  and the ACL of the znodes it creates.

``session`` opens a kazoo client (imported only when used: DAG parsing imports this package); ``cluster_session``
opens one for an inventory's cluster with its credentials.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from fleet_doctor.zookeeper.auth import ZkAuth, ZkAuthError, as_auth, credentials, tls

__all__ = ["ZkAuth", "ZkAuthError", "cluster_session", "credentials", "session", "tls"]


@contextmanager
def session(
    connect: str,
    timeout: float = 10.0,
    read_only: bool = False,
    retries: int | None = None,
    start_timeout: float | None = None,
    auth: ZkAuth | tuple[str, str] | None = None,
    tls: Mapping[str, Any] | None = None,
) -> Iterator[Any]:
    """A started kazoo client for ``connect`` (Kafka's ``zookeeper.connect``: HOST:PORT[,...][/chroot]), stopped and
    closed on leaving the block. ``timeout``: the session timeout (an ephemeral znode outlives a crashed holder by
    about this long); ``start_timeout``: how long to wait for the connection (default ``timeout``); ``retries``:
    connection and command retries (kazoo's default: retry forever); ``auth``: the identity to authenticate as (a
    ``ZkAuth`` or kazoo's ``(scheme, credential)``), whose ACL (``ZkAuth.acl``) becomes the client's default ACL:
    every znode created through this session is changeable by that identity only; ``tls``: kazoo's TLS options
    (``auth.tls_from_extra``)."""
    from kazoo.client import KazooClient

    opts: dict[str, Any] = {}
    if retries is not None:
        retry = {"max_tries": retries, "delay": 0.1, "max_delay": 1.0}
        opts = {"connection_retry": retry, "command_retry": retry}
    identity = as_auth(auth)
    if identity is not None:
        opts.update(identity.kazoo_options(), default_acl=identity.acl())
    opts.update(tls or {})
    zk = KazooClient(hosts=connect, timeout=timeout, read_only=read_only, **opts)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # kazoo warns when the chroot does not exist: callers report it
            zk.start(timeout=timeout if start_timeout is None else start_timeout)
        yield zk
    finally:
        zk.stop()
        zk.close()


@contextmanager
def cluster_session(inv: Any, **session_kw: Any) -> Iterator[Any]:
    """``session(inv.zookeeper, auth=credentials(inv), **session_kw)``: a started kazoo client for the inventory's
    ZooKeeper (chroot included), authenticated as the Airflow connection ``kafka_zk_<cluster>`` says (none when
    Airflow or the connection is absent), over TLS when it says so. An ``auth`` or ``tls`` in ``session_kw``
    replaces the connection's."""
    if "auth" not in session_kw:
        session_kw["auth"] = credentials(inv)
    if "tls" not in session_kw:
        session_kw["tls"] = tls(inv)
    with session(inv.zookeeper, **session_kw) as zk:
        yield zk
