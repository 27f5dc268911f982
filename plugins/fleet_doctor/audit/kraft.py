"""A KRaft cluster's metadata, read from its controllers over SSH (the audit's ``discover`` and ``snapshot_metadata``).

On a controller the decoder (``fleet_doctor.cluster_metadata``, sent on stdin as one program, as the probe is) replays
the latest snapshot and the metadata log of its ``metadata_log_dir`` and prints JSON Lines in the ZooKeeper snapshot's
shape (docs/cluster-metadata-schema.md): ``cluster_metadata`` first, ``cluster_metadata_end`` last. Before that the
host proves it is that controller (``fleet_doctor.identity``: the pinned host key, ``node.id`` in the metadata log
dir's ``meta.properties``). Every controller of the inventory is read, in its order; whatever goes wrong with one
(unreachable, another host, a decoder that exits non-zero, output that is not what the decoder prints) is a
``MetadataReadError`` naming it, and the others are read all the same.

The cluster's facts are taken from the most up-to-date metadata log read, as Raft compares logs (the epoch of the
newest batch, then the log end offset), the inventory's order breaking ties: in a healthy quorum the logs differ by
the last few batches at most (on 3.3+ the leader writes a NoOpRecord every ``metadata.max.idle.interval.ms``, so the
controller read last is often a batch ahead) and any of them gives the same facts; a controller that was stopped
(its host still up) or cut off has a log that stopped where it left the quorum, and its registrations would say that
brokers started since are not there. A log whose image misses records (a snapshot gap, a batch failing its CRC) is
used only when no whole one was read. One fact is the quorum's, not that log's: the active controller, the leader a
majority of the controllers read name at the newest epoch (``cluster_metadata.quorum_controller``), since which log
is a batch ahead changes from one read to the next and one voter's ``quorum-state`` may name another leader.
"""

from __future__ import annotations

import functools
import json
import shlex
import socket
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fleet_doctor import cluster_metadata
from fleet_doctor.identity import verify_identity
from fleet_doctor.remote import Remote, airflow_ssh_client, lowest_priority

DECODE_TIMEOUT_S = 600.0
# the decoder's own limits on a controller (``cluster_metadata.main``: RLIMIT_AS, RLIMIT_CPU). A 200,000-partition
# cluster's log decodes in 4.3 s of CPU and under 120 MiB (bench/README.md, "KRaft decoder"): room for ten times that
DECODE_MEMORY_MIB = 4096
DECODE_CPU_S = int(DECODE_TIMEOUT_S)
MAX_OUTPUT_BYTES = 1 << 30  # a 200,000-partition cluster prints ~100 MB; more is not the decoder's output
SPOOL_BYTES = 32 << 20  # kept in memory up to this, then in a temporary file
HEADER, END, PROBLEM = "cluster_metadata", "cluster_metadata_end", "metadata_problem"

Connect = Callable[[dict[str, Any]], Any]  # a controller's endpoint -> a connected paramiko.SSHClient


class MetadataReadError(RuntimeError):
    """A controller's metadata could not be read (the message names the controller and why)."""


def airflow_connect(endpoint: dict[str, Any]) -> Any:
    """The controller's SSH connection from Airflow (a combined controller's is its broker's)."""
    return airflow_ssh_client(endpoint["ssh_conn_id"])


def decode_command(
    metadata_log_dir: str,
    max_memory_mib: int = DECODE_MEMORY_MIB,
    max_cpu_s: int = DECODE_CPU_S,
    *,
    position: bool = False,
    records: tuple[int, int | None, list[int] | None] | None = None,
) -> str:
    """The remote command: the decoder read from stdin by python3, at the lowest CPU and I/O priority the host offers
    (as the probe), within ``max_memory_mib`` of address space and ``max_cpu_s`` of CPU (it exits 3 saying which it
    hit); ``position``: only where the log ends (``cluster_metadata.metadata_position``); ``records``: (from offset,
    to offset, resume) of a follower's read (``cluster_metadata.metadata_records``). The path is shell-quoted."""
    limits = f"--max-memory-mib {int(max_memory_mib)} --max-cpu-s {int(max_cpu_s)}"
    mode = " --position" if position else ""
    if records is not None:
        start, end, resume = records
        mode = f" --records-from {int(start)}"
        mode += f" --records-to {int(end)}" if end is not None else ""
        mode += f" --resume {int(resume[0])}:{int(resume[1])}" if resume else ""
    return lowest_priority(f"python3 - {limits}{mode} {shlex.quote(metadata_log_dir)}")


