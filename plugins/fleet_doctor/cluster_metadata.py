#!/usr/bin/env python3
# ruff: noqa: UP031, RUF005, B904
# (shipped to controllers like the probe: it must run on Python 3.6, so no modernising rewrites)
"""KRaft cluster metadata decoder: replays ``__cluster_metadata-0`` (latest snapshot + the log after it).

In the probe's family: stdlib only, Python 3.6+, streamed to a controller over SSH as
``python3 - DIR`` (see ``bundle()``), and it reuses the probe's batch framing (``probe.walk_log``,
CRC-32C, file-name patterns, meta.properties) instead of re-writing it. It prints JSON Lines in the
shape of the ZooKeeper snapshot (docs/cluster-metadata-schema.md), so that detection needs no second
code path for cluster facts.

The metadata record schemas are written down once, here, as data: ``METADATA_RECORDS`` (apiKey ->
name, versions, fields) and ``CONTROL_RECORDS`` (control record type -> name, fields), with the type
vocabulary ``TYPES``. ``decode_message`` reads any of them; the lab's encoder writes from the same
tables. Facts are cited as in ../shared/docs/kraft-reference.md ("kraft-ref §n").

Public API: ``read_cluster_metadata(dir) -> [record]`` / ``iter_cluster_metadata(dir)`` (ClusterMetadataError when
the dir cannot be read at all), ``format_records(records) -> str``, ``bundle() -> bytes``, ``main(argv)``; the
tables and ``decode_message`` / ``decode_metadata_record`` / ``decode_control_record`` / ``iter_batch_records`` /
``batch_records``; ``Image`` (the replayed state, Kafka's field names) and ``snapshot_files`` / ``log_segments``
(file names as Kafka orders them).

Why one long file: like the probe, it is the program sent to a controller (``bundle()`` prepends the probe's framing
to this one file); its record schemas are data, written down once, and most of its length is those tables.
"""

import base64
import errno
import itertools
import json
import os
import struct
import sys
import time
import zlib

try:
    from fleet_doctor import probe
except ImportError:  # shipped over SSH: bundle() registers the probe as a top-level module
    import probe

SCHEMA_VERSION = 1
METADATA_DIR_NAME = "__cluster_metadata-0"

# --------------------------------------------------------------------------------------------
# The type vocabulary (kraft-ref §3; Kafka's generator MessageDataGenerator). Every record version this table
# knows is "flexible" (KIP-482 compact encodings and tagged fields), as all KRaft metadata records are from v0.
#   int8 int16 int32 int64   big-endian signed
#   uint16                   big-endian unsigned, 2 bytes
#   float64                  IEEE 754, big-endian
#   bool                     1 byte, non-zero = true
#   uuid                     16 bytes; as text Kafka's Uuid.toString(): url-safe base64 without padding (22 chars)
#   string                   uvarint(n + 1) then n bytes of UTF-8; 0 = null. Kafka refuses n > 32767
#   bytes                    uvarint(n + 1) then n bytes; 0 = null
#   []T                      uvarint(n + 1) then n elements of T; 0 = null. T is a scalar type above or a struct
#   struct                   the struct's fields, then its tagged-field section
# Each struct (the message itself, every array element of struct type, every nested struct) ends with a tagged
# section: uvarint count, then per field uvarint tag, uvarint size, value; tags ascending; only values that differ
# from the field's default are written. A reader skips tags it does not know.
SCALAR_CODES = {"int8": "b", "int16": "h", "int32": "i", "int64": "q", "uint16": "H", "float64": "d"}  # struct codes
SCALAR_TYPES = dict((t, struct.Struct(">" + code)) for t, code in SCALAR_CODES.items())
TYPES = tuple(sorted(SCALAR_TYPES)) + ("bool", "uuid", "string", "bytes")  # plus "[]T" and struct types
STRING_MAX_BYTES = 0x7FFF  # generated readers: "string field X had invalid length N"
ZERO_UUID_BYTES = b"\0" * 16


def _range(text):
    """Kafka's version range syntax: "0+", "2+", "1-3", "0" as (low, high); high None = open."""
    if text is None:
        return None
    text = str(text)
    if text.endswith("+"):
        return (int(text[:-1]), None)
    if "-" in text:
        lo, hi = text.split("-", 1)
        return (int(lo), int(hi))
    return (int(text), int(text))


def in_range(rng, version):
    """True if ``version`` is in a (low, high) range; a None range holds no version."""
    return rng is not None and version >= rng[0] and (rng[1] is None or version <= rng[1])


def field(name, type_, versions="0+", nullable=None, tag=None, default=None, fields=None):
    """One field of a schema, as data: Kafka's JSON schema attributes under their meaning.

    versions / nullable: version ranges ("0+", "1-2"); nullable None = never nullable. tag: the tagged-field tag
    (a tagged field is tagged in every version it exists in, as in all metadata schemas). default: the declared
    default (Python value) or None for the type's own (0, false, "", empty array, the zero uuid; null for a
    nullable field declared "null"). fields: the element/struct fields of a "[]Struct" or "Struct" type.
    """
    return {
        "name": name,
        "type": type_,
        "versions": _range(versions),
        "nullable_versions": _range(nullable),
        "tag": tag,
        "default": default,
        "fields": fields,
    }


def _endpoint_fields(with_protocol=True):
    out = [field("Name", "string"), field("Host", "string"), field("Port", "uint16")]
    if with_protocol:
        out.append(field("SecurityProtocol", "int16"))
    return out


def _feature_fields():
    return [field("Name", "string"), field("MinSupportedVersion", "int16"), field("MaxSupportedVersion", "int16")]


def record(name, versions, fields_):
    return {"name": name, "versions": _range(versions), "flexible": (0, None), "fields": fields_}


# KRaft metadata records: kraft-ref §4, Kafka's metadata/src/main/resources/common/metadata/*.json.
METADATA_RECORDS = {
    0: record(
        "RegisterBrokerRecord",
        "0-3",
        [
            field("BrokerId", "int32"),
            field("IsMigratingZkBroker", "bool", versions="2+", default=False),
            field("IncarnationId", "uuid"),
            field("BrokerEpoch", "int64"),
            field("EndPoints", "[]BrokerEndpoint", fields=_endpoint_fields()),
            field("Features", "[]BrokerFeature", fields=_feature_fields()),
            field("Rack", "string", nullable="0+"),
            field("Fenced", "bool", default=True),
            field("InControlledShutdown", "bool", versions="1+", default=False),
            field("LogDirs", "[]uuid", versions="3+", tag=0),
        ],
    ),
    1: record("UnregisterBrokerRecord", "0", [field("BrokerId", "int32"), field("BrokerEpoch", "int64")]),
    2: record("TopicRecord", "0", [field("Name", "string"), field("TopicId", "uuid")]),
    3: record(
        "PartitionRecord",
        "0-2",
        [
            field("PartitionId", "int32", default=-1),
            field("TopicId", "uuid"),
            field("Replicas", "[]int32"),
            field("Isr", "[]int32"),
            field("RemovingReplicas", "[]int32"),
            field("AddingReplicas", "[]int32"),
            field("Leader", "int32", default=-1),
            field("LeaderRecoveryState", "int8", tag=0, default=0),
            field("LeaderEpoch", "int32", default=-1),
            field("PartitionEpoch", "int32", default=-1),
            field("Directories", "[]uuid", versions="1+"),
            field("EligibleLeaderReplicas", "[]int32", versions="2+", nullable="2+", tag=1),
            field("LastKnownElr", "[]int32", versions="2+", nullable="2+", tag=2),
        ],
    ),
    4: record(
        "ConfigRecord",
        "0",
        [
            field("ResourceType", "int8"),
            field("ResourceName", "string"),
            field("Name", "string"),
            field("Value", "string", nullable="0+"),
        ],
    ),
    5: record(
        "PartitionChangeRecord",
        "0-2",
        [
            field("PartitionId", "int32", default=-1),
            field("TopicId", "uuid"),
            field("Isr", "[]int32", nullable="0+", tag=0),
            field("Leader", "int32", tag=1, default=-2),
            field("Replicas", "[]int32", nullable="0+", tag=2),
            field("RemovingReplicas", "[]int32", nullable="0+", tag=3),
            field("AddingReplicas", "[]int32", nullable="0+", tag=4),
            field("LeaderRecoveryState", "int8", tag=5, default=-1),
            field("EligibleLeaderReplicas", "[]int32", versions="2+", nullable="2+", tag=6),
            field("LastKnownElr", "[]int32", versions="2+", nullable="2+", tag=7),
            field("Directories", "[]uuid", versions="1+", nullable="1+", tag=8),
        ],
    ),
    7: record("FenceBrokerRecord", "0", [field("Id", "int32"), field("Epoch", "int64")]),
    8: record("UnfenceBrokerRecord", "0", [field("Id", "int32"), field("Epoch", "int64")]),
    9: record("RemoveTopicRecord", "0", [field("TopicId", "uuid")]),
    10: record(
        "DelegationTokenRecord",
        "0",
        [
            field("Owner", "string"),
            field("Requester", "string"),
            field("Renewers", "[]string"),
            field("IssueTimestamp", "int64"),
            field("MaxTimestamp", "int64"),
            field("ExpirationTimestamp", "int64"),
            field("TokenId", "string"),
        ],
    ),
    11: record(
        "UserScramCredentialRecord",
        "0",
        [
            field("Name", "string"),
            field("Mechanism", "int8"),
            field("Salt", "bytes"),
            field("StoredKey", "bytes"),
            field("ServerKey", "bytes"),
            field("Iterations", "int32"),
        ],
    ),
    12: record("FeatureLevelRecord", "0", [field("Name", "string"), field("FeatureLevel", "int16")]),
    14: record(
        "ClientQuotaRecord",
        "0",
        [
            field(
                "Entity",
                "[]EntityData",
                fields=[field("EntityType", "string"), field("EntityName", "string", nullable="0+")],
            ),
            field("Key", "string"),
            field("Value", "float64"),
            field("Remove", "bool"),
        ],
    ),
    15: record(
        "ProducerIdsRecord",
        "0",
        [field("BrokerId", "int32"), field("BrokerEpoch", "int64"), field("NextProducerId", "int64")],
    ),
    17: record(
        "BrokerRegistrationChangeRecord",
        "0-2",
        [
            field("BrokerId", "int32"),
            field("BrokerEpoch", "int64"),
            field("Fenced", "int8", tag=0),
            field("InControlledShutdown", "int8", versions="1+", tag=1),
            field("LogDirs", "[]uuid", versions="2+", tag=2),
        ],
    ),
    18: record(
        "AccessControlEntryRecord",
        "0",
        [
            field("Id", "uuid"),
            field("ResourceType", "int8"),
            field("ResourceName", "string"),
            field("PatternType", "int8"),
            field("Principal", "string"),
            field("Host", "string"),
            field("Operation", "int8"),
            field("PermissionType", "int8"),
        ],
    ),
    19: record("RemoveAccessControlEntryRecord", "0", [field("Id", "uuid")]),
    20: record("NoOpRecord", "0", []),
    21: record("ZkMigrationStateRecord", "0", [field("ZkMigrationState", "int8")]),
    22: record("RemoveUserScramCredentialRecord", "0", [field("Name", "string"), field("Mechanism", "int8")]),
    23: record("BeginTransactionRecord", "0", [field("Name", "string", nullable="0+", tag=0)]),
    24: record("EndTransactionRecord", "0", []),
    25: record("AbortTransactionRecord", "0", [field("Reason", "string", nullable="0+", tag=0)]),
    26: record("RemoveDelegationTokenRecord", "0", [field("TokenId", "string")]),
    27: record(
        "RegisterControllerRecord",
        "0",
        [
            field("ControllerId", "int32"),
            field("IncarnationId", "uuid"),
            field("ZkMigrationReady", "bool"),
            field("EndPoints", "[]ControllerEndpoint", fields=_endpoint_fields()),
            field("Features", "[]ControllerFeature", fields=_feature_fields()),
        ],
    ),
    28: record("ClearElrRecord", "0", [field("TopicName", "string")]),
    29: record("UnregisterControllerRecord", "0", [field("ControllerId", "int32")]),
}
RECORD_KEYS = dict((spec["name"], key) for key, spec in METADATA_RECORDS.items())  # name -> apiKey
METADATA_FRAME_VERSION = 1  # kraft-ref §3: uvarint frameVersion (1), uvarint apiKey, uvarint version, body

