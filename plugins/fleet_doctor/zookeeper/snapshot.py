"""Kafka's ZooKeeper metadata as JSON Lines, read live (kazoo) or offline from a ZooKeeper snapshot file.

Both sources produce one znode tree, ``{kafka path: ZNode(data, stat)}`` with paths relative to Kafka's
chroot, and ``records_from_tree`` turns that tree into the records documented in
``docs/zk-snapshot-schema.md``. So a post-mortem from a backed-up ``version-2/snapshot.<zxid>`` gives the
same records as a live cluster.

Import-safe: kazoo is imported inside ``read_live`` only.

Why one long file: the snapshot file format (ZooKeeper's jute serialization of sessions, ACLs and the data tree) and
the reading of Kafka's znodes out of it share one tree type and one error vocabulary; apart they would each be half a
format. ``fleet-doctor zk-snapshot`` and the audit's live read both go through ``records_from_tree``.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import struct
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from fleet_doctor.cluster_health import MIN_ISR
from fleet_doctor.cluster_health import min_isr_value as _min_isr_value
from fleet_doctor.zookeeper.cluster import DEFAULT_ENTITY

SCHEMA_VERSION = 1

# --------------------------------------------------------------------------------------------------
# ZooKeeper snapshot file: ``<dataDir>/version-2/snapshot.<zxid in hex>``, jute BinaryOutputArchive
# (big-endian). Written by FileSnap.serialize -> SerializeUtils.serializeSnapshot -> DataTree.serialize;
# ZooKeeper 3.4 to 3.9 write the same layout up to the first seal.
#
#   FileHeader      int magic "ZKSN", int version (2), long dbid (-1)                       FileHeader
#   sessions        int count; count x {long sessionId, int timeoutMs}                        SerializeUtils
#   ACL cache       int count; count x {long aclId, vector<ACL>}          ReferenceCountedACLCache.serialize
#                     vector<ACL>: int n (-1 = null); n x {int perms, ustring scheme, ustring id}
#   znodes          repeated {ustring path, DataNode}; the root's path is "", pre-order;
#                   the path "/" ends the tree                            DataTree.serialize/serializeNode
#                     DataNode: buffer data, long acl (ACL cache id), StatPersisted             DataNode
#                     StatPersisted: long czxid, mzxid, ctime, mtime; int version, cversion,
#                                    aversion; long ephemeralOwner, pzxid                   StatPersisted
#   seal            long Adler32 of every byte before it, ustring "/"               SnapStream.sealStream
#   (3.6+)          ZxidDigest {long zxid, int digestVersion, long digest} and a second seal;
#                   3.9 may append more. Ignored here, as ZooKeeper itself tolerates their absence.
#   ustring/buffer  int length (-1 = null), then that many bytes (UTF-8 for a ustring)
#
# Ephemeral znodes (ephemeralOwner != 0) are in the tree while their session lives. With
# zookeeper.snapshot.compression.method (3.6+) the same stream is gzip (``.gz``) or xerial-snappy
# (``.snappy``) compressed; the Adler32 covers the uncompressed stream (SnapStream.getInputStream).
# --------------------------------------------------------------------------------------------------
SNAP_MAGIC = 0x5A4B534E  # "ZKSN"
SNAP_VERSION = 2
_FILE_HEADER = struct.Struct(">iiq")  # magic, version, dbid
_SESSION = struct.Struct(">qi")  # sessionId, timeout (ms)
_STAT_PERSISTED = struct.Struct(
    ">q"  # czxid: zxid of the create (Kafka: a broker znode's czxid is the broker epoch)
    "q"  # mzxid: zxid of the last setData
    "q"  # ctime (epoch ms)
    "q"  # mtime (epoch ms)
    "i"  # version: setData count (Kafka: a partition state's zkVersion is the partitionEpoch)
    "i"  # cversion: child changes
    "i"  # aversion: ACL changes
    "q"  # ephemeralOwner: session id, 0 for a persistent znode
    "q"  # pzxid: zxid of the last child change
)
_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")

_GZIP_MAGIC = b"\x1f\x8b"
_SNAPPY_MAGIC = b"\x82SNAPPY\x00"  # org.xerial.snappy.SnappyCodec
_CHUNK = 1 << 20
_MAX_FIELD = 256 << 20  # no jute buffer or string is larger (ZooKeeper's jute.maxbuffer defaults to 1 MiB)
_TRUNCATED_HINT = " (an incomplete copy, or ZooKeeper was still writing it: read the previous snapshot.<zxid>)"
_SNAPSHOT_NAME = re.compile(r"snapshot\.([0-9a-fA-F]+)(\.gz|\.snappy)?")


@dataclass(frozen=True)
class ZStat:
    """A znode's StatPersisted (what both a snapshot file and a live ``get`` give)."""

    czxid: int
    mzxid: int
    ctime: int
    mtime: int
    version: int
    cversion: int
    aversion: int
    ephemeral_owner: int
    pzxid: int