@functools.cache
def decoder_program() -> bytes:
    """The decoder's bundle, built once per process: a repair's gates send it to every voter at every poll."""
    return cluster_metadata.bundle()


# the kinds this module reads itself, kept parsed; every other line is kept as printed (a dict costs about four
# times its line: a 200,000-partition cluster's 100 MB of output would be 400 MB on the worker)
KEPT_KINDS = frozenset((HEADER, END, PROBLEM, "cluster", "broker"))


@dataclass
class ControllerRead:
    """One controller's metadata as its decoder printed it: ``lines``, every record as printed (checked JSON
    records, ``cluster_metadata`` first and a complete ``cluster_metadata_end`` last), and ``kept``, the records of
    ``KEPT_KINDS`` parsed."""

    endpoint: dict[str, Any]
    lines: list[bytes]
    identity: str
    stderr: str = ""
    kept: list[dict[str, Any]] = field(default_factory=list)

    @property
    def controller_id(self) -> int:
        return int(self.endpoint["controller_id"])

    @property
    def header(self) -> dict[str, Any]:
        return self.kept[0]

    @property
    def records(self) -> list[dict[str, Any]]:
        """Every record, parsed (tests and small clusters; the audit writes ``lines``)."""
        return [json.loads(line) for line in self.lines]

    def only_own_records(self) -> None:
        """Keep only the controller's own facts (its header and problems): a read that is not the one used."""
        own = self.own_records()
        self.lines = [json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in own]
        self.kept = own

    def name_controller(self, controller: tuple[int | None, int | None]) -> None:
        """Make this read's ``cluster`` record name the cluster's active controller as the quorum knows it
        (``cluster_metadata.quorum_controller`` over every controller read), not this node's own view: the read
        used is whichever log was the freshest at that moment, and one voter's ``quorum-state`` may name another
        leader. The plan flags the controller and restarts it last, and its hash covers that: two audits of the same
        cluster must name the same one."""
        cid, epoch = controller
        for n, raw in enumerate(self.lines[:2]):  # the decoder prints its header, then the cluster record
            record = json.loads(raw)
            if record.get("kind") == "cluster":
                record.update(controller_id=cid, controller_epoch=epoch)
                self.lines[n] = json.dumps(record, separators=(",", ":")).encode() + b"\n"
                self.kept = [record if r.get("kind") == "cluster" else r for r in self.kept]
                return
        # the decoder always prints one: without it the staged facts would name this node's own view again
        raise MetadataReadError(f"controller {self.controller_id}: the decoder printed no cluster record")

    def controller(self) -> tuple[int | None, int | None]:
        """(controller id, epoch) of this read's ``cluster`` record."""
        record = next((r for r in self.kept if r.get("kind") == "cluster"), {})
        return record.get("controller_id"), record.get("controller_epoch")

    def position(self) -> tuple[bool, int, int]:
        """How good this controller's metadata is (``cluster_metadata.log_position``, the one rule scan uses too):
        a whole image first (no snapshot gap, no CRC failure), then how far it goes as Raft compares logs (the
        newest epoch, then the end offset)."""
        return tuple(cluster_metadata.log_position(self.header))  # type: ignore[return-value]

    def whole(self) -> bool:
        return bool(self.position()[0])

    def source(self) -> dict[str, Any]:
        """What the report names: which controller, which snapshot file, how far the log goes."""
        h = self.header
        active, active_epoch = self.controller()
        return {
            "controller": self.controller_id,
            "host": f"{self.endpoint.get('host')}:{self.endpoint.get('ssh_port')}",
            "metadata_log_dir": self.endpoint.get("metadata_log_dir"),
            "cluster_id": h.get("cluster_id"),
            "snapshot": h.get("snapshot"),
            "snapshot_end_offset": h.get("snapshot_end_offset"),
            "log_end_offset": h.get("log_end_offset"),
            "log_max_epoch": h.get("log_max_epoch"),
            "whole": self.whole(),
            "quorum_leader_id": h.get("quorum_leader_id"),  # this controller's own quorum-state
            "quorum_leader_epoch": h.get("quorum_leader_epoch"),
            # the cluster's active controller, as a majority of the voters read name it (``name_controller``)
            "active_controller": active,
            "active_controller_epoch": active_epoch,
            "problems": sum(1 for r in self.kept if r.get("kind") == PROBLEM),
        }

    def brokers(self) -> dict[int, dict[str, Any]]:
        """Every broker the metadata registers (readable records only)."""
        return {
            int(r["broker_id"]): r
            for r in self.kept
            if r.get("kind") == "broker" and isinstance(r.get("broker_id"), int) and not r.get("error")
        }

    def registrations(self) -> dict[int, dict[str, Any]]:
        """Brokers the metadata registers and does not fence (KRaft's equivalent of ``/brokers/ids``: a broker that
        stopped stays registered, fenced)."""
        return {b: r for b, r in self.brokers().items() if not r.get("fenced")}

    def fenced(self) -> list[int]:
        """Registered brokers the controller fenced: stopped, or not heartbeating, or not caught up."""
        return sorted(b for b, r in self.brokers().items() if r.get("fenced"))

    def own_records(self) -> list[dict[str, Any]]:
        """The controller's own facts: its log's header and problems."""
        return [r for r in self.kept if r.get("kind") in (HEADER, PROBLEM)]

    def controller_records(self) -> list[dict[str, Any]]:
        """The controller's own facts for detection, each with its ``controller_id``."""
        return [{**r, "controller_id": self.controller_id} for r in self.own_records()]


