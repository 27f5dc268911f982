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
"""

import base64
import struct

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
SCALAR_TYPES = {
    "int8": struct.Struct(">b"),
    "int16": struct.Struct(">h"),
    "int32": struct.Struct(">i"),
    "int64": struct.Struct(">q"),
    "uint16": struct.Struct(">H"),
    "float64": struct.Struct(">d"),
}
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


def field(name, type_, versions="0+", nullable=None, tag=None, default=None, fields=None, struct_name=None):
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
        "struct": struct_name,
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


def is_struct_type(type_):
    """A struct type name (capitalised, as in Kafka's schemas), array or not."""
    t = element_type(type_) or type_
    return t not in TYPES


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


def uuid_text(raw):
    """Kafka's Uuid.toString(): url-safe base64 of the 16 bytes, no padding."""
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


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
        n = r.uvarint(f["name"]) - 1
        if n < 0:
            if in_range(f["nullable_versions"], version):
                return None
            raise DecodeError("non-nullable field %s was serialized as null" % f["name"])
        if n > r.remaining():  # every element takes at least one byte: Kafka's own allocation guard
            raise DecodeError(
                "Tried to allocate a collection of size %d, but there are only %d bytes remaining (field %s)"
                % (n, r.remaining(), f["name"])
            )
        if et in TYPES:
            return [_read_value(f, et, r, version) for _ in range(n)]
        return [_read_struct(f["fields"], r, version) for _ in range(n)]
    return _read_struct(f["fields"], r, version)  # a nested struct


def _read_struct(fields_, r, version, flexible=True):
    """A struct's fields in order, then (flexible versions) its tagged section. Returns {field name: value}."""
    out = {}
    tagged = {}
    for f in fields_:
        if not in_range(f["versions"], version):
            out[f["name"]] = field_default(f, version)
        elif f["tag"] is not None:
            out[f["name"]] = field_default(f, version)
            tagged[f["tag"]] = f
        else:
            out[f["name"]] = _read_value(f, f["type"], r, version)
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
    # the value's first field is its own version; read at version 0 and leave newer fields' bytes unread (exact
    # False) only where Kafka's reader would take a newer version: LeaderChangeMessage v1
    body = decode_message(schema, value, CONTROL_RECORD_VERSION)
    return ctype, schema["name"], body