@dataclass(frozen=True)
class ZNode:
    data: bytes | None
    stat: ZStat


ZTree = Mapping[str, ZNode]  # Kafka path relative to the chroot ("/brokers/ids/1") -> znode


@dataclass
class SnapshotInfo:
    """What a snapshot file says about itself; filled in while its znodes are read."""

    file: str
    compression: str | None = None
    version: int | None = None
    dbid: int | None = None
    sessions: dict[int, int] = field(default_factory=dict)  # session id -> timeout ms
    acl_entries: int = 0
    znodes: int = 0
    max_zxid: int = 0
    seal_end_offset: int | None = None  # offset (in the uncompressed stream) just past the first seal
    complete: bool = False


class _JuteInput:
    """Big-endian jute reads over a byte stream, with byte offsets for errors and a running Adler32."""

    def __init__(self, raw: IO[bytes], name: str, size: int | None) -> None:
        self._raw = raw
        self._name = name
        self._size = size  # uncompressed size when known: bounds lengths and counts early
        self._buf = b""
        self._pos = 0
        self._base = 0  # stream offset of _buf[0]
        self._adler = 1  # Adler32 of stream bytes before _buf[_mark]
        self._mark = 0

    @property
    def offset(self) -> int:
        return self._base + self._pos

    def error(self, msg: str, offset: int | None = None) -> ValueError:
        at = self.offset if offset is None else offset
        return ValueError(f"{self._name}: {msg} at byte offset {at}")

    def _fill(self, want: int) -> None:
        self._adler = zlib.adler32(self._buf[self._mark : self._pos], self._adler)
        self._base += self._pos
        parts = [self._buf[self._pos :]]
        have = len(parts[0])
        while have < want:
            try:
                chunk = self._raw.read(max(_CHUNK, want - have))
            except (EOFError, zlib.error, gzip.BadGzipFile) as e:
                raise self.error(f"corrupt compressed stream ({e})", self._base + have) from None
            if not chunk:
                break
            parts.append(chunk)
            have += len(chunk)
        self._buf = b"".join(parts)
        self._pos = 0
        self._mark = 0

    def read(self, n: int, what: str) -> bytes:
        end = self._pos + n
        if end > len(self._buf):
            self._fill(n)
            end = n
            if n > len(self._buf):
                raise self.error(f"truncated: {what} needs {n} bytes, only {len(self._buf)} left{_TRUNCATED_HINT}")
        out = self._buf[self._pos : end]
        self._pos = end
        return out

    def i32(self, what: str) -> int:
        return _INT.unpack(self.read(4, what))[0]

    def i64(self, what: str) -> int:
        return _LONG.unpack(self.read(8, what))[0]

    def count(self, what: str, item_min_bytes: int, allow_null: bool = False) -> int:
        at = self.offset
        n = self.i32(what)
        if n == -1 and allow_null:
            return 0
        if n < 0:
            raise self.error(f"negative {what} count {n}", at)
        if self._size is not None and n * item_min_bytes > self._size - self.offset:
            raise self.error(f"{what} count {n} cannot fit in the {self._size - self.offset} bytes left", at)
        return n

    def buffer(self, what: str) -> bytes | None:
        at = self.offset
        n = self.i32(what)
        if n == -1:
            return None
        if n < 0 or n > _MAX_FIELD:
            raise self.error(f"impossible {what} length {n}", at)
        left = None if self._size is None else self._size - self.offset
        if left is not None and n > left:  # fail before allocating what cannot be there
            raise self.error(f"truncated: {what} needs {n} bytes, only {left} left{_TRUNCATED_HINT}", at)
        return self.read(n, what)

    def ustring(self, what: str) -> str | None:
        at = self.offset
        b = self.buffer(what)
        if b is None:
            return None
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            raise self.error(f"{what} is not UTF-8", at) from None

    def checksum(self) -> int:
        """Adler32 of every byte consumed so far (what SnapStream's CheckedOutputStream had seen)."""
        self._adler = zlib.adler32(self._buf[self._mark : self._pos], self._adler)
        self._mark = self._pos
        return self._adler