def _parse(who: str, out: Any, nbytes: int) -> tuple[list[bytes], list[dict[str, Any]]]:
    """The decoder's JSON Lines (``out``: a binary file), read as a stream and checked line by line: (every line as
    printed, the records of ``KEPT_KINDS`` parsed). A ``cluster_metadata`` record first, a complete
    ``cluster_metadata_end`` last."""
    lines: list[bytes] = []
    kept: list[dict[str, Any]] = []
    last: dict[str, Any] | None = None
    out.seek(0)
    for n, raw in enumerate(out, 1):
        line = raw.decode("utf-8", errors="replace")  # the decoder prints UTF-8; anything else fails json.loads
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            raise MetadataReadError(
                f"{who}: the decoder's output is not JSON Lines (line {n}: {e}: {line[:120]!r})"
            ) from None
        if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
            raise MetadataReadError(f"{who}: the decoder's output line {n} is not a record with a kind: {line[:120]!r}")
        if not lines and (record["kind"] != HEADER or record.get("source") != "kraft"):
            raise MetadataReadError(f"{who}: the decoder's output does not start with a KRaft {HEADER} record")
        lines.append(raw if raw.endswith(b"\n") else raw + b"\n")
        if record["kind"] in KEPT_KINDS:
            kept.append(record)
        last = record
    if last is None:
        raise MetadataReadError(f"{who}: the decoder printed nothing ({nbytes} bytes)")
    if last["kind"] != END or last.get("complete") is not True:
        raise MetadataReadError(f"{who}: the decoder's output ends without a complete {END} record (cut off?)")
    return lines, kept


def _verified(client: Any, endpoint: dict[str, Any]) -> tuple[int, str, Remote, dict[str, Any]]:
    """(controller id, who it is for messages, its ``Remote``, its identity) once the host behind ``client`` is shown
    to be the controller ``endpoint`` names (pinned host key, ``node.id`` in its metadata log dir's
    ``meta.properties``); MetadataReadError naming it otherwise."""
    cid = int(endpoint["controller_id"])
    where = f"{endpoint.get('host')}:{endpoint.get('ssh_port')}"
    who = f"controller {cid} ({where}, {endpoint['metadata_log_dir']})"
    remote = Remote(client, cid)
    remote.who = f"controller {cid}"
    if not endpoint.get("host_key"):
        raise MetadataReadError(f"{who}: no pinned host_key in the discovered controller: rerun discover")
    shown = (cid, endpoint["host_key"], endpoint["metadata_log_dir"])
    identity = _shown(_transport(client)).get(shown)
    if identity is not None:  # this connection was shown to reach that controller: the host behind it is the same
        return cid, who, remote, identity
    try:  # the metadata log dir was formatted by kafka-storage: its meta.properties must exist and name this node
        identity = verify_identity(
            remote, cid, endpoint["host_key"], [endpoint["metadata_log_dir"]], where=where, require_meta=True
        )
    except Exception as e:  # IdentityError, or the connection went away
        raise MetadataReadError(f"{who}: not shown to be controller {cid}: {e}") from e
    _shown(_transport(client))[shown] = identity
    return cid, who, remote, identity


