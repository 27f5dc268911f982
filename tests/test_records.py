"""fleet_doctor.records is the one definition of the probe's record kinds: the probe prints exactly its fields (on every
corpus log dir, in metadata, deep and CRC mode), in its order, and the docs' field tables are generated from it."""

from __future__ import annotations

import io
import json
from collections import defaultdict
from typing import Any

import pytest

from fleet_doctor import records
from fleet_doctor.probe import Probe, discover_logdirs
from harness.corpus import REPO


@pytest.fixture(scope="module")
def printed(corpus) -> dict[str, list[dict[str, Any]]]:
    out = io.StringIO()
    logdirs = discover_logdirs([str(corpus)])
    for deep, crc in ((False, False), (True, False), (True, True)):
        Probe(out, deep=deep, verify_crc=crc).run(logdirs)
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in out.getvalue().splitlines():
        rec = json.loads(line)
        by_kind[rec["kind"]].append(rec)
    return by_kind


def test_every_kind_the_probe_prints_is_defined(printed) -> None:
    assert set(printed) == set(records.KINDS)


@pytest.mark.parametrize("kind", [k for k in records.KINDS if k != "file"])
def test_the_probe_prints_the_defined_fields_in_their_order(printed, kind: str) -> None:
    names = records.KINDS[kind].names
    seen: set[str] = set()
    for rec in printed[kind]:
        keys = [k for k in rec if k != "kind"]
        assert set(keys) <= set(names), (kind, set(keys) - set(names))
        assert keys == [n for n in names if n in rec], (kind, keys)
        seen |= set(keys)
    assert seen == set(names), (kind, set(names) - seen)  # the corpus shows every field


def test_file_records_hold_their_types_fields_only(printed) -> None:
    kind = records.KINDS["file"]
    seen: set[str] = set()
    for rec in printed["file"]:
        keys = set(rec) - {"kind"}
        assert keys <= set(kind.names), keys - set(kind.names)
        for name in keys:
            types = kind.field(name).file_types
            assert not types or rec["file_type"] in types, (name, rec["file_type"])
        seen |= keys
    assert seen >= set(kind.names) - {"symlink_target", "name"}


def test_staged_tables_and_detection_schemas_come_from_the_definition() -> None:
    for kind in records.STAGED:
        table = records.arrow_schema(kind.kind)
        assert table.names == [f.name for f in kind.fields if f.staged]
        read = records.spark_schema(kind.kind).fieldNames()
        assert read == [f.name for f in kind.fields if f.detect]


def test_docs_field_tables_are_generated() -> None:
    doc = (REPO / "docs" / "probe-schema.md").read_text(encoding="utf-8")
    assert records.render_doc(doc) == doc, (
        "docs/probe-schema.md is stale: run PYTHONPATH=plugins python -m fleet_doctor.records docs/probe-schema.md"
    )


def test_the_probe_holds_the_same_field_lists() -> None:
    """The probe (one stdlib file, which cannot import records.py) keeps its own field lists: they must be these."""
    from fleet_doctor import probe

    assert set(probe.RECORD_FIELDS) == set(records.KINDS) - {"file"}
    for kind, names in probe.RECORD_FIELDS.items():
        assert tuple(names) == records.KINDS[kind].names, kind
    file_kind = records.KINDS["file"]
    for file_type, names in probe.FILE_FIELDS.items():
        for name in names:
            types = file_kind.field(name).file_types
            assert not types or file_type in types, (file_type, name)
    for f in file_kind.fields:
        for file_type in f.file_types:
            assert f.name in probe.FILE_FIELDS[file_type], (file_type, f.name)


def test_a_field_table_with_an_unknown_type_or_flag_is_refused() -> None:
    assert records._kind("k", "a  int64  detect  the a\n", staged=False, doc="").names == ("a",)
    for table in (
        "a  int65  -  the a\n",
        "a  int64  colour:red  the a\n",
        "a  int64  -\n",
        "a int64 - x\na int64 - y\n",
    ):
        with pytest.raises(ValueError):
            records._kind("k", table, staged=False, doc="")