def _open_stream(path: Path, info: SnapshotInfo) -> tuple[IO[bytes], int | None]:
    """Open a snapshot, transparently un-gzipping; returns (stream, uncompressed size if known)."""
    f = open(path, "rb", buffering=_CHUNK)  # closed by the caller, or below on error
    try:
        head = f.read(8)
        f.seek(0)
        if head.startswith(_GZIP_MAGIC):
            info.compression = "gzip"
            return gzip.GzipFile(fileobj=f, mode="rb"), None  # type: ignore[return-value]
        if head == _SNAPPY_MAGIC:
            raise ValueError(
                f"{path}: snappy-compressed snapshot (zookeeper.snapshot.compression.method=snappy) at byte "
                "offset 0 is not supported: decompress it first (e.g. with ZooKeeper's SnapshotFormatter)"
            )
        return f, os.fstat(f.fileno()).st_size
    except BaseException:
        f.close()
        raise


def _read_header(j: _JuteInput, info: SnapshotInfo) -> None:
    magic, version, dbid = _FILE_HEADER.unpack(j.read(_FILE_HEADER.size, "file header"))
    if magic != SNAP_MAGIC:
        raise j.error(f"not a ZooKeeper snapshot: magic {magic & 0xFFFFFFFF:#010x}, expected 'ZKSN'", 0)
    if version != SNAP_VERSION:
        raise j.error(f"unsupported snapshot version {version} (only {SNAP_VERSION} exists)", 4)
    info.version, info.dbid = version, dbid


def _read_sessions(j: _JuteInput, info: SnapshotInfo) -> None:
    for _ in range(j.count("session", _SESSION.size)):
        sid, timeout = _SESSION.unpack(j.read(_SESSION.size, "session"))
        info.sessions[sid] = timeout


def _read_acl_cache(j: _JuteInput, info: SnapshotInfo) -> None:
    entries = j.count("ACL cache", 12)
    for _ in range(entries):
        j.i64("ACL cache id")
        for _ in range(j.count("ACL", 12, allow_null=True)):
            j.i32("ACL perms")
            j.ustring("ACL scheme")
            j.ustring("ACL id")
    info.acl_entries = entries


def _read_node(j: _JuteInput) -> ZNode:
    data = j.buffer("znode data")
    j.i64("znode acl")
    stat = ZStat(*_STAT_PERSISTED.unpack(j.read(_STAT_PERSISTED.size, "znode stat")))
    return ZNode(data, stat)


def _read_seal(j: _JuteInput, info: SnapshotInfo) -> None:
    at = j.offset
    expected = j.checksum()
    stored = j.i64("checksum")
    marker = j.ustring("seal marker")
    if marker != "/":
        raise j.error(f"bad seal after the checksum: {marker!r}, expected '/'", at + 8)
    if stored != expected:
        raise j.error(
            f"checksum mismatch (stored Adler32 {stored:#x}, computed {expected:#x}): the snapshot is corrupt; "
            "read the previous snapshot.<zxid> instead",
            at,
        )
    info.seal_end_offset = j.offset


def iter_snapshot(path: str | os.PathLike[str], info: SnapshotInfo | None = None) -> Iterator[tuple[str, ZNode]]:
    """Stream ``(absolute path, ZNode)`` for every znode of a snapshot file, root first (as ``/``).

    ``info`` is filled in as the file is read; ``info.complete`` is True once the checksum matched.
    Raises ValueError naming the file and byte offset for garbage, truncated or corrupt files
    (OSError only for I/O failures such as a missing or unreadable file).
    """
    p = Path(path)
    info = info if info is not None else SnapshotInfo(file=str(p))
    raw, size = _open_stream(p, info)
    with raw:
        j = _JuteInput(raw, str(p), size)
        _read_header(j, info)
        _read_sessions(j, info)
        _read_acl_cache(j, info)
        at = j.offset
        name = j.ustring("znode path")
        if name != "":
            raise j.error(f"expected the root znode (path ''), found {name!r}", at)
        while name != "/":
            if name is None or (info.znodes and not name.startswith("/")):
                raise j.error(f"invalid znode path {name!r}", at)
            node = _read_node(j)
            info.znodes += 1
            s = node.stat
            info.max_zxid = max(info.max_zxid, s.czxid, s.mzxid, s.pzxid)
            yield name or "/", node
            at = j.offset
            name = j.ustring("znode path")
        _read_seal(j, info)
        info.complete = True


def zxid_from_name(name: str) -> int | None:
    """The zxid in a ``snapshot.<hex>[.gz|.snappy]`` file name (ZooKeeper's Util.getZxidFromName), else None."""
    m = _SNAPSHOT_NAME.fullmatch(name)
    return int(m.group(1), 16) if m else None