# open connections (their SSH transports) already shown to reach a controller (``_verified``): (controller id, pinned
# host key, metadata log dir) -> what was checked. Kept as long as the transport lives: a new connection, even through
# the same client object, is checked again
_SHOWN: weakref.WeakKeyDictionary[Any, dict[tuple[int, str, str], str]] = weakref.WeakKeyDictionary()
_SHOWN_LOCK = threading.Lock()  # the voters of a quorum are read from threads at once


def _shown(transport: Any) -> dict[tuple[int, str, str], str]:
    with _SHOWN_LOCK:
        try:
            return _SHOWN.setdefault(transport, {})
        except TypeError:  # no transport (None), or one that cannot be weakly referenced: checked at every read
            return {}


POSITION_TIMEOUT_S = 30.0
POSITION_MAX_BYTES = 64 << 10


def read_position(
    client: Any, endpoint: dict[str, Any], *, timeout: float = POSITION_TIMEOUT_S, program: bytes | None = None
) -> dict[str, Any]:
    """Where the metadata log of the controller ``endpoint`` ends and whom its ``quorum-state`` follows (the
    decoder's ``--position``: a walk of the newest segment's batch headers, no record decoded), over the open SSH
    connection ``client``, after checking it is that controller. MetadataReadError naming it when anything is
    wrong."""
    cid, who, remote, _identity = _verified(client, endpoint)
    out = bytearray()

    def sink(data: bytes) -> None:
        out.extend(data)
        if len(out) > POSITION_MAX_BYTES:
            raise MetadataReadError(f"{who}: the decoder printed more than {POSITION_MAX_BYTES} bytes for --position")

    command = decode_command(endpoint["metadata_log_dir"], position=True)
    try:
        done = remote.stream(command, decoder_program() if program is None else program, sink, timeout)
    except Exception as e:  # RemoteError: a dropped session, a timeout, the size limit
        raise MetadataReadError(f"{who}: the decoder could not run: {e}") from e
    if done.exit_status != 0:
        said = done.stderr.strip()[-500:] or "(nothing on stderr)"
        raise MetadataReadError(f"{who}: the decoder exited {done.exit_status}: {said}")
    try:
        (record,) = [json.loads(line) for line in bytes(out).decode("utf-8").splitlines() if line.strip()]
    except ValueError as e:
        raise MetadataReadError(f"{who}: the decoder's --position output is not one JSON record: {e}") from None
    if not isinstance(record, dict) or record.get("kind") != "metadata_position":
        raise MetadataReadError(f"{who}: the decoder's --position output is not a metadata_position record")
    if record.get("node_id") != cid:  # meta.properties read by the decoder (the identity check may be a kept one)
        raise MetadataReadError(f"{who}: {_not_this_node(record, cid)}")
    return record


RECORDS_TIMEOUT_S = DECODE_TIMEOUT_S
RECORD, RECORDS_HEADER, RECORDS_END = "metadata_record", "metadata_records", "metadata_records_end"