# ConfigRecord.ResourceType (ConfigResource.Type)
CONFIG_RESOURCE_TYPES = {2: "topic", 4: "broker", 8: "broker-logger", 16: "client-metrics", 32: "group"}
CONFIG_TOPIC = 2
CONFIG_BROKER = 4
# RegisterBrokerRecord EndPoints SecurityProtocol (SecurityProtocol.id)
SECURITY_PROTOCOLS = {0: "PLAINTEXT", 1: "SSL", 2: "SASL_PLAINTEXT", 3: "SASL_SSL"}

# Control records (kraft-ref §2): key = int16 version (0) + int16 type; value = the message at version 0, no frame
# header. Types 0/1 (ABORT/COMMIT) are transaction markers that KRaft never writes.
CONTROL_KEY = struct.Struct(">hh")
CONTROL_RECORDS = {
    0: record("ABORT", "0", [field("Version", "int16"), field("CoordinatorEpoch", "int32")]),
    1: record("COMMIT", "0", [field("Version", "int16"), field("CoordinatorEpoch", "int32")]),
    2: record(
        "LEADER_CHANGE",
        "0-1",
        [
            field("Version", "int16"),
            field("LeaderId", "int32"),
            field(
                "Voters",
                "[]Voter",
                fields=[field("VoterId", "int32"), field("VoterDirectoryId", "uuid", versions="1+")],
            ),
            field(
                "GrantingVoters",
                "[]Voter",
                fields=[field("VoterId", "int32"), field("VoterDirectoryId", "uuid", versions="1+")],
            ),
        ],
    ),
    3: record("SNAPSHOT_HEADER", "0", [field("Version", "int16"), field("LastContainedLogTimestamp", "int64")]),
    4: record("SNAPSHOT_FOOTER", "0", [field("Version", "int16")]),
    5: record("KRAFT_VERSION", "0", [field("Version", "int16"), field("KRaftVersion", "int16")]),
    6: record(
        "KRAFT_VOTERS",
        "0",
        [
            field("Version", "int16"),
            field(
                "Voters",
                "[]Voter",
                fields=[
                    field("VoterId", "int32"),
                    field("VoterDirectoryId", "uuid"),
                    field("Endpoints", "[]Endpoint", fields=_endpoint_fields(with_protocol=False)),
                    field(
                        "KRaftVersionFeature",
                        "KRaftVersionFeature",
                        fields=[field("MinSupportedVersion", "int16"), field("MaxSupportedVersion", "int16")],
                    ),
                ],
            ),
        ],
    ),
}
CONTROL_KEYS = dict((spec["name"], key) for key, spec in CONTROL_RECORDS.items())  # name -> type
CONTROL_RECORD_VERSION = 0  # the value is written at version 0 (LeaderChangeMessage too, kraft-ref §2)


def element_type(type_):
    """ "[]int32" -> "int32"; None for a non-array type."""
    return type_[2:] if type_.startswith("[]") else None


def field_default(f, version=None):
    """The value a field takes when it is absent (not in this version, or a tagged field not written)."""
    if f["default"] is not None:
        return f["default"]
    t = f["type"]
    if f["nullable_versions"] is not None and f["tag"] is not None:
        return None  # Kafka's nullable tagged fields here all declare "default": "null"
    if element_type(t) is not None:
        return []
    if t in SCALAR_TYPES:
        return 0
    if t == "bool":
        return False
    if t == "uuid":
        return uuid_text(ZERO_UUID_BYTES)
    if t == "string":
        return ""
    if t == "bytes":
        return b""
    return dict((sub["name"], field_default(sub, version)) for sub in f["fields"] or ())


_UUID_TEXTS = {}  # 16 bytes -> their text: a topic's ID is in each of its partitions, a log dir's in each replica
_UUID_TEXTS_MAX = 1 << 16  # a log of ever new UUIDs costs a lookup each, not memory


def uuid_text(raw):
    """Kafka's Uuid.toString(): url-safe base64 of the 16 bytes, no padding. The same bytes give the same str
    object (up to ``_UUID_TEXTS_MAX`` of them): an image of 200,000 partitions holds each topic and directory ID
    once, not once per partition."""
    text = _UUID_TEXTS.get(raw)
    if text is None:
        text = base64.urlsafe_b64encode(raw).decode("ascii")[:22]
        if len(_UUID_TEXTS) < _UUID_TEXTS_MAX:
            _UUID_TEXTS[bytes(raw)] = text
    return text


def uuid_bytes(text):
    """The 16 bytes of a Uuid string; ValueError if it is not one."""
    if not probe.valid_topic_id(text):
        raise ValueError("not a Kafka Uuid: %r" % (text,))
    return base64.urlsafe_b64decode(text + "==")


# --------------------------------------------------------------------------------------------
# Decoding. A DecodeError names what was wrong at which byte of the record value; callers add the file and offset.
class DecodeError(ValueError):
    pass