def newest_snapshot(path: str | os.PathLike[str]) -> Path:
    """``path`` itself if a file; for a directory, its (or its ``version-2/``'s) snapshot with the highest zxid."""
    p = Path(path)
    if not p.is_dir():
        return p
    found = [
        f
        for d in (p, p / "version-2")
        if d.is_dir()
        for f in d.iterdir()
        if zxid_from_name(f.name) is not None and f.is_file()
    ]
    if not found:
        raise FileNotFoundError(f"{p}: no snapshot.<zxid> files here or in {p / 'version-2'}")
    return max(found, key=lambda f: zxid_from_name(f.name) or 0)


# --------------------------------------------------------------------------------------------------
# Kafka's znodes (kafka/zk/ZkData.scala), relative to the chroot of zookeeper.connect.
# --------------------------------------------------------------------------------------------------


def normalize_chroot(chroot: str | None) -> str:
    """'' for no chroot, else '/a/b' (a trailing slash is dropped). ValueError for an invalid path."""
    if chroot is None or chroot in ("", "/"):
        return ""
    c = chroot[:-1] if chroot.endswith("/") else chroot
    parts = c.split("/")
    if not c.startswith("/") or any(s in ("", ".", "..") for s in parts[1:]):
        raise ValueError(f"invalid chroot {chroot!r}: expected an absolute ZooKeeper path such as /kafka")
    return c


def split_connect(connect: str) -> tuple[str, str]:
    """Kafka's ``zookeeper.connect`` 'h1:2181,h2:2181/chroot' -> ('h1:2181,h2:2181', '/chroot' or '')."""
    hosts, sep, rest = connect.strip().partition("/")
    if not hosts:
        raise ValueError(f"invalid ZooKeeper connect string {connect!r}: expected HOST:PORT[,HOST:PORT][/chroot]")
    return hosts, normalize_chroot("/" + rest if sep else "")


def relative_path(path: str, chroot: str) -> str | None:
    """``path`` relative to ``chroot`` ('/' for the chroot itself), or None when outside it."""
    if not chroot:
        return path
    if path == chroot:
        return "/"
    if path.startswith(chroot + "/"):
        return path[len(chroot) :]
    return None


CLUSTER_DEFAULT_CONFIG = f"/config/brokers/{DEFAULT_ENTITY}"  # the cluster-wide dynamic broker config
_SINGLETONS = frozenset({"/brokers", "/cluster/id", "/controller", "/controller_epoch", CLUSTER_DEFAULT_CONFIG})
_CHILD_PARENTS = frozenset(
    {("brokers", "ids"), ("brokers", "topics"), ("config", "topics"), ("admin", "delete_topics")}
)


def is_kafka_path(rel: str) -> bool:
    """The znodes the records are built from (everything else in a snapshot is skipped while streaming)."""
    if rel in _SINGLETONS:
        return True
    parts = rel.split("/")[1:]
    if len(parts) == 3:
        return (parts[0], parts[1]) in _CHILD_PARENTS
    return len(parts) == 6 and parts[:2] == ["brokers", "topics"] and parts[3] == "partitions" and parts[5] == "state"


@dataclass(frozen=True)
class Origin:
    """Where a tree came from: the fixed fields of the ``zk_snapshot`` record, plus source-specific extras."""

    source: Literal["live", "file"]
    zookeeper: str | None
    chroot: str
    file: str | None
    last_zxid: int | None
    taken_at_ms: int | None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class _Kafka:
    """The tree's Kafka znodes, grouped by what they describe."""

    brokers: dict[str, ZNode] = field(default_factory=dict)
    topics: dict[str, ZNode] = field(default_factory=dict)
    states: dict[str, dict[str, ZNode]] = field(default_factory=dict)
    configs: dict[str, ZNode] = field(default_factory=dict)
    deletions: set[str] = field(default_factory=set)


def _group(tree: ZTree) -> _Kafka:
    k = _Kafka()
    for rel, node in tree.items():
        parts = rel.split("/")[1:]
        if len(parts) == 3:
            parent = (parts[0], parts[1])
            if parent == ("brokers", "ids"):
                k.brokers[parts[2]] = node
            elif parent == ("brokers", "topics"):
                k.topics[parts[2]] = node
            elif parent == ("config", "topics"):
                k.configs[parts[2]] = node
            elif parent == ("admin", "delete_topics"):
                k.deletions.add(parts[2])
        elif is_kafka_path(rel) and len(parts) == 6:
            k.states.setdefault(parts[2], {})[parts[4]] = node
    return k


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    v = float(text)
    if v in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:40]} is out of range")
    return v