def read_records(
    client: Any,
    endpoint: dict[str, Any],
    from_offset: int,
    to_offset: int | None,
    on_record: Callable[[dict[str, Any]], None],
    *,
    resume: list[int] | None = None,
    timeout: float = RECORDS_TIMEOUT_S,
    program: bytes | None = None,
    max_bytes: int = MAX_OUTPUT_BYTES,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A follower's read of the metadata log of the controller ``endpoint`` (``cluster_metadata.metadata_records``:
    the records from ``from_offset`` up to ``to_offset``, or the whole image when the log no longer holds
    ``from_offset``), over the open SSH connection ``client``, after checking it is that controller. Each
    ``metadata_record`` goes to ``on_record`` as it arrives (a big image is never all in memory here); returns the
    header and the end record. MetadataReadError naming the controller when anything is wrong (then ``on_record``
    may have seen part of the records: the caller starts again)."""
    cid, who, remote, _identity = _verified(client, endpoint)
    state: dict[str, Any] = {"nbytes": 0, "partial": b"", "head": None, "end": None, "n": 0}

    def line(raw: bytes) -> None:
        state["n"] += 1
        try:
            record = json.loads(raw)
        except ValueError as e:
            raise MetadataReadError(f"{who}: the decoder's output line {state['n']} is not JSON: {e}") from None
        kind = record.get("kind") if isinstance(record, dict) else None
        if state["head"] is None:
            if kind != RECORDS_HEADER:
                raise MetadataReadError(f"{who}: the decoder's output does not start with a {RECORDS_HEADER} record")
            state["head"] = record
        elif state["end"] is not None:
            raise MetadataReadError(f"{who}: the decoder printed more after its {RECORDS_END} record")
        elif kind == RECORD:
            on_record(record)
        elif kind == RECORDS_END:
            state["end"] = record
        else:
            raise MetadataReadError(f"{who}: the decoder's output line {state['n']} is not a {RECORD}: {kind!r}")

    def sink(data: bytes) -> None:
        state["nbytes"] += len(data)
        if state["nbytes"] > max_bytes:
            raise MetadataReadError(f"{who}: the decoder printed more than {max_bytes} bytes: not its output")
        *done, state["partial"] = (state["partial"] + data).split(b"\n")
        for raw in done:
            if raw.strip():
                line(raw)

    command = decode_command(endpoint["metadata_log_dir"], records=(from_offset, to_offset, resume))
    try:
        done = remote.stream(command, decoder_program() if program is None else program, sink, timeout)
    except MetadataReadError:
        raise
    except Exception as e:  # RemoteError: a dropped session, a timeout, the size limit
        raise MetadataReadError(f"{who}: the decoder could not run: {e}") from e
    if done.exit_status != 0:
        said = done.stderr.strip()[-500:] or "(nothing on stderr)"
        raise MetadataReadError(f"{who}: the decoder exited {done.exit_status}: {said}")
    if state["partial"].strip():
        line(state["partial"])
    head, end = state["head"], state["end"]
    if head is None or end is None or end.get("complete") is not True:
        raise MetadataReadError(f"{who}: the decoder's output ends without a complete {RECORDS_END} record (cut off?)")
    if head.get("node_id") != cid:  # meta.properties read by the decoder (the identity check may be a kept one)
        raise MetadataReadError(f"{who}: {_not_this_node(head, cid)}")
    return head, end


def _not_this_node(record: dict[str, Any], cid: int) -> str:
    if record.get("node_id") is None:
        return f"the decoder could not read the metadata log dir's node id: {record.get('error') or 'none given'}"
    return f"the metadata log dir belongs to node {record['node_id']}, not controller {cid}"


def read_controller(
    client: Any,
    endpoint: dict[str, Any],
    *,
    timeout: float = DECODE_TIMEOUT_S,
    program: bytes | None = None,
    max_bytes: int = MAX_OUTPUT_BYTES,
) -> ControllerRead:
    """Decode the metadata log of the controller ``endpoint`` (``Inventory.controller_endpoint``) over the open SSH
    connection ``client``, after checking it is that controller. ``program``: what runs on the controller (default
    the decoder's bundle). MetadataReadError naming the controller when anything is wrong."""
    cid, who, remote, identity = _verified(client, endpoint)
    nbytes = 0
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES, mode="w+b") as out:

        def sink(data: bytes) -> None:
            nonlocal nbytes
            nbytes += len(data)
            if nbytes > max_bytes:
                raise MetadataReadError(f"{who}: the decoder printed more than {max_bytes} bytes: not its output")
            out.write(data)

        command = decode_command(endpoint["metadata_log_dir"])
        stdin = decoder_program() if program is None else program
        try:
            done = remote.stream(command, stdin, sink, timeout)
        except Exception as e:  # RemoteError: a dropped session, a timeout, the size limit
            raise MetadataReadError(f"{who}: the decoder could not run: {e}") from e
        if done.exit_status != 0:
            said = done.stderr.strip()[-500:] or "(nothing on stderr)"
            raise MetadataReadError(f"{who}: the decoder exited {done.exit_status}: {said}")
        lines, kept = _parse(who, out, nbytes)
    node_id = kept[0].get("node_id")
    if node_id is not None and node_id != cid:
        raise MetadataReadError(f"{who}: the metadata log dir belongs to node {node_id}, not controller {cid}")
    return ControllerRead(endpoint, lines, identity, done.stderr, kept)