class Reader:
    """Bounded reads from a bytes object: every length is checked against what is left before anything is
    allocated, so a hostile length field cannot make the decoder allocate more than the input's size."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf, pos=0, end=None):
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    def remaining(self):
        return self.end - self.pos

    def take(self, n, what="bytes"):
        if n < 0 or n > self.end - self.pos:
            raise DecodeError("%s needs %d bytes at byte %d, only %d left" % (what, n, self.pos, self.end - self.pos))
        start = self.pos
        self.pos += n
        return self.buf[start : self.pos]

    def unpack(self, st, what):
        if st.size > self.end - self.pos:
            raise DecodeError(
                "%s needs %d bytes at byte %d, only %d left" % (what, st.size, self.pos, self.remaining())
            )
        v = st.unpack_from(self.buf, self.pos)[0]
        self.pos += st.size
        return v

    def uvarint(self, what="varint", max_bytes=5):
        """Unsigned varint (ByteUtils.readUnsignedVarint: at most 5 bytes, 10 for a varlong)."""
        pos = self.pos
        if pos < self.end:  # the common case first: one byte
            b = self.buf[pos]
            if b < 0x80:
                self.pos = pos + 1
                return b
        value = 0
        shift = 0
        for _ in range(max_bytes):
            if self.pos >= self.end:
                raise DecodeError("%s runs past the end at byte %d" % (what, self.pos))
            b = self.buf[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
        raise DecodeError("%s at byte %d is longer than %d bytes" % (what, self.pos, max_bytes))

    def varint(self, what="varint"):
        """Zigzag signed varint (record framing)."""
        v = self.uvarint(what)
        return (v >> 1) ^ -(v & 1)

    def varlong(self, what="varlong"):
        v = self.uvarint(what, max_bytes=10)
        return (v >> 1) ^ -(v & 1)


_BOOL = struct.Struct(">B")


def _read_value(f, t, r, version):
    """One value of type t (a field's type or an array's element type) at the reader."""
    st = SCALAR_TYPES.get(t)
    if st is not None:
        return r.unpack(st, f["name"])
    if t == "bool":
        return r.unpack(_BOOL, f["name"]) != 0
    if t == "uuid":
        return uuid_text(r.take(16, f["name"]))
    if t in ("string", "bytes"):
        n = r.uvarint(f["name"]) - 1
        if n < 0:
            if in_range(f["nullable_versions"], version):
                return None
            raise DecodeError("non-nullable field %s was serialized as null" % f["name"])
        if t == "string" and n > STRING_MAX_BYTES:
            raise DecodeError("string field %s had invalid length %d" % (f["name"], n))
        raw = r.take(n, f["name"])
        if t == "bytes":
            return bytes(raw)
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError as e:
            raise DecodeError("string field %s is not UTF-8: %s" % (f["name"], e))
    et = element_type(t)
    if et is not None:
        return _read_array(f, et, r, version, in_range(f["nullable_versions"], version))
    return _read_struct(f["fields"], r, version)  # a nested struct


def _read_array(f, et, r, version, nullable):
    """An array of ``et`` elements of the field ``f`` (``nullable``: at this version)."""
    n = r.uvarint(f["name"]) - 1
    if n < 0:
        if nullable:
            return None
        raise DecodeError("non-nullable field %s was serialized as null" % f["name"])
    if n > r.end - r.pos:  # every element takes at least one byte: Kafka's own allocation guard
        raise DecodeError(
            "Tried to allocate a collection of size %d, but there are only %d bytes remaining (field %s)"
            % (n, r.remaining(), f["name"])
        )
    code = SCALAR_CODES.get(et)
    if code is not None:  # an array of numbers in one unpack
        return list(struct.unpack(">%d%s" % (n, code), r.take(n * SCALAR_TYPES[et].size, f["name"])))
    if et in TYPES:
        return [_read_value(f, et, r, version) for _ in range(n)]
    return [_read_struct(f["fields"], r, version) for _ in range(n)]


def _reader(f, t, version):
    """``_read_value`` for the field ``f`` of type ``t`` at ``version``, its type and version decided once: a
    function of the reader (what ``_struct_plan`` keeps per schema and version)."""
    st = SCALAR_TYPES.get(t)
    if st is not None:
        name = f["name"]
        return lambda r: r.unpack(st, name)
    et = element_type(t)
    if et is not None:
        nullable = in_range(f["nullable_versions"], version)
        if et in SCALAR_CODES or et == "uuid":
            return _short_array_reader(f, et, version, nullable)
        return lambda r: _read_array(f, et, r, version, nullable)
    if t in TYPES:
        return lambda r: _read_value(f, t, r, version)
    return lambda r: _read_struct(f["fields"], r, version)  # a nested struct


def _short_array_reader(f, et, version, nullable):
    """``_read_array`` for an array of numbers or UUIDs, the common case (fewer than 127 elements, all there: a
    partition's replicas, ISR, directories) read in one step; anything else by ``_read_array``, which says what is
    wrong."""
    size = 16 if et == "uuid" else SCALAR_TYPES[et].size
    structs = [struct.Struct(">%d%s" % (n, SCALAR_CODES[et])) for n in range(127)] if et != "uuid" else None

    def read(r):
        pos, buf = r.pos, r.buf
        if pos < r.end:
            n = buf[pos] - 1
            if 0 <= n < 127 and pos + 1 + n * size <= r.end:
                r.pos = pos + 1 + n * size
                if structs is not None:
                    return list(structs[n].unpack_from(buf, pos + 1))
                return [uuid_text(buf[i : i + 16]) for i in range(pos + 1, pos + 1 + 16 * n, 16)]
        return _read_array(f, et, r, version, nullable)

    return read


_PLANS = {}  # (id of a schema's field list, version) -> _struct_plan's


def _struct_plan(fields_, version):
    """How a struct reads at ``version``, decided once per schema and version: per field in order, (name, its
    reader or None, its default: a value, or a function for a mutable one), and the tagged fields by tag."""
    key = (id(fields_), version)
    plan = _PLANS.get(key)
    if plan is None:
        steps, tagged = [], {}
        for f in fields_:
            present = in_range(f["versions"], version)
            if present and f["tag"] is None:
                steps.append((f["name"], _reader(f, f["type"], version), None))
                continue
            if present:
                tagged[f["tag"]] = f
            value = field_default(f, version)
            if isinstance(value, (list, dict)):
                steps.append((f["name"], None, lambda f=f: field_default(f, version)))
            else:
                steps.append((f["name"], None, lambda value=value: value))
        plan = _PLANS[key] = (steps, tagged, fields_)  # the list kept: its id is the key
    return plan


def _read_struct(fields_, r, version, flexible=True):
    """A struct's fields in order, then (flexible versions) its tagged section. Returns {field name: value}."""
    out = {}
    steps, tagged, _kept = _struct_plan(fields_, version)
    for name, read, default in steps:
        out[name] = read(r) if read is not None else default()
    if flexible:
        count = r.uvarint("tagged field count")
        if count > r.remaining():
            raise DecodeError("%d tagged fields but only %d bytes remaining" % (count, r.remaining()))
        for _ in range(count):
            tag = r.uvarint("tag")
            size = r.uvarint("tagged field size")
            raw = r.take(size, "tagged field %d" % tag)
            f = tagged.get(tag)
            if f is None:
                continue  # an unknown tag is skipped, as Kafka's readers do
            sub = Reader(raw)
            out[f["name"]] = _read_value(f, f["type"], sub, version)
            if sub.remaining():
                raise DecodeError("tagged field %s has %d bytes left over" % (f["name"], sub.remaining()))
    return out


def decode_message(schema, buf, version, exact=True):
    """Decode one message body (``buf``: bytes) at ``version`` with ``schema`` (an entry of METADATA_RECORDS or
    CONTROL_RECORDS). Returns {Kafka field name: value}: ints, bool, str (uuid as Kafka's text form), bytes, lists,
    dicts for structs, None for null. Raises DecodeError; with ``exact`` bytes left over are an error too."""
    r = Reader(buf)
    flexible = in_range(schema.get("flexible"), version)
    out = _read_struct(schema["fields"], r, version, flexible)
    if exact and r.remaining():
        raise DecodeError("%d bytes left over after %s v%d" % (r.remaining(), schema["name"], version))
    return out


def decode_metadata_record(value):
    """A metadata record value (kraft-ref §3): returns (api_key, version, name, fields). Raises UnknownRecord for an
    apiKey this table does not know, UnsupportedVersion for a version beyond its range, DecodeError otherwise."""
    r = Reader(value)
    frame = r.uvarint("frame version")
    if frame != METADATA_FRAME_VERSION:
        raise DecodeError("unsupported metadata record frame version %d" % frame)
    api_key = r.uvarint("apiKey")
    version = r.uvarint("record version")
    schema = METADATA_RECORDS.get(api_key)
    if schema is None:
        raise UnknownRecord(
            "unknown metadata record type (apiKey %d, version %d)" % (api_key, version), api_key, version
        )
    if not in_range(schema["versions"], version):
        raise UnsupportedVersion(
            "%s version %d is not supported (known: %s)" % (schema["name"], version, _range_text(schema["versions"])),
            api_key,
            version,
        )
    body = decode_message(schema, r.buf[r.pos :], version)
    return api_key, version, schema["name"], body


def _range_text(rng):
    return "%d+" % rng[0] if rng[1] is None else ("%d" % rng[0] if rng[0] == rng[1] else "%d-%d" % rng)


class UnknownRecord(DecodeError):
    def __init__(self, message, api_key, version):
        DecodeError.__init__(self, message)
        self.api_key = api_key
        self.version = version


class UnsupportedVersion(UnknownRecord):
    pass


def decode_control_record(key, value):
    """A control record (kraft-ref §2): returns (type, name, fields). UnknownRecord for an unknown type."""
    kr = Reader(key)
    kversion = kr.unpack(SCALAR_TYPES["int16"], "control key version")
    ctype = kr.unpack(SCALAR_TYPES["int16"], "control key type")
    schema = CONTROL_RECORDS.get(ctype)
    if schema is None:
        raise UnknownRecord("unknown control record type %d (key version %d)" % (ctype, kversion), ctype, kversion)
    # Kafka's ControlRecordUtils reads every control record value at version 0 whatever its leading Version field
    # says, and does not look at bytes after it: so does this
    body = decode_message(schema, value, CONTROL_RECORD_VERSION, exact=False)
    return ctype, schema["name"], body


# --------------------------------------------------------------------------------------------
# Record batches (kraft-ref §2). probe.walk_log frames and CRC-checks them; this reads each valid batch's records.
# KRaft writes batches of at most 8 MiB (KafkaRaftClient.MAX_BATCH_SIZE_BYTES, the batch with its header): a batch
# on disk, or a gzip batch's records once inflated, larger than that (with a little slack) is not KRaft's
KRAFT_MAX_BATCH_BYTES = 8 << 20
MAX_BATCH_BYTES = KRAFT_MAX_BATCH_BYTES + (64 << 10)
MAX_INFLATED_BYTES = MAX_BATCH_BYTES
# undecodable records in one batch after which the rest of it is skipped, with one problem saying so: a hostile
# batch of a million empty records costs a check of its framing, not a million problems
BATCH_UNDECODABLE_MAX = 10
FRAMES_KEPT_MAX = 1 << 16  # records of a batch whose framing is kept from the check rather than read twice
CONTROL_ATTRIBUTE = 0x20
_HEADER = probe.V2_BATCH_HEADER


class BatchRecord:
    """One record of a batch: its absolute offset, and key / value bytes (None when null)."""

    __slots__ = ("key", "offset", "value")

    def __init__(self, offset, key, value):
        self.offset = offset
        self.key = key
        self.value = value


def _record_at(r, i):
    """The record ``i`` of a batch at ``r``'s position: (offsetDelta, key span, value span) with spans (start, end)
    or None for null; ``r`` moves past the record. Raises DecodeError."""
    length = r.varint("record length")
    if length < 0 or length > r.remaining():
        raise DecodeError("record %d of the batch has length %d, %d bytes left" % (i, length, r.remaining()))
    rec = Reader(r.buf, r.pos, r.pos + length)
    r.pos += length
    rec.take(1, "record attributes")
    rec.varlong("timestampDelta")
    delta = rec.varint("offsetDelta")
    klen = rec.varint("key length")
    key = None
    if klen >= 0:
        rec.take(klen, "key")
        key = (rec.pos - klen, rec.pos)
    vlen = rec.varint("value length")
    value = None
    if vlen >= 0:
        rec.take(vlen, "value")
        value = (rec.pos - vlen, rec.pos)
    headers = rec.varint("header count")
    if headers < 0 or headers > rec.remaining():
        raise DecodeError("record %d claims %d headers" % (i, headers))
    for _ in range(headers):
        n = rec.varint("header key length")
        rec.take(max(n, 0), "header key")
        n = rec.varint("header value length")
        rec.take(max(n, 0), "header value")
    if rec.remaining():
        raise DecodeError("record %d has %d bytes left over" % (i, rec.remaining()))
    return delta, key, value


def iter_batch_records(batch):
    """(header fields dict, record count, iterator of BatchRecord) of one complete v2 batch (bytes). The whole batch
    is checked before the first record is handed out (a batch is taken whole or not at all, as Kafka reads it), and
    the records are made one at a time: a batch of a million tiny records never becomes a million objects at once.
    A gzip batch inflates to at most ``MAX_INFLATED_BYTES``. Raises DecodeError."""
    if len(batch) < probe.V2_MIN_BATCH_SIZE:
        raise DecodeError("batch of %d bytes is smaller than a v2 batch header" % len(batch))
    (base, _len, epoch, magic, _crc, attrs, _lod, _bts, _mts, _pid, _pe, _bs, count) = _HEADER.unpack_from(batch, 0)
    if magic != 2:
        raise DecodeError("batch magic %d is not 2" % magic)
    head = {"base_offset": base, "epoch": epoch, "attributes": attrs, "control": bool(attrs & CONTROL_ATTRIBUTE)}
    codec = attrs & 7
    body = memoryview(batch)[probe.V2_MIN_BATCH_SIZE :]
    if codec == 1:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            body = d.decompress(body, MAX_INFLATED_BYTES)
        except zlib.error as e:
            raise DecodeError("gzip batch does not inflate: %s" % e)
        if d.unconsumed_tail or (not d.eof and d.decompress(b"", 1)):
            raise DecodeError(
                "gzip batch inflates to more than %d bytes, more than KRaft ever writes in one batch "
                "(KafkaRaftClient MAX_BATCH_SIZE_BYTES)" % MAX_INFLATED_BYTES
            )
    elif codec != 0:
        raise DecodeError("%s-compressed batch (KRaft writes uncompressed batches)" % probe.CODECS.get(codec, codec))
    r = Reader(body)
    if count < 0 or count > r.remaining():
        raise DecodeError("batch claims %d records in %d bytes" % (count, r.remaining()))
    # the check: every record framed right; the frames kept when there are few enough of them (a batch the
    # controller wrote holds some thousands), else found again one at a time as the records are made
    kept = [] if count <= FRAMES_KEPT_MAX else None
    for i in range(count):
        frame = _record_at(r, i)
        if kept is not None:
            kept.append(frame)
    if r.remaining():
        raise DecodeError("%d bytes after the batch's %d records" % (r.remaining(), count))

    def frames():
        rr = Reader(body)
        for i in range(count):
            yield _record_at(rr, i)

    def records():
        for delta, key, value in kept if kept is not None else frames():
            yield BatchRecord(
                base + delta,
                None if key is None else bytes(body[key[0] : key[1]]),
                None if value is None else bytes(body[value[0] : value[1]]),
            )

    return head, count, records()


def batch_records(batch):
    """(header fields dict, [BatchRecord]) of one complete v2 batch (bytes): ``iter_batch_records``' records as a
    list. Raises DecodeError."""
    head, _count, records = iter_batch_records(batch)
    return head, list(records)


# --------------------------------------------------------------------------------------------
# The image: what replaying the records builds (kraft-ref §5, §7; Kafka's MetadataDelta / *Image classes).
PROBLEM_KINDS = (
    "unknown-record",
    "unsupported-version",
    "undecodable",
    "inconsistent",
    "crc",
    "torn-tail",
    "snapshot-gap",
    "open-transaction",
    "unreadable",
)
PROBLEMS_PER_FILE_MAX = 100  # a hostile file cannot flood the output: the rest are counted in problems_suppressed
NO_LEADER_CHANGE = -2
MIGRATING_DIR = probe.ZERO_UUID  # DirectoryId.MIGRATING: the replica's directory is not tracked
UNASSIGNED_DIR = "AAAAAAAAAAAAAAAAAAAAAQ"  # DirectoryId.UNASSIGNED (Uuid 0, 1): a new replica not yet placed
# a partition's lists of replica ids: in the Image, shared tuples (Image.shared); PartitionChangeRecord's null = kept
_SHARED_MAX = 1 << 16  # distinct lists Image.shared keeps; the image's own are held by its partitions anyway
_REPLICA_LISTS = ("Replicas", "Isr", "RemovingReplicas", "AddingReplicas", "EligibleLeaderReplicas", "LastKnownElr")


class Image:
    """Kafka's metadata image, as far as the audit needs it."""

    def __init__(self):
        self.topics = {}  # topic id -> {"name", "partitions": {partition id: dict}}
        self.brokers = {}  # broker id -> registration dict
        self.configs = {}  # (resource type, resource name) -> {name: value}
        self.features = {}  # name -> level
        self.controllers = {}  # controller id -> RegisterControllerRecord fields
        self.zk_migration_state = None
        # what replay looks up, indexed (a log of many ClearElrRecords over many partitions stays linear):
        self._ids_by_name = {}  # topic name -> {topic id}
        self._with_elr = {}  # topic id -> {partition id whose EligibleLeaderReplicas or LastKnownElr is not empty}
        self._shared = {}  # a replica list as a tuple -> the one copy of it every partition holding it refers to

    def shared(self, values):
        """``values`` (a list of replica ids or directory IDs) as a tuple, one object for every partition that holds
        the same: a partition's lists are replaced, never changed in place, so 200,000 partitions over a few replica
        sets hold a few tuples, not 200,000 x 7 lists. None stays None."""
        if values is None:
            return None
        t = tuple(values)
        if len(self._shared) >= _SHARED_MAX:  # a log of ever new lists: each kept by its partitions only
            return self._shared.get(t, t)
        return self._shared.setdefault(t, t)

    # each replay_<Record> takes the decoded fields; a returned string is an inconsistency (the record is skipped)
    def replay(self, name, r):
        fn = getattr(self, "replay_" + name, None)
        return fn(r) if fn is not None else None

    def replay_TopicRecord(self, r):
        old = self.topics.get(r["TopicId"])
        if old is not None:
            self._forget_name(old["name"], r["TopicId"])
        self.topics[r["TopicId"]] = {"name": r["Name"], "partitions": old["partitions"] if old else {}}
        self._ids_by_name.setdefault(r["Name"], set()).add(r["TopicId"])

    def reindex(self):
        """Rebuild what replay looks up from ``topics`` (an image filled directly rather than by replay)."""
        self._ids_by_name = {}
        self._with_elr = {}
        for topic_id, topic in self.topics.items():
            self._ids_by_name.setdefault(topic["name"], set()).add(topic_id)
            for pid, p in topic["partitions"].items():
                self._track_elr(topic_id, pid, p)

    def _forget_name(self, name, topic_id):
        ids = self._ids_by_name.get(name)
        if ids is not None:
            ids.discard(topic_id)
            if not ids:
                del self._ids_by_name[name]

    def _track_elr(self, topic_id, partition_id, p):
        if p["EligibleLeaderReplicas"] or p["LastKnownElr"]:
            self._with_elr.setdefault(topic_id, set()).add(partition_id)
        else:
            self._with_elr.get(topic_id, set()).discard(partition_id)

    def replay_RemoveTopicRecord(self, r):
        topic = self.topics.pop(r["TopicId"], None)
        if topic is None:
            return "RemoveTopicRecord for topic ID %s, which the image does not hold" % r["TopicId"]
        self._forget_name(topic["name"], r["TopicId"])
        self._with_elr.pop(r["TopicId"], None)
        self.configs.pop((CONFIG_TOPIC, topic["name"]), None)  # ConfigurationsDelta: the topic's configs go with it
        return None

    def replay_PartitionRecord(self, r):
        topic = self.topics.get(r["TopicId"])
        if topic is None:
            return "PartitionRecord %d for topic ID %s, which the image does not hold" % (
                r["PartitionId"],
                r["TopicId"],
            )
        p = dict(r)
        for k in _REPLICA_LISTS:
            p[k] = self.shared(r[k] or ())
        p["Directories"] = self.shared(_directories(r["Directories"], len(r["Replicas"])))
        topic["partitions"][r["PartitionId"]] = p
        self._track_elr(r["TopicId"], r["PartitionId"], p)
        return None

    def replay_PartitionChangeRecord(self, r):
        topic = self.topics.get(r["TopicId"])
        p = topic["partitions"].get(r["PartitionId"]) if topic else None
        if p is None:
            return "PartitionChangeRecord for partition %d of topic ID %s, which the image does not hold" % (
                r["PartitionId"],
                r["TopicId"],
            )
        # PartitionRegistration.merge: null / -2 / -1 = unchanged; the partition epoch always moves on
        old_replicas, old_dirs = p["Replicas"], p["Directories"]
        for k in _REPLICA_LISTS:
            if r[k] is not None:
                p[k] = self.shared(r[k])
        if r["Directories"]:
            p["Directories"] = self.shared(_directories(r["Directories"], len(p["Replicas"])))
        elif r["Replicas"] is not None:
            # DirectoryId.createDirectoriesFrom: a replica kept keeps its directory, a new one is UNASSIGNED
            by_replica = {b: old_dirs[i] for i, b in enumerate(old_replicas)}
            p["Directories"] = self.shared(by_replica.get(b, UNASSIGNED_DIR) for b in p["Replicas"])
        if r["Leader"] != NO_LEADER_CHANGE:
            p["Leader"] = r["Leader"]
            p["LeaderEpoch"] += 1
        if r["LeaderRecoveryState"] != -1:
            p["LeaderRecoveryState"] = r["LeaderRecoveryState"]
        p["PartitionEpoch"] += 1
        self._track_elr(r["TopicId"], r["PartitionId"], p)
        return None

    def replay_RegisterBrokerRecord(self, r):
        self.brokers[r["BrokerId"]] = dict(r)

    def replay_UnregisterBrokerRecord(self, r):
        if self.brokers.pop(r["BrokerId"], None) is None:
            return "UnregisterBrokerRecord for broker %d, which is not registered" % r["BrokerId"]
        return None

    def _broker(self, broker_id, what):
        b = self.brokers.get(broker_id)
        return b, (None if b is not None else "%s for broker %d, which is not registered" % (what, broker_id))

    def replay_FenceBrokerRecord(self, r):
        b, err = self._broker(r["Id"], "FenceBrokerRecord")
        if b is not None:
            b["Fenced"] = True
        return err

    def replay_UnfenceBrokerRecord(self, r):
        b, err = self._broker(r["Id"], "UnfenceBrokerRecord")
        if b is not None:
            b["Fenced"] = False
        return err

    def replay_BrokerRegistrationChangeRecord(self, r):
        b, err = self._broker(r["BrokerId"], "BrokerRegistrationChangeRecord")
        if b is None:
            return err
        # Fenced: 1 fence, -1 unfence, 0 no change; InControlledShutdown: 1 yes, 0 no change
        # (BrokerRegistrationFencingChange, BrokerRegistrationInControlledShutdownChange)
        if r["Fenced"] == 1:
            b["Fenced"] = True
        elif r["Fenced"] == -1:
            b["Fenced"] = False
        if r["InControlledShutdown"] == 1:
            b["InControlledShutdown"] = True
        if r["LogDirs"]:
            b["LogDirs"] = r["LogDirs"]
        return None

    def replay_FeatureLevelRecord(self, r):
        if r["FeatureLevel"] == 0 and r["Name"] != "metadata.version":
            self.features.pop(r["Name"], None)
        else:
            self.features[r["Name"]] = r["FeatureLevel"]

    def replay_ConfigRecord(self, r):
        key = (r["ResourceType"], r["ResourceName"])
        if r["Value"] is None:
            conf = self.configs.get(key)
            if conf is not None:
                conf.pop(r["Name"], None)
                if not conf:
                    del self.configs[key]
        else:
            self.configs.setdefault(key, {})[r["Name"]] = r["Value"]

    def replay_RegisterControllerRecord(self, r):
        self.controllers[r["ControllerId"]] = dict(r)

    def replay_UnregisterControllerRecord(self, r):
        self.controllers.pop(r["ControllerId"], None)

    def replay_ZkMigrationStateRecord(self, r):
        self.zk_migration_state = r["ZkMigrationState"]

    def records(self):
        """(record name, fields) that replayed into an empty Image give this one back: what a follower of the log
        starts from (``metadata_records``), as a snapshot holds the image."""
        for name, level in sorted(self.features.items()):
            yield "FeatureLevelRecord", {"Name": name, "FeatureLevel": level}
        if self.zk_migration_state is not None:
            yield "ZkMigrationStateRecord", {"ZkMigrationState": self.zk_migration_state}
        for _cid, c in sorted(self.controllers.items()):
            yield "RegisterControllerRecord", c
        for _bid, b in sorted(self.brokers.items()):
            yield "RegisterBrokerRecord", b
        for topic_id, t in sorted(self.topics.items()):
            yield "TopicRecord", {"Name": t["name"], "TopicId": topic_id}
            for _pid, p in sorted(t["partitions"].items()):
                yield "PartitionRecord", p
        for (rtype, rname), conf in sorted(self.configs.items()):
            for name, value in sorted(conf.items()):
                yield "ConfigRecord", {"ResourceType": rtype, "ResourceName": rname, "Name": name, "Value": value}

    def replay_ClearElrRecord(self, r):
        """Every partition of the named topic (every topic for ""): no ELR, no last known ELR. Only the partitions
        that have either are visited (``_with_elr``)."""
        if r["TopicName"] == "":
            ids = list(self._with_elr)
        else:
            ids = [i for i in self._ids_by_name.get(r["TopicName"], ()) if i in self._with_elr]
        for topic_id in ids:
            partitions = self.topics[topic_id]["partitions"]
            for pid in self._with_elr.pop(topic_id):
                p = partitions[pid]
                p["EligibleLeaderReplicas"] = ()
                p["LastKnownElr"] = ()


def _directories(dirs, n):
    """PartitionRegistration's directories: none given (or not one per replica) = all MIGRATING."""
    if not dirs or len(dirs) != n:
        return [MIGRATING_DIR] * n
    return list(dirs)


# --------------------------------------------------------------------------------------------
# Reading a metadata dir: the latest snapshot, then the log after it (kraft-ref §5).
class ClusterMetadataError(Exception):
    """The dir cannot be read as a KRaft metadata dir at all; the message names the path."""


def resolve_metadata_dir(path):
    """(the __cluster_metadata-0 dir, the log dir holding it) for a metadata dir or a log dir holding one."""
    path = os.path.abspath(path)
    if os.path.basename(path) == METADATA_DIR_NAME:
        if not os.path.isdir(path):
            raise ClusterMetadataError("%s is not a directory" % path)
        return path, os.path.dirname(path)
    if not os.path.isdir(path):
        raise ClusterMetadataError("%s is not a directory" % path)
    inner = os.path.join(path, METADATA_DIR_NAME)
    if os.path.isdir(inner):
        return inner, path
    raise ClusterMetadataError("%s is neither a %s dir nor a log dir holding one" % (path, METADATA_DIR_NAME))


def snapshot_files(names):
    """[(end_offset, epoch, name)] of the complete snapshots among file names, newest last: by epoch, then end offset
    (OffsetAndEpoch.compareTo). .part and .deleted files are not snapshots (removed at startup)."""
    out = []
    for name in names:
        m = probe.KRAFT_SNAPSHOT_RE.fullmatch(name)
        if m and not m.group(3):
            out.append((int(m.group(1)), int(m.group(2)), name))
    out.sort(key=lambda s: (s[1], s[0]))
    return out


def log_segments(names):
    """[(base offset, name)] of the .log segments among file names, in offset order."""
    out = []
    for name in names:
        parsed = probe.parse_segment_file_name(name)
        if parsed and parsed[1] == "log" and parsed[2] is None:
            out.append((parsed[0], name))
    out.sort()
    return out


class _Replay:
    """Applies records to an Image in log order, buffering metadata transactions (kraft-ref §7)."""

    def __init__(self):
        self.image = Image()
        self.problems = []
        self.problem_counts = {}
        self.suppressed = 0
        self.txn = None  # None, or [(offset, name, fields, file, position)] since BeginTransactionRecord
        self.txn_begin = None  # (file, offset, position) of the open BeginTransactionRecord
        self.records_replayed = 0
        self.last_applied_offset = None
        self.leader_change = None  # (leader id, epoch) of the last LEADER_CHANGE
        self.voters = None  # [voter id] of the last KRAFT_VOTERS control record
        self.kraft_version = None
        self.log_next = None  # the offset after the last log batch read: offsets only go up
        self.batches_cut_short = 0  # batches whose records after BATCH_UNDECODABLE_MAX undecodable ones were skipped
        self.stop_at = None  # records at or past this offset are not applied (the committed end: metadata_records)
        self.collect = None  # a follower's read: [(offset, name, fields)] the records applied, the image untouched
        self.spans = None  # with stop_at: (log segment path, [(position, first, last, size)] of its batches walked)

    def problem(self, path, offset, position, kind, message):
        assert kind in PROBLEM_KINDS, kind
        n = self.problem_counts.get(path, 0) + 1
        self.problem_counts[path] = n
        if n > PROBLEMS_PER_FILE_MAX:
            self.suppressed += 1
            return
        where = path
        if offset is not None:
            where += ", offset %d" % offset
        if position is not None:
            where += " (byte %d)" % position
        self.problems.append(
            {
                "kind": "metadata_problem",
                "file": path,
                "offset": offset,
                "position": position,
                "problem": kind,
                "message": "%s: %s" % (where, message),
            }
        )

    def apply(self, offset, name, fields_, path, position):
        if self.stop_at is not None and offset >= self.stop_at:
            return
        if name == "BeginTransactionRecord":
            if self.txn is not None:
                self.problem(
                    path, offset, position, "inconsistent", "BeginTransactionRecord inside an open transaction"
                )
            self.txn = []
            self.txn_begin = (path, offset, position)
            return
        if name == "EndTransactionRecord" or name == "AbortTransactionRecord":
            if self.txn is None:
                self.problem(path, offset, position, "inconsistent", "%s without a BeginTransactionRecord" % name)
            elif name == "EndTransactionRecord":
                for t_offset, t_name, t_fields, t_path, t_position in self.txn:
                    self._apply_now(t_offset, t_name, t_fields, t_path, t_position)
            self.txn = None
            self.txn_begin = None
            self.last_applied_offset = offset
            return
        if self.txn is not None:
            if len(self.txn) >= TXN_RECORDS_MAX:
                msg = "the metadata transaction begun at offset %d holds more than %d records; dropped"
                self.problem(path, offset, position, "undecodable", msg % (self.txn_begin[1], TXN_RECORDS_MAX))
                self.txn = self.txn_begin = None
            else:
                self.txn.append((offset, name, fields_, path, position))
                return
        self._apply_now(offset, name, fields_, path, position)

    def _apply_now(self, offset, name, fields_, path, position):
        if self.collect is not None:  # a follower replays it in its own image; only what an Image replays is kept
            if hasattr(Image, "replay_" + name):
                self.collect.append((offset, name, fields_))
            self.records_replayed += 1
            self.last_applied_offset = offset
            return
        try:
            err = self.image.replay(name, fields_)
        except (KeyError, TypeError, ValueError, IndexError) as e:  # a record of a shape the image cannot take
            err = "%s could not be applied: %s: %s" % (name, type(e).__name__, e)
        if err:
            self.problem(path, offset, position, "inconsistent", err + "; skipped")
        self.records_replayed += 1
        self.last_applied_offset = offset

    def control(self, offset, ctype_name, fields_, epoch):
        if self.stop_at is not None and offset >= self.stop_at:
            return
        if ctype_name == "LEADER_CHANGE":
            self.leader_change = (fields_["LeaderId"], epoch)
        elif ctype_name == "KRAFT_VOTERS":
            self.voters = [v["VoterId"] for v in fields_["Voters"]]
        elif ctype_name == "KRAFT_VERSION":
            self.kraft_version = fields_["KRaftVersion"]
        if self.txn is None:
            self.last_applied_offset = offset


TXN_RECORDS_MAX = 1 << 20  # records buffered in one open transaction before the log is refused


class _FileWalk:
    """Decodes every valid batch of one file (a snapshot or a log segment) that probe.walk_log hands over."""

    def __init__(self, replay, path, f, min_offset, snapshot):
        self.replay = replay
        self.path = path
        self.f = f
        self.min_offset = min_offset  # log records below it are in the snapshot already
        self.snapshot = snapshot
        self.control_names = []  # snapshot: the control records seen, to check header / footer
        self.batches = 0
        self.first_offset = None
        self.next_offset = None

    def on_batch(self, position, first, last, size):
        self.batches += 1
        if self.first_offset is None:
            self.first_offset = first
        rp = self.replay
        if rp.stop_at is not None and first >= rp.stop_at:
            return probe.WALK_STOP  # past the committed end: nothing more is read
        if not self.snapshot:
            if rp.log_next is not None and first < rp.log_next:
                msg = "batch offsets %d..%d go back below %d, where the log already is; skipped"
                msg %= (first, last, rp.log_next)
                rp.problem(self.path, first, position, "inconsistent", msg)
                return
            rp.log_next = last + 1
        self.next_offset = last + 1
        if rp.spans is not None and not self.snapshot:
            rp.spans[1].append((position, first, last, size))
        if last < self.min_offset:
            if rp.collect is None:
                self._before_snapshot(position, size)
            return None
        if size > MAX_BATCH_BYTES:
            rp.problem(
                self.path,
                first,
                position,
                "undecodable",
                "batch of %d bytes is larger than %d" % (size, MAX_BATCH_BYTES),
            )
            return
        self.f.seek(position)
        data = self.f.read(size)
        try:
            head, count, records = iter_batch_records(data)
        except DecodeError as e:
            rp.problem(self.path, first, position, "undecodable", "record batch: %s" % e)
            return
        undecodable = 0
        for i, rec in enumerate(records):
            if rec.offset < self.min_offset:
                continue
            if head["control"]:
                undecodable += self._control(rec, head, position)
            else:
                undecodable += self._data(rec, position)
            if undecodable >= BATCH_UNDECODABLE_MAX and i + 1 < count:
                msg = "%d records of this batch could not be decoded; its other %d records are skipped"
                rp.problem(self.path, rec.offset, position, "undecodable", msg % (undecodable, count - i - 1))
                rp.batches_cut_short += 1  # records that may be good ones are not in the image: it is not whole
                return

    def _before_snapshot(self, position, size):
        """A log batch the snapshot covers: only its LEADER_CHANGE control records are read (snapshots hold none)."""
        if size > MAX_BATCH_BYTES:
            return
        self.f.seek(position)
        data = self.f.read(probe.V2_MIN_BATCH_SIZE)
        if (
            len(data) < probe.V2_MIN_BATCH_SIZE
            or data[16] != 2
            or not _HEADER.unpack_from(data, 0)[5] & CONTROL_ATTRIBUTE
        ):
            return
        data += self.f.read(size - len(data))
        try:
            head, _count, records = iter_batch_records(data)
        except DecodeError:
            return  # not replayed anyway; the records the image needs are in the snapshot
        for rec in records:
            try:
                _ctype, name, body = decode_control_record(rec.key or b"", rec.value or b"")
            except DecodeError:
                continue
            if name == "LEADER_CHANGE":
                self.replay.leader_change = (body["LeaderId"], head["epoch"])

    def _control(self, rec, head, position):
        """Apply one control record; 1 if it could not be decoded, else 0."""
        rp = self.replay
        try:
            if rec.key is None or rec.value is None:
                raise DecodeError("control record without a key or value")
            _ctype, name, body = decode_control_record(rec.key, rec.value)
        except UnknownRecord as e:
            rp.problem(self.path, rec.offset, position, "unknown-record", str(e))
            return 0
        except DecodeError as e:
            rp.problem(self.path, rec.offset, position, "undecodable", "control record: %s" % e)
            return 1
        self.control_names.append(name)
        rp.control(rec.offset, name, body, head["epoch"])
        return 0

    def _data(self, rec, position):
        """Apply one metadata record; 1 if it could not be decoded, else 0 (a record of an unknown type or version
        is a newer Kafka's, not damage)."""
        rp = self.replay
        if rec.value is None:
            rp.problem(self.path, rec.offset, position, "undecodable", "metadata record with a null value")
            return 1
        try:
            _key, _version, name, body = decode_metadata_record(rec.value)
        except UnsupportedVersion as e:
            rp.problem(self.path, rec.offset, position, "unsupported-version", "%s; skipped" % e)
            return 0
        except UnknownRecord as e:
            rp.problem(self.path, rec.offset, position, "unknown-record", "%s; skipped" % e)
            return 0
        except DecodeError as e:
            rp.problem(self.path, rec.offset, position, "undecodable", "metadata record: %s; skipped" % e)
            return 1
        if self.snapshot and name.endswith("TransactionRecord"):
            rp.problem(self.path, rec.offset, position, "inconsistent", "%s in a snapshot; ignored" % name)
            return 0
        rp.apply(rec.offset, name, body, self.path, position)
        return 0


def _snapshot_intact(rp, path, res, fw):
    """True if a snapshot file walked whole, from its SnapshotHeader to its SnapshotFooter; else False, with a
    problem for a missing header / footer (CRC failures and torn tails have theirs already)."""
    ctl = fw.control_names
    intact = not (res["torn_tail"] or res["crc_errors"])
    if not ctl or ctl[0] != "SNAPSHOT_HEADER":
        rp.problem(path, 0, 0, "undecodable", "the snapshot does not start with a SnapshotHeader control record")
        intact = False
    if not ctl or ctl[-1] != "SNAPSHOT_FOOTER":
        if intact:
            msg = "the snapshot has no SnapshotFooter: it is incomplete"
            rp.problem(path, fw.next_offset, res["valid_bytes"], "torn-tail", msg)
        intact = False
    return intact


def _walk_file(replay, path, min_offset, snapshot, start=0):
    """Walk one file (from the batch at byte ``start``); returns (walk_log result, _FileWalk) or (None, None) when it
    cannot be read (a problem)."""
    if replay.stop_at is not None and not snapshot:
        replay.spans = (path, [])
    try:
        with open(probe._open_regular(path), "rb", buffering=0, closefd=True) as f:
            fw = _FileWalk(replay, path, f, min_offset, snapshot)
            res = probe.walk_log(path, verify_crc=True, on_batch=fw.on_batch, start=start)
    except (OSError, ValueError) as e:
        replay.problem(path, None, None, "unreadable", "cannot be read: %s" % probe._err(e))
        return None, None
    if res["crc_errors"]:
        pos = res["first_crc_error_position"]
        if snapshot:
            what = (
                "; the snapshot is unusable: Kafka loads only its newest snapshot and checks every batch's CRC, so it"
                " fails to load a corrupt one"
            )
        else:
            what = "; the file is not read beyond it"
        replay.problem(path, fw.next_offset, pos, "crc", res["tail_error"] + what)
    elif res["torn_tail"]:
        replay.problem(
            path,
            fw.next_offset,
            res["valid_bytes"],
            "torn-tail",
            "%s; the %d bytes from byte %d on are not a complete batch%s"
            % (
                res["tail_error"],
                os.path.getsize(path) - res["valid_bytes"],
                res["valid_bytes"],
                ": the snapshot is incomplete, unusable" if snapshot else "",
            ),
        )
    return res, fw


def read_quorum_state(path):
    """quorum-state (kraft-ref §6) as a dict with data_version, leader_id, leader_epoch, voted_id, voters ([int] or
    None); None when the file is absent. Raises ValueError naming the file when it is not what Kafka writes."""
    try:
        data = probe._read_small(path, 1 << 20)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return None
        raise ValueError("%s cannot be read: %s" % (path, probe._err(e)))
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError("%s is not JSON: %s" % (path, e))
    if not isinstance(obj, dict):
        raise ValueError("%s is not a JSON object" % path)

    def num(key, required=True):
        v = obj.get(key)
        if v is None and not required:
            return None
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError("%s: %s is %r, not an integer" % (path, key, v))
        return v

    out = {
        "data_version": num("data_version"),
        "leader_id": num("leaderId"),
        "leader_epoch": num("leaderEpoch"),
        "voted_id": num("votedId", required=False),
        "voters": None,
    }
    voters = obj.get("currentVoters")
    if voters is not None:
        if not isinstance(voters, list) or not all(
            isinstance(v, dict) and isinstance(v.get("voterId"), int) for v in voters
        ):
            raise ValueError("%s: currentVoters is not a list of {voterId}" % path)
        out["voters"] = [v["voterId"] for v in voters]
    return out


def read_cluster_metadata(metadata_dir):
    """Replay a KRaft metadata dir (a ``__cluster_metadata-0`` dir, or a log dir holding one) into JSON-ready records
    (docs/cluster-metadata-schema.md). Raises ClusterMetadataError when the dir cannot be read at all."""
    return list(iter_cluster_metadata(metadata_dir))


def iter_cluster_metadata(metadata_dir):
    """read_cluster_metadata's records one by one: the replay is done (and ClusterMetadataError raised) by this call,
    the records are made as they are taken, so a big cluster's output is never all in memory beside the image."""
    head, img, rp = _replay(metadata_dir)
    return _records(head, img, rp)


def _note(rp, path, note):
    """Add what the replay did about it to the first problem of a file."""
    for p in rp.problems:
        if p["file"] == path:
            p["message"] += "; " + note
            return


class _SegmentVanished(Exception):
    """A segment the replay needs was listed but is gone when opened: Kafka renamed it ``.deleted`` meanwhile."""


def _replay(metadata_dir, stop_at=None):
    """(the cluster_metadata header, the Image, the _Replay with its problems) of a metadata dir. Kafka deletes the
    segments a new snapshot covers (renamed ``.deleted`` first): when a segment the replay needs is gone by the time it
    is opened, the dir is listed and read once more; when it is gone again, the image says it is not whole."""
    try:
        return _replay_once(metadata_dir, last_try=False, stop_at=stop_at)
    except _SegmentVanished:
        return _replay_once(metadata_dir, last_try=True, stop_at=stop_at)


def _listed(metadata_dir):
    """(the __cluster_metadata-0 dir, the log dir holding it, the names in it); ClusterMetadataError naming the dir
    when it cannot be listed."""
    mdir, logdir = resolve_metadata_dir(metadata_dir)
    try:
        return mdir, logdir, os.listdir(mdir)
    except OSError as e:
        raise ClusterMetadataError("%s cannot be listed: %s" % (mdir, probe._err(e)))


def _replay_once(metadata_dir, last_try, stop_at=None):
    taken_at_ms = int(time.time() * 1000)
    mdir, logdir, names = _listed(metadata_dir)
    snapshots = snapshot_files(names)
    segments = log_segments(names)
    if not snapshots and not segments:
        raise ClusterMetadataError("%s holds neither a metadata snapshot (.checkpoint) nor a log segment (.log)" % mdir)
    rp = _Replay()
    errors = []
    head = {
        "kind": "cluster_metadata",
        "schema_version": SCHEMA_VERSION,
        "source": "kraft",
        "dir": mdir,
        "node_id": None,
        "cluster_id": None,
        "snapshot": None,
        "snapshot_end_offset": None,
        "snapshot_epoch": None,
        "log_start_offset": None,
        "log_end_offset": None,
        "last_applied_offset": None,
        "records_replayed": 0,
        "metadata_version_level": None,
        "features": {},
        "kraft_version": None,
        "zk_migration_state": None,
        "quorum_leader_id": None,
        "quorum_leader_epoch": None,
        "quorum_voted_id": None,
        "quorum_voters": None,
        "quorum_data_version": None,
        "last_leader_change_leader_id": None,
        "last_leader_change_epoch": None,
        "log_max_epoch": None,
        "log_torn_tail": False,
        "log_tail_error": None,
        "log_crc_errors": 0,
        "log_first_crc_error_offset": None,
        "log_segments": len(segments),
        "snapshot_gap": False,
        "snapshot_fallback": [],
        "image_complete": True,
        "open_transaction": False,
        "taken_at_ms": taken_at_ms,
        "error": None,
    }
    # meta.properties of the log dir holding the metadata dir
    mp = os.path.join(logdir, probe.META_PROPERTIES)
    if os.path.lexists(mp):
        try:
            meta = probe.parse_meta_properties(probe._read_small(mp), mp)
            head["node_id"] = meta["broker_id"]
            head["cluster_id"] = meta["cluster_id"]
        except (OSError, ValueError) as e:
            msg = "%s cannot be read: %s" % (mp, probe._err(e)) if isinstance(e, OSError) else str(e)
            errors.append(msg)
            rp.problem(mp, None, None, "unreadable", msg)
    qs_path = os.path.join(mdir, probe.QUORUM_STATE)
    try:
        qs = read_quorum_state(qs_path)
    except ValueError as e:
        qs = None
        errors.append(str(e))
        rp.problem(qs_path, None, None, "unreadable", str(e))
    if qs is not None:
        head["quorum_leader_id"] = qs["leader_id"]
        head["quorum_leader_epoch"] = qs["leader_epoch"]
        head["quorum_voted_id"] = qs["voted_id"]
        head["quorum_voters"] = qs["voters"]
        head["quorum_data_version"] = qs["data_version"]

    # 1. the latest snapshot (by epoch, then end offset). Kafka loads only that one; when it cannot be opened or is
    # damaged (a CRC failure, a torn tail, no SnapshotHeader / SnapshotFooter) the node cannot load it, and the image
    # here falls back to the one before it (an older, maybe stale image: not whole, the skipped ones named in
    # snapshot_fallback); when none is intact, the newest damaged one is used as far as it is valid (not whole).
    snapshot_end = 0
    chosen = damaged = None
    skipped = []  # the snapshots newer than the one used, newest first
    for end_offset, epoch, name in reversed(snapshots):
        path = os.path.join(mdir, name)
        rp.image, rp.records_replayed, rp.kraft_version, rp.voters = Image(), 0, None, None
        res, fw = _walk_file(rp, path, 0, snapshot=True)
        if res is None and not last_try and not os.path.lexists(path):
            raise _SegmentVanished(path)  # a newer snapshot was written meanwhile, and this one deleted
        if res is not None:
            attempt = (name, end_offset, epoch, rp.image, rp.records_replayed, rp.kraft_version, rp.voters)
            if _snapshot_intact(rp, path, res, fw):
                chosen = attempt
                break
            damaged = damaged or attempt
        skipped.append(name)
    if chosen is None and damaged is not None:
        chosen = damaged
        skipped = skipped[: skipped.index(damaged[0])]
        msg = "no snapshot is intact: the facts here come from this one as far as it is valid"
        _note(rp, os.path.join(mdir, damaged[0]), msg)
        head["image_complete"] = False
    if chosen is None:
        rp.image, rp.records_replayed, rp.kraft_version, rp.voters = Image(), 0, None, None
    else:
        name, snapshot_end, epoch, rp.image, rp.records_replayed, rp.kraft_version, rp.voters = chosen
        head["snapshot"], head["snapshot_end_offset"], head["snapshot_epoch"] = name, snapshot_end, epoch
        rp.last_applied_offset = snapshot_end - 1
    head["snapshot_fallback"] = skipped
    for name in skipped:
        head["image_complete"] = False
        _note(
            rp,
            os.path.join(mdir, name),
            "the facts here come from the older snapshot %s instead and may be stale" % chosen[0]
            if chosen is not None
            else "no snapshot can be used: the facts here come from the log alone",
        )

    # 2. the log from the snapshot's end offset on; recovery stops at the first invalid batch (LogSegment.recover)
    # A segment wholly below the snapshot's end offset (the next one starts at or below it) holds nothing the image
    # needs: it is not opened (Kafka deletes such segments after a snapshot, maybe while they are read).
    log_first = segments[0][0] if segments else None
    rp.stop_at = stop_at  # a log offset: snapshot records are numbered from 0 in their own file
    for i, (base, name) in enumerate(segments):
        if i + 1 < len(segments) and segments[i + 1][0] <= snapshot_end:
            continue
        path = os.path.join(mdir, name)
        res, fw = _walk_file(rp, path, snapshot_end, snapshot=False)
        if res is None:
            if not last_try and not os.path.lexists(path):
                raise _SegmentVanished(path)
            head["log_tail_error"] = head["log_tail_error"] or "%s cannot be read" % path
            head["image_complete"] = False
            _note(
                rp,
                path,
                "the image stops at offset %d: the records from there on (%d later segment(s)) are not replayed"
                % (rp.last_applied_offset + 1 if rp.last_applied_offset is not None else 0, len(segments) - i - 1),
            )
            break
        if i == 0 and fw.first_offset is not None:
            log_first = fw.first_offset
        if res["max_leader_epoch"] is not None:
            head["log_max_epoch"] = max(head["log_max_epoch"] or 0, res["max_leader_epoch"])
        if fw.next_offset is not None:
            head["log_end_offset"] = fw.next_offset
        elif head["log_end_offset"] is None or base > head["log_end_offset"]:
            head["log_end_offset"] = base
        if res["crc_errors"]:
            head["log_crc_errors"] += res["crc_errors"]
            head["log_first_crc_error_offset"] = fw.next_offset if fw.next_offset is not None else base
            head["log_tail_error"] = "%s: %s" % (path, res["tail_error"])
        elif res["torn_tail"]:
            head["log_torn_tail"] = True
            head["log_tail_error"] = "%s: %s" % (path, res["tail_error"])
        if (res["crc_errors"] or res["torn_tail"]) and i + 1 < len(segments):
            rp.problem(
                path,
                None,
                None,
                "torn-tail" if not res["crc_errors"] else "crc",
                "%d later segment(s) not read: Kafka's recovery truncates the log here" % (len(segments) - i - 1),
            )
            break
    head["log_start_offset"] = log_first

    # 3. what is missing, or was never applied
    if segments and log_first is not None:
        if snapshots and head["snapshot"] is not None:
            gap = log_first > snapshot_end
        else:
            gap = log_first > 0
        if gap:
            head["snapshot_gap"] = True
            rp.problem(
                os.path.join(mdir, segments[0][1]),
                log_first,
                None,
                "snapshot-gap",
                "the log starts at offset %d but %s; records %d..%d are missing"
                % (
                    log_first,
                    "the newest snapshot %s ends at %d" % (head["snapshot"], snapshot_end)
                    if head["snapshot"]
                    else "there is no snapshot",
                    snapshot_end,
                    log_first - 1,
                ),
            )
    if head["snapshot_gap"] or head["log_crc_errors"] or rp.batches_cut_short:
        head["image_complete"] = False
    if rp.txn is not None:
        head["open_transaction"] = True
        t_path, t_offset, t_position = rp.txn_begin
        rp.problem(
            t_path,
            t_offset,
            t_position,
            "open-transaction",
            "a metadata transaction begun here is not ended by the log's end: its %d record(s) are not applied"
            % len(rp.txn),
        )
    img = rp.image
    head["records_replayed"] = rp.records_replayed
    head["last_applied_offset"] = rp.last_applied_offset
    head["features"] = dict(sorted(img.features.items()))
    head["metadata_version_level"] = img.features.get("metadata.version")
    head["kraft_version"] = rp.kraft_version
    head["zk_migration_state"] = img.zk_migration_state
    if rp.leader_change is not None:
        head["last_leader_change_leader_id"], head["last_leader_change_epoch"] = rp.leader_change
    if head["quorum_voters"] is None and rp.voters is not None:
        head["quorum_voters"] = rp.voters
    head["error"] = "; ".join(errors) or None
    return head, img, rp


# --------------------------------------------------------------------------------------------
# Output: the ZooKeeper snapshot's record kinds (docs/zk-snapshot-schema.md), filled from the image.
def _broker_record(b):
    protocols = dict(
        (e["Name"], SECURITY_PROTOCOLS.get(e["SecurityProtocol"], str(e["SecurityProtocol"]))) for e in b["EndPoints"]
    )
    plain = [e for e in b["EndPoints"] if e["Name"] == "PLAINTEXT"] or [
        e for e in b["EndPoints"] if e["SecurityProtocol"] == 0
    ]
    return {
        "kind": "broker",
        "broker_id": b["BrokerId"],
        "host": plain[0]["Host"] if plain else None,
        "port": plain[0]["Port"] if plain else -1,
        "endpoints": ["%s://%s:%d" % (e["Name"], _host_text(e["Host"]), e["Port"]) for e in b["EndPoints"]],
        "listener_security_protocol_map": protocols,
        "rack": b["Rack"],
        "jmx_port": None,
        "timestamp": None,
        "znode_version": None,
        "broker_epoch": b["BrokerEpoch"],
        "ephemeral_owner": None,
        "features": dict(
            (f["Name"], {"min_version": f["MinSupportedVersion"], "max_version": f["MaxSupportedVersion"]})
            for f in b["Features"]
        ),
        "fenced": bool(b["Fenced"]),
        "in_controlled_shutdown": bool(b["InControlledShutdown"]),
        "incarnation_id": b["IncarnationId"],
        "log_dirs": list(b["LogDirs"]),
        "is_migrating_zk_broker": bool(b["IsMigratingZkBroker"]),
        "error": None,
    }


def _host_text(host):
    return "[%s]" % host if ":" in host else host


def _int_config(conf, name, where):
    v = conf.get(name)
    if v is None:
        return None, None
    try:
        return int(v.strip()), None
    except ValueError:
        return None, "%s %r in %s is not an integer" % (name, v, where)


def _records(head, img, rp):
    """The output records, made one by one (a generator), in the documented order."""
    with_errors = [0]

    def out(rec):
        if rec.get("error"):
            with_errors[0] += 1
        return rec

    yield out(head)
    controller_id, controller_epoch = node_controller(head)
    yield out(
        {
            "kind": "cluster",
            "kafka_tree_found": True,
            "cluster_id": head["cluster_id"],
            "controller_id": controller_id,
            "controller_epoch": controller_epoch,
            "controller_epoch_zk_version": None,
            "controller": None,
            "topics_marked_for_deletion": [],
            "cluster_default_config": None,  # ZooKeeper only: here the broker_config record of resource ""
            "cluster_default_min_insync_replicas": None,
            "error": None,
        }
    )
    for i in sorted(img.brokers):
        yield out(_broker_record(img.brokers[i]))
    n_topics = n_states = 0
    for topic_id, t in sorted(img.topics.items(), key=lambda kv: (kv[1]["name"], kv[0])):
        name = t["name"]
        conf = dict(sorted(img.configs.get((CONFIG_TOPIC, name), {}).items()))
        min_isr, err = _int_config(conf, "min.insync.replicas", "the metadata log's ConfigRecord for topic %s" % name)
        parts = [(pid, t["partitions"][pid]) for pid in sorted(t["partitions"])]
        adding = dict((str(pid), list(p["AddingReplicas"])) for pid, p in parts if p["AddingReplicas"])
        removing = dict((str(pid), list(p["RemovingReplicas"])) for pid, p in parts if p["RemovingReplicas"])
        counts = [len(p["Replicas"]) - len([r for r in p["AddingReplicas"] if r in p["Replicas"]]) for _pid, p in parts]
        yield out(
            {
                "kind": "topic",
                "topic": name,
                "topic_id": topic_id,
                "znode_version": None,
                "partitions": dict((str(pid), list(p["Replicas"])) for pid, p in parts),
                "adding_replicas": adding,
                "removing_replicas": removing,
                "replication_factor": min(counts) if counts else None,
                "min_insync_replicas": min_isr,
                "config": conf,
                "marked_for_deletion": False,
                "error": err,
            }
        )
        n_topics += 1
        for pid, p in parts:
            yield out(
                {
                    "kind": "partition_state",
                    "topic": name,
                    "partition": pid,
                    "topic_id": topic_id,
                    "leader": p["Leader"],
                    "leader_epoch": p["LeaderEpoch"],
                    "isr": list(p["Isr"]),
                    "controller_epoch": None,
                    "leader_recovery_state": p["LeaderRecoveryState"],
                    "znode_version": None,
                    "zk_version": p["PartitionEpoch"],
                    "partition_epoch": p["PartitionEpoch"],
                    "replicas": list(p["Replicas"]),
                    "adding_replicas": list(p["AddingReplicas"]),
                    "removing_replicas": list(p["RemovingReplicas"]),
                    "directories": list(p["Directories"]),
                    "eligible_leader_replicas": list(p["EligibleLeaderReplicas"]),
                    "last_known_elr": list(p["LastKnownElr"]),
                    "error": None,
                }
            )
            n_states += 1
    broker_configs = []
    for (rtype, rname), conf in img.configs.items():
        if rtype != CONFIG_BROKER:
            continue
        broker_id, err = None, None
        if rname != "":
            try:
                broker_id = int(rname)
            except ValueError:
                err = "broker config resource name %r in the metadata log's ConfigRecord is not a broker id" % rname
        broker_configs.append(
            {
                "kind": "broker_config",
                "broker_id": broker_id,
                "resource_name": rname,
                "config": dict(sorted(conf.items())),
                "error": err,
            }
        )
    broker_configs.sort(key=lambda r: (r["broker_id"] is not None, r["broker_id"] or 0, r["resource_name"]))
    for rec in broker_configs:
        yield out(rec)
    for rec in rp.problems:
        yield out(rec)
    yield out(
        {
            "kind": "cluster_metadata_end",
            "complete": True,
            "topics": n_topics,
            "brokers": len(img.brokers),
            "partition_states": n_states,
            "broker_configs": len(broker_configs),
            "records_with_errors": with_errors[0],
            "problems": len(rp.problems),
            "problems_suppressed": rp.suppressed,
        }
    )


def metadata_position(metadata_dir):
    """Where a node's metadata log ends and whom its ``quorum-state`` follows, without replaying it (the quorum gate's
    cheap poll): the newest segment's batch headers walked (no record decoded, no CRC read), else the newest snapshot's
    end offset. One ``metadata_position`` record; ClusterMetadataError when the dir cannot be read at all."""
    taken_at_ms = int(time.time() * 1000)
    mdir, logdir, names = _listed(metadata_dir)
    out = {
        "kind": "metadata_position",
        "schema_version": SCHEMA_VERSION,
        "dir": mdir,
        "node_id": None,
        "cluster_id": None,
        "log_end_offset": None,
        "log_max_epoch": None,
        "log_torn_tail": False,
        "quorum_leader_id": None,
        "quorum_leader_epoch": None,
        "quorum_voters": None,
        "taken_at_ms": taken_at_ms,
        "error": None,
    }
    errors = []
    out["node_id"], out["cluster_id"], error = _node(logdir)
    if error:
        errors.append(error)
    try:
        qs = read_quorum_state(os.path.join(mdir, probe.QUORUM_STATE))
    except ValueError as e:
        qs = None
        errors.append(str(e))
    out["error"] = "; ".join(errors) or None
    if qs is not None:
        out["quorum_leader_id"], out["quorum_leader_epoch"] = qs["leader_id"], qs["leader_epoch"]
        out["quorum_voters"] = qs["voters"]
    segments = log_segments(names)
    snapshots = snapshot_files(names)
    if segments:
        base, name = segments[-1]
        path = os.path.join(mdir, name)
        try:
            res = probe.walk_log(path, base_offset=base)
        except (OSError, ValueError) as e:
            raise ClusterMetadataError("%s cannot be read: %s" % (path, probe._err(e) if isinstance(e, OSError) else e))
        out["log_end_offset"] = res["next_offset"] if res["next_offset"] is not None else base
        out["log_max_epoch"] = res["max_leader_epoch"]
        out["log_torn_tail"] = bool(res["torn_tail"])
    if snapshots:
        end_offset, epoch, _name = snapshots[-1]
        if out["log_end_offset"] is None or end_offset > out["log_end_offset"]:
            out["log_end_offset"] = end_offset
        if out["log_max_epoch"] is None:
            out["log_max_epoch"] = epoch
    if out["log_end_offset"] is None:
        raise ClusterMetadataError("%s holds neither a metadata snapshot (.checkpoint) nor a log segment (.log)" % mdir)
    return out


END_OF_LOG = 1 << 63  # an offset past any log's end


def metadata_records(metadata_dir, from_offset=0, to_offset=None, resume=None):
    """The metadata records of a node's log for a follower that keeps its own Image (the repair's health gates:
    repair/kraft_cluster.py), as JSON-ready dicts: a ``metadata_records`` header, one ``metadata_record`` per record
    an Image replays ({offset, name, fields}, transactions applied whole), a ``metadata_records_end``.

    Only records below ``to_offset`` (the quorum's high watermark: what a majority holds) are read: an uncommitted
    tail is not a fact. From ``from_offset`` (the follower's next offset) when this log still holds it: only the
    batches from there are decoded, from byte ``resume[1]`` of the segment whose base offset is ``resume[0]`` (the
    previous call's end record) when a batch at or before ``from_offset`` starts there. Otherwise (``from_offset``
    0, or before the log's start since a snapshot let Kafka delete segments) the image from the newest snapshot and
    the log, as the records that rebuild it (``Image.records``), with ``reset`` true: the follower starts a new
    image. The end record's ``next_offset`` and ``resume`` are the next call's ``from_offset`` and ``resume``."""
    taken_at_ms = int(time.time() * 1000)
    mdir, logdir, names = _listed(metadata_dir)
    segments = log_segments(names)
    follow = from_offset > 0 and bool(segments) and segments[0][0] <= from_offset
    stop_at = to_offset if to_offset is not None else END_OF_LOG
    head = {
        "kind": "metadata_records",
        "schema_version": SCHEMA_VERSION,
        "dir": mdir,
        "node_id": None,
        "cluster_id": None,
        "from_offset": from_offset if follow else 0,
        "to_offset": to_offset,
        "reset": not follow,
        "snapshot": None,
        "taken_at_ms": taken_at_ms,
        "error": None,
    }
    head["node_id"], head["cluster_id"], head["error"] = _node(logdir)
    if follow:
        rp = _Replay()
        rp.stop_at, rp.collect, rp.last_applied_offset = stop_at, [], from_offset - 1
        for i, (base, name) in enumerate(segments):
            if i + 1 < len(segments) and segments[i + 1][0] <= from_offset:
                continue  # wholly before from_offset
            if base >= stop_at:
                break
            path = os.path.join(mdir, name)
            start = _resume_position(path, base, from_offset, resume)
            res, _fw = _walk_file(rp, path, from_offset, snapshot=False, start=start)
            if res is None or res["crc_errors"] or (res["torn_tail"] and i + 1 < len(segments)):
                break  # a problem names it; what follows is not read (Kafka's recovery truncates there)
        records = rp.collect
        complete = not rp.problems
    else:
        h, img, rp = _replay(metadata_dir, stop_at=stop_at)
        head["snapshot"] = h["snapshot"]
        records = ((rp.last_applied_offset, n, f) for n, f in img.records())
        complete = h["image_complete"] and not h["error"]
    yield head
    n = 0
    for offset, name, fields_ in records:
        n += 1
        yield {"kind": "metadata_record", "offset": offset, "name": name, "fields": fields_}
    next_offset = (rp.last_applied_offset + 1) if rp.last_applied_offset is not None else from_offset
    yield {
        "kind": "metadata_records_end",
        "complete": True,
        "records": n,
        "next_offset": next_offset,
        "resume": _resume_after(rp.spans, next_offset),
        "image_complete": complete,
        "problems": [p["message"] for p in rp.problems],
    }


def _resume_position(path, base, from_offset, resume):
    """Where a follower's walk of the segment ``path`` (base offset ``base``) begins: byte ``resume[1]`` when the
    previous read ended in this segment and a batch starting at or before ``from_offset`` is there, else 0."""
    if not resume or resume[0] != base or not isinstance(resume[1], int) or resume[1] <= 0:
        return 0
    try:
        with open(probe._open_regular(path), "rb", buffering=0, closefd=True) as f:
            f.seek(resume[1])
            raw = f.read(probe.LOG_OVERHEAD.size)
    except (OSError, ValueError):
        return 0
    if len(raw) < probe.LOG_OVERHEAD.size:
        return 0
    batch_base, _length = probe.LOG_OVERHEAD.unpack(raw)
    return resume[1] if base <= batch_base <= from_offset else 0


def _resume_after(spans, next_offset):
    """[segment base offset, byte position] of the batch holding ``next_offset`` in the last segment walked (or
    just past its last batch), for the next ``metadata_records``; None when it is not there."""
    if not spans or not spans[1]:
        return None
    path, walked = spans
    base = int(os.path.basename(path).split(".")[0])
    for position, first, last, _size in walked:
        if first <= next_offset <= last:
            return [base, position]
    position, _first, last, size = walked[-1]
    return [base, position + size] if next_offset == last + 1 else None


def _node(logdir):
    """(node id, cluster id, error) of the ``meta.properties`` of the log dir holding a metadata dir."""
    mp = os.path.join(logdir, probe.META_PROPERTIES)
    try:
        meta = probe.parse_meta_properties(probe._read_small(mp), mp)
    except (OSError, ValueError) as e:
        return None, None, "%s cannot be read: %s" % (mp, probe._err(e)) if isinstance(e, OSError) else str(e)
    return meta["broker_id"], meta["cluster_id"], None


def log_position(header):
    """How far a node's metadata goes, from its ``cluster_metadata`` header, to choose the freshest of several nodes:
    (whole, epoch, end offset), compared as a tuple. Whole first: an image that misses records (``image_complete``
    false: a damaged newest snapshot, an older one used instead, a segment that could not be read; a snapshot gap; a
    CRC failure: recovery truncates there) only when no other can be had; then as Raft compares logs, the newest
    epoch, then the end offset (a node that holds only a snapshot: the snapshot's). -1 where nothing is known."""
    whole = header.get("image_complete") is True and not header.get("error")
    epochs = [e for e in (header.get("log_max_epoch"), header.get("snapshot_epoch")) if isinstance(e, int)]
    ends = [o for o in (header.get("log_end_offset"), header.get("snapshot_end_offset")) if isinstance(o, int)]
    return (whole, max(epochs) if epochs else -1, max(ends) if ends else -1)


def node_controller(header):
    """The active controller as one node knows it, from its ``cluster_metadata`` header: (leader id, epoch) of its
    ``quorum-state`` when that names a leader (>= 0), else of the last ``LEADER_CHANGE`` in its log; (None, None) when
    neither is known. One node's view: a ``quorum-state`` restored or edited by hand names whom it likes (kraft-ref
    §6), so a cluster's controller is ``quorum_controller``'s, not one node's."""
    leader, epoch = header.get("quorum_leader_id"), header.get("quorum_leader_epoch")
    if isinstance(leader, int) and leader >= 0:
        return leader, epoch
    if header.get("last_leader_change_leader_id") is not None:
        return header["last_leader_change_leader_id"], header.get("last_leader_change_epoch")
    return None, None


def majority_leader(views, voters):
    """Raft's one leader per epoch, from the voters' views (each (leader id or None, epoch or None)): at the newest
    epoch any view knows, the leader a majority of ``voters`` (a count) name, and that epoch; (None, epoch) when none
    has a majority there (an election going on, or views that disagree), (None, None) when no view knows an epoch.
    A minority naming another leader at that epoch does not unseat the one the majority follows."""
    known = [(leader, epoch) for leader, epoch in views if isinstance(epoch, int)]
    if not known:
        return None, None
    newest = max(epoch for _leader, epoch in known)
    named = [leader for leader, epoch in known if epoch == newest and leader is not None]
    leader = max(sorted(set(named)), key=named.count, default=None)
    return (leader if leader is not None and named.count(leader) >= voters // 2 + 1 else None), newest


def quorum_controller(headers, voters):
    """The cluster's active controller from several nodes' ``cluster_metadata`` headers (``voters``: how many voters
    the quorum has): ``majority_leader`` over each node's ``node_controller``. The same whichever node's metadata is
    the freshest (``log_position``): the audit's choice of a source moves with every NoOpRecord, this answer does
    not. (None, epoch) when no leader has a majority."""
    return majority_leader([node_controller(h) for h in headers], voters)


def format_records(records):
    """The JSON Lines text of the records: one compact object per line (the CLI and bundle() print the same bytes)."""
    encode = _COMPACT.encode
    return "".join([encode(r) + "\n" for r in records])


_COMPACT = json.JSONEncoder(separators=(",", ":"))  # json.dumps' compact form, the encoder made once


USAGE = (
    "usage: cluster_metadata.py [--max-memory-mib N] [--max-cpu-s N] [--position | --records-from N "
    "[--records-to N] [--resume BASE:POSITION]] METADATA_DIR  (a __cluster_metadata-0 dir, or a log dir holding one; "
    "--position: only where its log ends and whom its quorum-state follows; --records-from: the records a follower "
    "of the log replays, from that offset up to --records-to: metadata_records)"
)


class _OutOfCpu(Exception):
    pass


def _on_xcpu(signum, _frame):
    import signal

    signal.signal(signum, signal.SIG_IGN)  # once: the kernel sends it again every second past the soft limit
    raise _OutOfCpu()


def _limit(max_memory_mib, max_cpu_s):
    """This process's address space and CPU time capped (RLIMIT_AS, RLIMIT_CPU: never above a hard limit already
    set): on a controller the decoder must not take the host's memory or CPU, whatever the files hold. The CPU
    limit's SIGXCPU becomes _OutOfCpu, so that the decoder says why it stopped."""
    import resource
    import signal

    for which, value in (
        (resource.RLIMIT_AS, max_memory_mib and max_memory_mib << 20),
        (resource.RLIMIT_CPU, max_cpu_s),
    ):
        if value:
            _soft, hard = resource.getrlimit(which)
            resource.setrlimit(which, (value if hard == resource.RLIM_INFINITY else min(value, hard), hard))
    if max_cpu_s:
        signal.signal(signal.SIGXCPU, _on_xcpu)


def _options(argv):
    """(metadata dir, max memory MiB, max CPU s, mode) of the command line, or None when it is not a valid one.
    mode: None (the records), "position", or (from offset, to offset or None, resume or None) for --records-from."""
    limits = {"--max-memory-mib": 0, "--max-cpu-s": 0}
    offsets = {"--records-from": None, "--records-to": None}
    resume = None
    args = list(argv)
    position = False
    while args and (args[0] == "--position" or (len(args) >= 2 and args[0].startswith("--"))):
        if args[0] == "--position":
            position, args = True, args[1:]
            continue
        name, value = args[0], args[1]
        args = args[2:]
        if name == "--resume":
            base, _, pos = value.partition(":")
            if not base.isdigit() or not pos.isdigit():
                return None
            resume = [int(base), int(pos)]
        elif name in offsets and value.isdigit():
            offsets[name] = int(value)
        elif name in limits and value.isdigit() and int(value) >= 1:
            limits[name] = int(value)
        else:
            return None
    if len(args) != 1 or args[0].startswith("-"):
        return None
    if offsets["--records-from"] is None:
        if offsets["--records-to"] is not None or resume is not None:
            return None
        mode = "position" if position else None
    elif position:
        return None
    else:
        mode = (offsets["--records-from"], offsets["--records-to"], resume)
    return args[0], limits["--max-memory-mib"], limits["--max-cpu-s"], mode


def main(argv=None):
    """python3 - [--max-memory-mib N] [--max-cpu-s N] [--position | --records-from N ...] DIR: print the records
    (or only the log's position: ``metadata_position``; or a follower's records: ``metadata_records``) as JSON
    Lines; exit 0, or 2 with one error line on stderr (3: the decoder hit its memory or CPU limit)."""
    opts = _options(sys.argv[1:] if argv is None else argv)
    if opts is None:
        sys.stderr.write(USAGE + "\n")
        return 2
    path, max_memory_mib, max_cpu_s, mode = opts
    try:
        _limit(max_memory_mib, max_cpu_s)
    except (ImportError, ValueError, OSError) as e:
        sys.stderr.write("cluster-metadata: error: cannot limit the decoder's memory and CPU: %s\n" % e)
        return 2
    try:
        if mode == "position":
            records = iter([metadata_position(path)])
        elif mode is None:
            records = iter_cluster_metadata(path)
        else:
            records = metadata_records(path, *mode)
        out = getattr(sys.stdout, "buffer", None)
        while True:  # in slices of records: the text of a big cluster is never all in memory
            chunk = list(itertools.islice(records, 1000))
            if not chunk:
                break
            text = format_records(chunk)
            if out is not None:
                out.write(text.encode("utf-8"))
            else:
                sys.stdout.write(text)
        (out or sys.stdout).flush()
    except ClusterMetadataError as e:
        sys.stderr.write("cluster-metadata: error: %s\n" % e)
        return 2
    except BrokenPipeError:
        return 1
    except MemoryError:
        sys.stderr.write(
            "cluster-metadata: error: %s needs more than the decoder's %d MiB of memory (--max-memory-mib); "
            "nothing printed after that point\n" % (path, max_memory_mib)
        )
        return 3
    except _OutOfCpu:
        sys.stderr.write(
            "cluster-metadata: error: %s takes more than the decoder's %d s of CPU (--max-cpu-s); nothing printed "
            "after that point\n" % (path, max_cpu_s)
        )
        return 3
    return 0


# --------------------------------------------------------------------------------------------
# Shipping: the program sent on stdin to ``python3 - DIR`` on a controller (as audit/steps.py sends the probe).
_BUNDLE_TEMPLATE = """import sys, types
def _module(name, source):
    m = types.ModuleType(name)
    m.__file__ = "<fleet-doctor " + name + ">"
    sys.modules[name] = m
    exec(compile(source, m.__file__, "exec"), m.__dict__)
    return m
_probe = _module("probe", %r)
_pkg = types.ModuleType("fleet_doctor")  # so that "from fleet_doctor import probe" finds this probe, not another
_pkg.__path__ = []
_pkg.probe = _probe
sys.modules["fleet_doctor"] = _pkg
sys.modules["fleet_doctor.probe"] = _probe
_cm = _module("cluster_metadata", %r)
sys.exit(_cm.main(sys.argv[1:]))
"""


def _source(module_file):
    path = module_file[:-1] if module_file.endswith(".pyc") else module_file
    with open(path, "rb") as f:
        return f.read().decode("utf-8")


def bundle():
    """bytes of a self-contained Python 3.6+ program: the probe's and this module's sources registered as modules,
    then main(argv). Run as ``python3 - DIR`` with the bytes on stdin."""
    return (_BUNDLE_TEMPLATE % (_source(probe.__file__), _source(__file__))).encode("utf-8")


if __name__ == "__main__":
    sys.exit(main())