def _json_object(node: ZNode | None, zpath: str, errors: list[str]) -> dict[str, Any] | None:
    """The znode's data as a JSON object; None (and an error naming the znode) when it is not one."""
    if node is None:
        return None
    if not node.data:
        errors.append(f"znode {zpath} has no data (expected JSON)")
        return None
    try:
        obj = json.loads(node.data.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite_float)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        errors.append(f"malformed JSON in znode {zpath}: {str(e)[:200]}")
        return None
    if not isinstance(obj, dict):
        errors.append(f"znode {zpath}: expected a JSON object, found {type(obj).__name__}")
        return None
    return obj


def _field_error(zpath: str, key: str, want: str, v: Any) -> str:
    return f"znode {zpath}: {key} is not {want}: {json.dumps(v)[:80]}"


def _int(obj: Mapping[str, Any], key: str, zpath: str, errors: list[str]) -> int | None:
    v = obj.get(key)
    if v is None or (isinstance(v, int) and not isinstance(v, bool)):
        return v
    errors.append(_field_error(zpath, key, "an integer", v))
    return None


def _str(obj: Mapping[str, Any], key: str, zpath: str, errors: list[str]) -> str | None:
    v = obj.get(key)
    if v is None or isinstance(v, str):
        return v
    errors.append(_field_error(zpath, key, "a string", v))
    return None


def _obj(obj: Mapping[str, Any], key: str, zpath: str, errors: list[str]) -> dict[str, Any] | None:
    v = obj.get(key)
    if v is None or isinstance(v, dict):
        return v
    errors.append(_field_error(zpath, key, "an object", v))
    return None


def _is_int_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)


def _int_list(obj: Mapping[str, Any], key: str, zpath: str, errors: list[str]) -> list[int] | None:
    v = obj.get(key)
    if v is None or _is_int_list(v):
        return v
    errors.append(_field_error(zpath, key, "a list of integers", v))
    return None


def _str_list(obj: Mapping[str, Any], key: str, zpath: str, errors: list[str]) -> list[str] | None:
    v = obj.get(key)
    if v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v)):
        return v
    errors.append(_field_error(zpath, key, "a list of strings", v))
    return None


def _id_key(s: str) -> tuple[int, int, str]:
    """Sort numeric names (broker ids, partitions) numerically, anything else after them."""
    return (0, int(s), s) if re.fullmatch(r"-?\d{1,18}", s) else (1, 0, s)


def _as_int(s: str) -> int | None:
    return int(s) if re.fullmatch(r"-?\d{1,18}", s.strip()) else None


def _replica_map(obj: Mapping[str, Any], key: str, zpath: str, errors: list[str]) -> dict[str, list[int]]:
    """A ``{"<partition>": [broker ids]}`` map, partitions in numeric order; {} when absent."""
    v = obj.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        errors.append(_field_error(zpath, key, "an object", v))
        return {}
    out: dict[str, list[int]] = {}
    for p in sorted(v, key=_id_key):
        if _as_int(p) is None or not _is_int_list(v[p]):
            errors.append(_field_error(zpath, f"{key}[{json.dumps(p)}]", "a partition -> replica list", v[p]))
            continue
        out[p] = v[p]
    return out


class _Ctx:
    def __init__(self, chroot: str) -> None:
        self.chroot = chroot

    def zpath(self, rel: str) -> str:
        """The absolute ZooKeeper path, as an operator would type it into zkCli."""
        return self.chroot + rel if self.chroot else rel


def _joined(errors: list[str]) -> str | None:
    return "; ".join(errors) if errors else None


def _config_min_isr(config: Mapping[str, Any] | None, cfg_path: str, errors: list[str]) -> int | None:
    """The ``min.insync.replicas`` of a config znode's ``config`` map, read as the repair's health gates read it
    (``zookeeper.cluster``); None when unset, or (and an error naming the znode) when it is not a positive integer."""
    if config is None or config.get(MIN_ISR) is None:
        return None
    try:
        return _min_isr_value(config[MIN_ISR], cfg_path)
    except ValueError as e:
        errors.append(f"znode {e}")
        return None


def _cluster_default(
    tree: ZTree, c: _Ctx, skipped: Sequence[Mapping[str, str]], errors: list[str]
) -> tuple[dict[str, Any] | None, int | None]:
    """``/config/brokers/<default>``: its ``config`` map ({} when the znode is absent or has none, as the health
    gates read it; None when it could not be read: not readable live (``skipped_znodes`` says so), or not a config
    znode (an error)) and that map's ``min.insync.replicas``."""
    if any(s.get("path") == CLUSTER_DEFAULT_CONFIG for s in skipped):
        return None, None
    node = tree.get(CLUSTER_DEFAULT_CONFIG)
    if node is None:
        return {}, None
    zp = c.zpath(CLUSTER_DEFAULT_CONFIG)
    obj = _json_object(node, zp, errors)
    if obj is None:
        return None, None
    config = _obj(obj, "config", zp, errors) if obj.get("config") is not None else {}
    return config, _config_min_isr(config, zp, errors)