def connected(endpoint: dict[str, Any], connect: Connect) -> Any:
    """``connect(endpoint)``: an SSH client to the controller, or MetadataReadError naming it and why not."""
    try:
        return connect(endpoint)
    except Exception as e:  # paramiko's and the SSH hook's errors have no common base
        where = f"{endpoint.get('host')}:{endpoint.get('ssh_port')}"
        cid = endpoint.get("controller_id")
        raise MetadataReadError(f"controller {cid} ({where}): cannot connect: {type(e).__name__}: {e}") from e


T = TypeVar("T")


class Sessions:
    """One SSH connection per controller, kept open between reads: a repair's gates read every voter at every poll,
    and a poll then costs the decoder's run on each, not also an SSH handshake and an identity check (``_verified``
    checks a connection once; each read still checks the node and cluster ids the decoder reads from
    ``meta.properties``). A kept connection whose transport has gone is opened again. A read that fails because its
    kept connection broke (the transport gone, or an SSH or socket error under the read) is tried once more on a new
    connection; any other failure (the decoder's exit status, its output, a timeout) is raised as it is, the
    connection closed: a failure means what it meant with a connection per read. Kept connections send SSH keepalives
    and their sockets give up on a peer that stops acknowledging (``_keep_alive``), so a dead host is noticed within
    seconds, as a new connection's timeout noticed it. ``close`` closes them all (also done when collected)."""

    def __init__(self, connect: Connect) -> None:
        self.connect = connect
        self.clients: dict[int, Any] = {}
        self._locks: dict[int, threading.Lock] = {}
        self._guard = threading.Lock()
        self.opened = 0  # connections opened, to measure what the reads cost
        self._finalizer = weakref.finalize(self, _close_all, self.clients)

    def read(self, endpoint: dict[str, Any], read: Callable[[Any], T]) -> T:
        """``read(client)`` over the controller's connection, kept or new; MetadataReadError as ``read`` raises it or
        naming the controller when it cannot be reached. Reads of different controllers may run at once."""
        cid = int(endpoint["controller_id"])
        with self._guard:
            lock = self._locks.setdefault(cid, threading.Lock())
        with lock:
            kept = self.clients.pop(cid, None)
            broke: MetadataReadError | None = None
            if kept is not None and _active(kept):
                transport = _transport(kept)
                try:
                    out = read(kept)
                except MetadataReadError as e:
                    kept.close()
                    if not _connection_broke(e, transport):
                        raise  # the read's own failure: the same on a new connection
                    broke = e
                except BaseException:
                    kept.close()
                    raise
                else:
                    self.clients[cid] = kept
                    return out
            elif kept is not None:
                kept.close()
            client = connected(endpoint, self.connect)
            try:
                with self._guard:
                    self.opened += 1
                _keep_alive(client)
                out = read(client)
            except MetadataReadError as e:
                client.close()
                if broke is None:
                    raise
                raise MetadataReadError(f"{e} (tried again after its kept connection broke: {broke})") from e
            except BaseException:
                client.close()
                raise
            self.clients[cid] = client
            return out

    def close(self) -> None:
        _close_all(self.clients)  # a read after this opens a new one (closed here again, or when collected)


KEEPALIVE_S = 15  # a kept connection sends an SSH keepalive when idle this long (a firewall keeps its state) ...
UNACKED_S = 10  # ... and its socket gives up when what it sent is not acknowledged for this long (a dead host)


def _transport(client: Any) -> Any:
    return client.get_transport() if hasattr(client, "get_transport") else None


def _active(client: Any) -> bool:
    transport = _transport(client)
    return transport is not None and transport.is_active()


