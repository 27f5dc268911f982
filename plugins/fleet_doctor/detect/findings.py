"""What a finding is, and how a rule makes one: the finding columns, the rule's severity for each row's Kafka version
(its bands in ``fleet_doctor.rules``), and the two ways rules are written.

- A **check** (``Check``) reads one fact frame without a join: ``detect()`` evaluates all checks of a frame in one
  pass (one finding struct per check and row, the rows that fire none filtered out first), so a few dozen such rules
  cost one scan and one small plan instead of a union branch each.
- Any other rule returns a DataFrame of findings built with ``findings`` (or ``cluster_findings`` for findings
  about the cluster as a whole, which no single broker holds).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from py4j.java_gateway import JavaClass, JavaMember
from pyspark import SparkContext
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from fleet_doctor.rules import KafkaVersion, Rule, get

if TYPE_CHECKING:
    from fleet_doctor.detect.frames import Frames

FINDING_SCHEMA = T.StructType(
    [
        T.StructField(name, dtype, True)
        for name, dtype in (
            ("rule", T.StringType()),
            ("severity", T.StringType()),
            ("broker_id", T.IntegerType()),
            ("log_dir", T.StringType()),
            ("topic", T.StringType()),
            ("partition", T.IntegerType()),
            ("segment", T.LongType()),
            ("path", T.StringType()),
            ("message", T.StringType()),
            ("remediation", T.StringType()),
            ("kafka_version", T.StringType()),
        )
    ]
)
FINDING_COLUMNS = FINDING_SCHEMA.fieldNames()


# Columns built from names and literals only are reusable across DataFrames; detect() builds some of
# them dozens of times, and each costs several JVM round trips. Cached per detect() run.
_COLUMN_CACHE: dict[tuple, Column] = {}


def cached(key: tuple, build: Callable[[], Column]) -> Column:
    if key not in _COLUMN_CACHE:
        _COLUMN_CACHE[key] = build()
    return _COLUMN_CACHE[key]


def clear_column_cache() -> None:
    """Columns belong to the active session: a new detect() run starts afresh."""
    _COLUMN_CACHE.clear()


# The JVM classes PySpark's column functions reach through the gateway's JVM view, by the names it asks for them.
# py4j asks the JVM for a name at every use: ``F.col("x")`` is three round trips (the class by name, its member, the
# call), and a short name is looked up through each of the view's star imports in turn, each miss a search of
# Spark's 277 jars. A detection makes ~13,000 round trips, ~3,700 of them these lookups (measured on a corpus
# sample).
PINNED_CLASSES = {
    "functions": "org.apache.spark.sql.functions",
    "PythonUtils": "org.apache.spark.api.python.PythonUtils",
    "PythonSQLUtils": "org.apache.spark.sql.api.python.PythonSQLUtils",
}


class _PinnedClass(JavaClass):
    """A JVM class whose static methods are looked up once: a method found is kept (a field, read each time)."""

    def __getattr__(self, name: str) -> Any:
        member = super().__getattr__(name)
        if isinstance(member, JavaMember):
            self.__dict__[name] = member
        return member


def pin_jvm_classes(sc: SparkContext) -> None:
    """Pin ``PINNED_CLASSES`` on ``sc``'s JVM view, under both of their names (once per gateway): later lookups of
    them, and of their methods, are answered in Python."""
    jvm, client = sc._jvm, sc._gateway._gateway_client
    for short, fqn in PINNED_CLASSES.items():
        if not isinstance(jvm.__dict__.get(fqn), _PinnedClass):
            jvm.__dict__[short] = jvm.__dict__[fqn] = _PinnedClass(fqn, client)


def severity(rule: Rule, version_num_col: Column) -> Column:
    """The rule's severity for each row's Kafka version (unknown version: the worst band)."""
    return cached(("severity", rule.id, str(version_num_col)), lambda: _severity(rule, version_num_col))


def _severity(rule: Rule, version_num_col: Column) -> Column:
    worst = max(b.severity for b in rule.bands).value
    expr = None
    for band in sorted(rule.bands, key=lambda b: b.since, reverse=True):
        cond = version_num_col >= band.since.number
        expr = F.when(cond, band.severity.value) if expr is None else expr.when(cond, band.severity.value)
    assert expr is not None
    return F.when(version_num_col.isNull(), worst).otherwise(expr.otherwise(rule.bands[0].severity.value))


def applies(rule: Rule, version_num_col: Column) -> Column:
    cond = version_num_col >= rule.applies_from.number
    if rule.applies_until is not None:
        cond = cond & (version_num_col < rule.applies_until.number)
    return version_num_col.isNull() | cond


def at_least(version: str) -> Column:
    """The row's broker runs ``version`` or newer (unknown version: assumed so)."""
    return F.coalesce(F.col("kafka_version_num") >= KafkaVersion.parse(version).number, F.lit(True))