def _cluster_record(tree: ZTree, k: _Kafka, c: _Ctx, skipped: Sequence[Mapping[str, str]] = ()) -> dict[str, Any]:
    errors: list[str] = []
    cid = _json_object(tree.get("/cluster/id"), c.zpath("/cluster/id"), errors)
    controller = _json_object(tree.get("/controller"), c.zpath("/controller"), errors)
    epoch_node = tree.get("/controller_epoch")
    epoch = None
    if epoch_node is not None:
        text = (epoch_node.data or b"").decode("utf-8", "replace")
        epoch = _as_int(text)
        if epoch is None:
            errors.append(f"znode {c.zpath('/controller_epoch')}: not an integer: {text[:80]!r}")
    default_config, default_min_isr = _cluster_default(tree, c, skipped, errors)
    return {
        "kind": "cluster",
        "kafka_tree_found": "/brokers" in tree,
        "cluster_id": _str(cid, "id", c.zpath("/cluster/id"), errors) if cid else None,
        "controller_id": _int(controller, "brokerid", c.zpath("/controller"), errors) if controller else None,
        "controller_epoch": epoch,
        "controller_epoch_zk_version": epoch_node.stat.version if epoch_node else None,
        "controller": controller,
        "topics_marked_for_deletion": sorted(k.deletions),
        "cluster_default_config": default_config,
        "cluster_default_min_insync_replicas": default_min_isr,
        "error": _joined(errors),
    }


def _numbered_znode(path: str, name: str, what: str, node: ZNode, c: _Ctx) -> tuple[str, list[str], int | None, dict]:
    """A znode named by a number (a broker id, a partition): its path, the errors so far, the number, its JSON."""
    zp = c.zpath(path)
    errors: list[str] = []
    number = _as_int(name)
    if number is None:
        errors.append(f"znode {zp}: {what} is not an integer")
    return zp, errors, number, _json_object(node, zp, errors) or {}


def _broker_record(name: str, node: ZNode, c: _Ctx) -> dict[str, Any]:
    zp, errors, bid, obj = _numbered_znode(f"/brokers/ids/{name}", name, "broker id", node, c)
    ts: Any = obj.get("timestamp")
    if isinstance(ts, str) and _as_int(ts) is not None:
        ts = _as_int(ts)  # Kafka writes the registration time as a string of epoch ms
    elif ts is not None and not (isinstance(ts, int) and not isinstance(ts, bool)):
        errors.append(_field_error(zp, "timestamp", "epoch milliseconds", ts))
        ts = None
    return {
        "kind": "broker",
        "broker_id": bid,
        "host": _str(obj, "host", zp, errors),
        "port": _int(obj, "port", zp, errors),
        "endpoints": _str_list(obj, "endpoints", zp, errors),
        "listener_security_protocol_map": _obj(obj, "listener_security_protocol_map", zp, errors),
        "rack": _str(obj, "rack", zp, errors),
        "jmx_port": _int(obj, "jmx_port", zp, errors),
        "timestamp": ts,
        "znode_version": _int(obj, "version", zp, errors),
        "broker_epoch": node.stat.czxid,
        "ephemeral_owner": node.stat.ephemeral_owner,
        "features": _obj(obj, "features", zp, errors),
        "error": _joined(errors),
    }


def _replication_factor(partitions: Mapping[str, list[int]], adding: Mapping[str, list[int]]) -> int | None:
    """The smallest replica count over the partitions, not counting replicas still being added."""
    sizes = [len(set(r) - set(adding.get(p, ()))) for p, r in partitions.items()]
    return min(sizes) if sizes else None


def _topic_record(topic: str, k: _Kafka, c: _Ctx) -> dict[str, Any]:
    zp = c.zpath(f"/brokers/topics/{topic}")
    errors: list[str] = []
    obj = _json_object(k.topics[topic], zp, errors) or {}
    partitions = _replica_map(obj, "partitions", zp, errors)
    adding = _replica_map(obj, "adding_replicas", zp, errors)
    removing = _replica_map(obj, "removing_replicas", zp, errors)
    cfg_path = c.zpath(f"/config/topics/{topic}")
    cfg_obj = _json_object(k.configs.get(topic), cfg_path, errors)
    config = _obj(cfg_obj, "config", cfg_path, errors) if cfg_obj is not None else None
    min_isr = _config_min_isr(config, cfg_path, errors)
    return {
        "kind": "topic",
        "topic": topic,
        "topic_id": _str(obj, "topic_id", zp, errors),
        "znode_version": _int(obj, "version", zp, errors),
        "partitions": partitions,
        "adding_replicas": adding,
        "removing_replicas": removing,
        "replication_factor": _replication_factor(partitions, adding),
        "min_insync_replicas": min_isr,
        "config": config,
        "marked_for_deletion": topic in k.deletions,
        "error": _joined(errors),
    }


