"""Is the SSH host at the other end broker N? Checked before a broker is staged or changed.

An inventory that swaps two hosts (a copy-paste, a re-imaged machine, DNS pointing elsewhere) would otherwise stage
broker 2's files under broker 1's id, or let a repair stop and change the wrong broker. Two checks, both against
what the host itself says:

1. the SSH transport's host key (``get_remote_server_key``) is the inventory's pinned ``host_key``: the connection
   helper is expected to pin it already, this proves it on the connection actually used;
2. the ``meta.properties`` of each of the inventory's log dirs names the inventory's id (``broker.id``, or
   ``node.id`` in KRaft: Kafka refuses to start on a log dir whose meta.properties names another id,
   ``Configured broker.id ... doesn't match stored broker.id``).

A log dir without ``meta.properties`` is accepted as long as every one that exists names this broker: Kafka writes
the file into every log dir on its first start, so a dir without one is a dir it has not used yet (a new broker, or
a log dir just added to ``log.dirs``), holding nothing that could be staged or repaired. When no log dir has one the
host key alone identifies the host; a caller about to change files passes ``require_meta=True`` and is refused.
"""

from __future__ import annotations

import base64
import hashlib
import shlex
from collections.abc import Iterable
from typing import Any

from fleet_doctor import inventory
from fleet_doctor.probe import META_PROPERTIES, parse_meta_properties
from fleet_doctor.remote import Remote

READ_LIMIT = 65536  # a meta.properties is a few hundred bytes; anything longer is not one
_MISSING = 66  # the exit status the read command reports a missing meta.properties with


class IdentityError(RuntimeError):
    """The SSH host is not the broker the inventory says (or cannot be shown to be): the message names both."""


def fingerprint(host_key: str) -> str:
    """``<type> SHA256:<base64>`` as ``ssh-keygen -l`` prints it, for a ``<type> <base64>`` key line."""
    kind, _, b64 = host_key.strip().partition(" ")
    try:
        blob = base64.b64decode(b64.split()[0], validate=True) if b64 else b""
    except ValueError:
        return host_key.strip()[:60]
    return f"{kind} SHA256:{base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip('=')}"


def presented_host_key(client: Any) -> str:
    """The host key the SSH server presented on this connection, as ``<type> <base64>``."""
    transport = client.get_transport() if client is not None else None
    if transport is None or not transport.is_active():
        raise IdentityError("the SSH connection is not open: cannot tell which host it reaches")
    key = transport.get_remote_server_key()
    return f"{key.get_name()} {key.get_base64()}"


def _same_key(a: str, b: str) -> bool:
    return a.split()[:2] == b.split()[:2]  # a trailing comment is not part of the key


def _read_meta(remote: Remote, log_dir: str, timeout: float) -> tuple[str, bytes | None]:
    """(path, content) of a log dir's meta.properties; content None when the file does not exist."""
    path = f"{log_dir.rstrip('/')}/{META_PROPERTIES}"
    q = shlex.quote(path)
    done = remote.run(f"test -e {q} || exit {_MISSING}; exec head -c {READ_LIMIT + 1} -- {q}", timeout, check=False)
    if done.exit_status == _MISSING:
        return path, None
    if done.exit_status != 0:
        raise IdentityError(f"cannot read {path} (exit {done.exit_status}: {done.stderr.strip()[-300:]})")
    data = done.stdout.encode("utf-8", errors="surrogateescape")
    if len(data) > READ_LIMIT:
        raise IdentityError(f"{path} is longer than {READ_LIMIT} bytes: not a Kafka meta.properties")
    return path, data


def verify_identity(
    remote_or_client: Any,
    broker_id: int,
    host_key: str,
    log_dirs: Iterable[str],
    *,
    where: str = "",
    require_meta: bool = False,
    timeout: float = 30.0,
) -> str:
    """Check that the connection reaches broker ``broker_id`` (module docstring): its host key is ``host_key`` and
    the meta.properties of ``log_dirs`` name ``broker_id``. ``where``: the inventory's host:port, for messages.
    Returns what was checked (one line, for a log or journal); IdentityError naming both sides otherwise."""
    if isinstance(remote_or_client, Remote):
        remote, client = remote_or_client, remote_or_client.client
    else:
        remote, client = Remote(remote_or_client, broker_id), remote_or_client
    who = f"inventory broker {broker_id}" + (f" ({where})" if where else "")
    try:
        presented = presented_host_key(client)
    except IdentityError as e:
        raise IdentityError(f"{who}: {e}") from None
    except Exception as e:  # paramiko's errors are not all OSErrors
        raise IdentityError(f"{who}: cannot read the SSH host key: {type(e).__name__}: {e}") from e
    if not _same_key(presented, host_key):
        raise IdentityError(
            f"{who}: the SSH server presented host key {fingerprint(presented)}, the inventory pins "
            f"{fingerprint(host_key)} for broker {broker_id}: this is another host (or its key changed); "
            "check which machine this is before correcting the inventory"
        )
    found: dict[str, int] = {}
    missing: list[str] = []
    for log_dir in log_dirs:
        try:
            path, data = _read_meta(remote, log_dir, timeout)
        except IdentityError as e:
            raise IdentityError(f"{who}: {e}") from None
        except Exception as e:  # RemoteError: the command could not run
            raise IdentityError(f"{who}: cannot read the meta.properties of {log_dir}: {e}") from e
        if data is None:
            missing.append(path)
            continue
        try:
            meta = parse_meta_properties(data, path)
        except ValueError as e:
            raise IdentityError(f"{who}: {path} is not a valid meta.properties: {e}") from None
        if meta["broker_id"] is None:
            raise IdentityError(f"{who}: {path} names no broker.id or node.id: cannot tell which broker this is")
        found[path] = meta["broker_id"]
    others = {p: b for p, b in found.items() if b != broker_id}
    if others:
        said = "; ".join(f"{p} says broker.id {b}" for p, b in others.items())
        ids = sorted(set(others.values()))
        raise IdentityError(
            f"{who}: the host says it is broker {', '.join(map(str, ids))}, not broker {broker_id}: {said}; "
            "fix the inventory (host, port, host key) of the brokers involved"
        )
    if not found and require_meta:
        raise IdentityError(
            f"{who}: no meta.properties in {', '.join(missing)}: the host's broker id cannot be confirmed "
            "(a broker that never started has nothing to change)"
        )
    summary = f"{who}: host key {fingerprint(presented)} as pinned"
    if found:
        summary += f"; broker.id {broker_id} in {', '.join(found)}"
    if missing:
        summary += f"; no meta.properties yet in {', '.join(missing)}"
    return summary


def verify_broker(
    remote_or_client: Any, entry: inventory.BrokerEntry, *, require_meta: bool = False, timeout: float = 30.0
) -> str:
    """``verify_identity`` for the inventory's broker ``entry`` over ``remote_or_client`` (a ``Remote`` or a
    connected ``paramiko.SSHClient``). Raises IdentityError (a RuntimeError) naming the inventory's id and host and
    what the host says; returns what was checked."""
    return verify_identity(
        remote_or_client,
        entry.id,
        entry.host_key,
        entry.log_dirs,
        where=f"{entry.host}:{entry.ssh_port}",
        require_meta=require_meta,
        timeout=timeout,
    )