def _finding_columns(
    rule: Rule,
    vcol: Column,
    kafka_version: Column,
    *,
    path: Column,
    message: Column,
    broker_id: Column | None,
    log_dir: Column | None,
    topic: Column | None,
    partition: Column | None,
    segment: Column | None,
    severity_override: Column | None = None,
) -> list[Column]:
    """The finding's columns, in FINDING_COLUMNS order; a None part takes the fact row's own column."""
    sev = severity(rule, vcol)
    return [
        F.lit(rule.id).alias("rule"),
        (sev if severity_override is None else F.coalesce(severity_override, sev)).alias("severity"),
        (broker_id if broker_id is not None else F.col("broker_id")).cast("int").alias("broker_id"),
        (log_dir if log_dir is not None else F.col("logdir")).cast("string").alias("log_dir"),
        (topic if topic is not None else F.col("topic")).cast("string").alias("topic"),
        (partition if partition is not None else F.col("partition")).cast("int").alias("partition"),
        (segment if segment is not None else F.lit(None)).cast("long").alias("segment"),
        path.cast("string").alias("path"),
        message.cast("string").alias("message"),
        F.lit(rule.remediation.value).alias("remediation"),
        kafka_version.cast("string").alias("kafka_version"),
    ]


def findings(
    df: DataFrame,
    rule_id: str,
    message: Column,
    *,
    path: Column,
    segment: Column | None = None,
    topic: Column | None = None,
    partition: Column | None = None,
    log_dir: Column | None = None,
    broker_id: Column | None = None,
    severity: Column | None = None,
) -> DataFrame:
    """The findings of ``rule_id`` for the rows of ``df`` (those whose Kafka version the rule applies to);
    ``severity``, where not null, overrides the rule's version band (a rule whose severity depends on the case)."""
    rule = get(rule_id)
    vcol = F.col("kafka_version_num") if "kafka_version_num" in df.columns else F.lit(None).cast("long")
    kver = F.col("kafka_version") if "kafka_version" in df.columns else F.lit(None).cast("string")
    return df.where(applies(rule, vcol)).select(
        *_finding_columns(
            rule,
            vcol,
            kver,
            path=path,
            message=message,
            broker_id=broker_id,
            log_dir=log_dir,
            topic=topic,
            partition=partition,
            segment=segment,
            severity_override=severity,
        )
    )


def cluster_findings(
    df: DataFrame,
    rule_id: str,
    message: Column,
    *,
    path: Column,
    per_partition: bool = False,
    severity: Column | None = None,
) -> DataFrame:
    """Findings about the cluster (a topic, or with ``per_partition`` one of its partitions): no broker or log dir.
    ``df`` carries the fleet's Kafka version (``Frames.fleet_tagged``); ``severity`` as for ``findings``."""
    partition = None if per_partition else F.lit(None)
    return findings(
        df,
        rule_id,
        message,
        path=path,
        broker_id=F.lit(None),
        log_dir=F.lit(None),
        partition=partition,
        severity=severity,
    )


@dataclass(frozen=True)
class Check:
    on: str  # the fact frame: "segments", "partitions", "files" or "logdirs"
    rule_id: str
    cond: Column
    message: Column
    path: Column
    segment: Column | None = None
    topic: Column | None = None
    partition: Column | None = None
    severity: Column | None = None  # overrides the rule's version band where it is not null


def _finding_struct(c: Check) -> Column:
    rule = get(c.rule_id)
    vcol = F.col("kafka_version_num")  # every fact frame carries its broker's version
    columns = _finding_columns(
        rule,
        vcol,
        F.col("kafka_version"),
        path=c.path,
        message=c.message,
        broker_id=None,
        log_dir=None,
        topic=c.topic,
        partition=c.partition,
        segment=c.segment,
        severity_override=c.severity,
    )
    return F.when(applies(rule, vcol) & c.cond, F.struct(*columns))


def run_checks(df: DataFrame, checks: list[Check]) -> DataFrame:
    """The findings of ``checks`` over one fact frame, in one pass."""
    # the rows that fire any check are found first by a plain (code-generated) filter; only those few
    # build the array of finding structs, whose null-filtering lambda Spark evaluates row by row
    hit = None
    for c in checks:
        cond = F.coalesce(applies(get(c.rule_id), F.col("kafka_version_num")) & c.cond, F.lit(False))
        hit = cond if hit is None else hit | cond
    found = F.filter(F.array(*[_finding_struct(c) for c in checks]), lambda x: x.isNotNull())
    return df.where(hit).select(F.explode(found).alias("f")).select("f.*")


Detector = Callable[["Frames"], "DataFrame | list[Check] | list[Check | DataFrame]"]
DETECTORS: dict[str, Detector] = {}  # rule id -> the function that finds it (fleet_doctor.detect's modules)
EMITTED_BY: dict[str, str] = {}  # rule id -> the rule whose detector also emits its findings


def detector(rule_id: str, *also_emits: str) -> Callable[[Detector], Detector]:
    """Register the decorated function as the detector of ``rule_id`` (and of the rules in ``also_emits``, whose
    findings it returns too). Every id must be in the registry (fleet_doctor.rules)."""

    def register(fn: Detector) -> Detector:
        for rid in (rule_id, *also_emits):
            get(rid)
            assert rid not in DETECTORS and rid not in EMITTED_BY, f"{rid} has two detectors"
        DETECTORS[rule_id] = fn
        EMITTED_BY.update(dict.fromkeys(also_emits, rule_id))
        return fn

    return register


def union_all(parts: list[DataFrame]) -> DataFrame:
    """Union of finding frames (all shaped by ``findings``, so by position), as a balanced tree:
    a chain of ~40 unions re-analyzes the growing plan at every step."""
    for p in parts:
        assert p.columns == FINDING_COLUMNS, p.columns
    while len(parts) > 1:
        parts = [parts[i].union(parts[i + 1]) if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
    return parts[0]