def _partition_state_record(topic: str, partition: str, node: ZNode, c: _Ctx) -> dict[str, Any]:
    zp, errors, pid, obj = _numbered_znode(
        f"/brokers/topics/{topic}/partitions/{partition}/state", partition, "partition", node, c
    )
    return {
        "kind": "partition_state",
        "topic": topic,
        "partition": pid,
        "leader": _int(obj, "leader", zp, errors),
        "leader_epoch": _int(obj, "leader_epoch", zp, errors),
        "isr": _int_list(obj, "isr", zp, errors),
        "controller_epoch": _int(obj, "controller_epoch", zp, errors),
        "leader_recovery_state": _int(obj, "leader_recovery_state", zp, errors),
        "znode_version": _int(obj, "version", zp, errors),
        "zk_version": node.stat.version,
        "error": _joined(errors),
    }


def max_zxid(tree: ZTree) -> int:
    return max((max(n.stat.czxid, n.stat.mzxid, n.stat.pzxid) for n in tree.values()), default=0)


def records_from_tree(
    tree: ZTree, origin: Origin, skipped: Sequence[Mapping[str, str]] = ()
) -> Iterator[dict[str, Any]]:
    """The JSON Lines records (schema_version 1) for a Kafka znode tree, in output order.

    ``tree`` maps chroot-relative Kafka paths to znodes, whichever source read them. Malformed znode
    data gives a record with an ``error`` naming the znode, never an exception.
    """
    c = _Ctx(origin.chroot)
    k = _group(tree)
    yield {
        "kind": "zk_snapshot",
        "schema_version": SCHEMA_VERSION,
        "source": origin.source,
        "zookeeper": origin.zookeeper,
        "chroot": origin.chroot or None,
        "file": origin.file,
        "last_zxid": origin.last_zxid,
        "taken_at_ms": origin.taken_at_ms,
        **origin.extra,
    }
    cluster = _cluster_record(tree, k, c, skipped)
    errors = int(cluster["error"] is not None)
    yield cluster
    for name in sorted(k.brokers, key=_id_key):
        rec = _broker_record(name, k.brokers[name], c)
        errors += rec["error"] is not None
        yield rec
    n_states = 0
    for topic in sorted(k.topics):
        rec = _topic_record(topic, k, c)
        errors += rec["error"] is not None
        yield rec
        states = k.states.get(topic, {})
        for p in sorted(states, key=_id_key):
            rec = _partition_state_record(topic, p, states[p], c)
            errors += rec["error"] is not None
            n_states += 1
            yield rec
    yield {
        "kind": "zk_snapshot_end",
        "complete": True,
        "topics": len(k.topics),
        "brokers": len(k.brokers),
        "partition_states": n_states,
        "records_with_errors": errors,
        "skipped_znodes": [dict(s) for s in skipped],
    }


# --------------------------------------------------------------------------------------------------
# Offline: a snapshot file.
# --------------------------------------------------------------------------------------------------


def read_snapshot_tree(
    path: str | os.PathLike[str], chroot: str | None = None
) -> tuple[dict[str, ZNode], SnapshotInfo]:
    """Stream a snapshot file keeping only Kafka's znodes under ``chroot`` (paths made chroot-relative)."""
    root = normalize_chroot(chroot)
    info = SnapshotInfo(file=str(path))
    tree: dict[str, ZNode] = {}
    for zpath, node in iter_snapshot(path, info):
        rel = relative_path(zpath, root)
        if rel is not None and is_kafka_path(rel):
            tree[rel] = node
    return tree, info


def read_snapshot_file(path: str | os.PathLike[str], chroot: str | None = None) -> list[dict[str, Any]]:
    """Records for a snapshot file, or for the newest ``snapshot.<zxid>`` of a data dir / ``version-2`` dir."""
    snap = newest_snapshot(path)
    root = normalize_chroot(chroot)
    tree, info = read_snapshot_tree(snap, root)
    name_zxid = zxid_from_name(snap.name)
    origin = Origin(
        source="file",
        zookeeper=None,
        chroot=root,
        file=str(snap),
        last_zxid=name_zxid if name_zxid is not None else info.max_zxid,
        taken_at_ms=int(snap.stat().st_mtime * 1000),
        extra={
            "max_znode_zxid": info.max_zxid,
            "kafka_znodes": len(tree),
            "file_znodes": info.znodes,
            "zk_sessions": len(info.sessions),
            "compression": info.compression,
            "read_only_server": None,
        },
    )
    return list(records_from_tree(tree, origin))