def _connection_broke(error: BaseException, transport: Any) -> bool:
    """Whether a read failed because its connection broke: the transport no longer active, or an SSH or socket
    error (EOF, reset, a socket timeout) under the read's error."""
    if transport is None or not transport.is_active():
        return True
    cause: BaseException | None = error
    while cause is not None:
        # paramiko's SSHException by name: this module leaves importing paramiko to the SSH hook (remote.py)
        if isinstance(cause, (EOFError, OSError)) or any(c.__name__ == "SSHException" for c in type(cause).__mro__):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _keep_alive(client: Any) -> None:
    transport = _transport(client)
    if transport is None:
        return
    if hasattr(transport, "set_keepalive"):
        transport.set_keepalive(KEEPALIVE_S)
    sock = getattr(transport, "sock", None)
    if isinstance(sock, socket.socket):
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if hasattr(socket, "TCP_USER_TIMEOUT"):  # Linux
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(UNACKED_S * 1000))
        except OSError:  # a socket that refuses the options (a proxy command's): the keepalives alone
            pass


def _close_all(clients: dict[int, Any]) -> None:
    while clients:
        try:
            _, client = clients.popitem()
        except KeyError:  # emptied meanwhile
            return
        try:
            client.close()
        except Exception:  # closing a connection that went away: nothing more to do
            pass


def read_controllers(
    endpoints: Iterable[dict[str, Any]],
    connect: Connect | None = None,
    *,
    timeout: float = DECODE_TIMEOUT_S,
    program: bytes | None = None,
) -> tuple[list[ControllerRead], list[dict[str, Any]]]:
    """Read every controller, in order. Returns the reads, the chosen one first (the most up-to-date log, the
    inventory's order breaking ties: the module docstring), the others in the inventory's order keeping only their
    header and problems, and, per controller that could not be read, ``{"controller", "error"}``. Controllers whose
    metadata names another cluster.id than most of them (the first one's, on a tie) are such errors too: an inventory
    that mixes two clusters' controllers must not take one cluster's facts for the other's. The chosen read's
    ``cluster`` record names the quorum's active controller (``ControllerRead.name_controller``)."""
    connect = connect or airflow_connect
    # a decoder that cannot be built here is this worker's problem: raised, not blamed on a controller
    program = decoder_program() if program is None else program
    reads: list[ControllerRead] = []
    best: dict[Any, ControllerRead] = {}  # per cluster.id, the most up-to-date read: the only ones kept whole
    errors: list[dict[str, Any]] = []
    endpoints_seen = list(endpoints)
    for endpoint in endpoints_seen:
        cid = int(endpoint["controller_id"])
        try:
            client = connected(endpoint, connect)
            try:
                read = read_controller(client, endpoint, timeout=timeout, program=program)
            finally:
                client.close()
        except MetadataReadError as e:
            errors.append({"controller": cid, "error": str(e)})
            continue
        reads.append(read)
        cluster = read.header.get("cluster_id")
        if cluster not in best or read.position() > best[cluster].position():
            if cluster in best:
                best[cluster].only_own_records()
            best[cluster] = read
        else:
            read.only_own_records()
    if not reads:
        return [], errors
    size = {c: sum(1 for r in reads if r.header.get("cluster_id") == c) for c in best}
    cluster = max(best, key=lambda c: (size[c], c == reads[0].header.get("cluster_id")))
    same = [r for r in reads if r.header.get("cluster_id") == cluster]
    names = ", ".join(str(r.controller_id) for r in same)
    for r in reads:
        if r.header.get("cluster_id") != cluster:
            where = f"{r.endpoint.get('host')}:{r.endpoint.get('ssh_port')}, {r.endpoint.get('metadata_log_dir')}"
            errors.append(
                {
                    "controller": r.controller_id,
                    "error": f"controller {r.controller_id} ({where}): its metadata log names cluster.id "
                    f"{r.header.get('cluster_id')!r}, controller(s) {names} name {cluster!r}: not the same cluster "
                    "(check the inventory's controllers); not used",
                }
            )
    order = [int(e["controller_id"]) for e in endpoints_seen]
    errors.sort(key=lambda e: order.index(e["controller"]))
    chosen = best[cluster]
    chosen.name_controller(cluster_metadata.quorum_controller([r.header for r in same], len(endpoints_seen)))
    return [chosen, *(r for r in same if r is not chosen)], errors


def error_text(errors: list[dict[str, Any]]) -> str:
    """One line for the report when no controller could be read."""
    if not errors:
        return "no controller in the inventory"
    return "no controller's metadata log could be read: " + "; ".join(e["error"] for e in errors)