# --------------------------------------------------------------------------------------------------
# Live: kazoo.
# --------------------------------------------------------------------------------------------------


class ZooKeeperUnavailable(ConnectionError):
    """ZooKeeper could not be reached, or the connection was lost while reading."""


def _zstat(s: Any) -> ZStat:
    return ZStat(s.czxid, s.mzxid, s.ctime, s.mtime, s.version, s.cversion, s.aversion, s.ephemeralOwner, s.pzxid)


class _LiveReader:
    """Reads each Kafka znode exactly once; children that vanish or deny access are noted, not fatal."""

    def __init__(self, zk: Any) -> None:
        from kazoo.exceptions import NoAuthError, NoNodeError

        self.zk = zk
        self.tree: dict[str, ZNode] = {}
        self.skipped: list[dict[str, str]] = []
        self._missing = (NoNodeError, NoAuthError)
        self._no_node = NoNodeError

    def _note(self, path: str, e: Exception) -> None:
        reason = "vanished between listing and reading" if isinstance(e, self._no_node) else "not readable (NoAuth)"
        self.skipped.append({"path": path, "reason": reason})

    def get(self, path: str, listed: bool = True) -> None:
        try:
            data, stat = self.zk.retry(self.zk.get, path)
        except self._missing as e:
            if listed or not isinstance(e, self._no_node):
                self._note(path, e)
            return
        self.tree[path] = ZNode(data, _zstat(stat))

    def children(self, path: str, listed: bool = False) -> list[str]:
        try:
            return sorted(self.zk.retry(self.zk.get_children, path))
        except self._missing as e:
            if listed or not isinstance(e, self._no_node):
                self._note(path, e)
            return []

    def read(self) -> None:
        for path in ("/brokers", "/cluster/id", "/controller_epoch", "/controller", CLUSTER_DEFAULT_CONFIG):
            self.get(path, listed=False)
        for b in self.children("/brokers/ids"):
            self.get(f"/brokers/ids/{b}")
        for t in self.children("/brokers/topics"):
            self.get(f"/brokers/topics/{t}")
            if f"/brokers/topics/{t}" not in self.tree:
                continue
            self.get(f"/config/topics/{t}", listed=False)
            for p in self.children(f"/brokers/topics/{t}/partitions"):
                self.get(f"/brokers/topics/{t}/partitions/{p}/state")
        for t in self.children("/admin/delete_topics"):
            self.get(f"/admin/delete_topics/{t}")


def read_live(connect: str, timeout: float = 10.0, auth: Any = None) -> list[dict[str, Any]]:
    """Records for a live ZooKeeper, ``connect`` as in Kafka's ``zookeeper.connect`` (HOST:PORT[,...][/chroot]);
    ``auth``: the identity to read as (``fleet_doctor.zookeeper.session``), None for none.

    Raises ZooKeeperUnavailable (an OSError) when ZooKeeper cannot be reached within ``timeout`` seconds
    or the session is lost mid-read; ValueError for an invalid connect string.
    """
    from kazoo.exceptions import KazooException
    from kazoo.handlers.threading import KazooTimeoutError
    from kazoo.protocol.states import KeeperState

    from fleet_doctor.zookeeper import session

    hosts, chroot = split_connect(connect)
    started = int(time.time() * 1000)
    try:
        with session(hosts + chroot, timeout=timeout, read_only=True, retries=3, auth=auth) as zk:
            read_only_server = zk.client_state == KeeperState.CONNECTED_RO
            reader = _LiveReader(zk)
            reader.read()
    except KazooTimeoutError as e:
        raise ZooKeeperUnavailable(f"ZooKeeper {hosts}: no connection within {timeout:g}s ({e})") from None
    except KazooException as e:
        raise ZooKeeperUnavailable(f"ZooKeeper {hosts}: connection lost while reading ({e!r})") from None
    zxid = max_zxid(reader.tree) or None
    origin = Origin(
        source="live",
        zookeeper=hosts,
        chroot=chroot,
        file=None,
        last_zxid=zxid,
        taken_at_ms=started,
        extra={
            "max_znode_zxid": zxid,
            "kafka_znodes": len(reader.tree),
            "file_znodes": None,
            "zk_sessions": None,
            "compression": None,
            "read_only_server": read_only_server,
        },
    )
    return list(records_from_tree(reader.tree, origin, reader.skipped))
