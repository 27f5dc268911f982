"""The rule registry: ids match the public catalogue, docs are generated, versions behave."""

from __future__ import annotations

import re

import pytest

from fleet_doctor.rules import RULES, RULES_BY_ID, KafkaVersion, Severity, get, markdown
from harness.corpus import REPO

CATALOGUE = REPO.parent / "shared" / "docs" / "RULES.md"


def catalogue_ids() -> set[str]:
    text = CATALOGUE.read_text()
    ids = set(re.findall(r"^\| `([a-z0-9-]+)`", text, re.M))
    # "`under-replicated` / `offline-partition`" share one row
    ids |= set(re.findall(r"^\| `[a-z-]+` / `([a-z-]+)`", text, re.M))
    return ids


def test_every_catalogue_rule_is_registered_once() -> None:
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids))
    assert catalogue_ids() <= set(ids), catalogue_ids() - set(ids)


def test_docs_rules_md_is_generated_from_the_registry() -> None:
    assert (REPO / "docs" / "rules.md").read_text() == markdown(), (
        "docs/rules.md is stale: run PYTHONPATH=plugins python -m fleet_doctor.rules > docs/rules.md"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0.8.2.2", (0, 8, 2)), ("0.10.1.0", (0, 10, 1)), ("2.8", (2, 8, 0)), ("3.9.0-SNAPSHOT", (3, 9, 0))],
)
def test_kafka_version_parse(text: str, expected: tuple[int, int, int]) -> None:
    ver = KafkaVersion.parse(text)
    assert (ver.major, ver.minor, ver.patch) == expected


def test_kafka_version_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="not a Kafka version"):
        KafkaVersion.parse("latest")


def test_untrimmed_index_severity_follows_kafka_versions() -> None:
    rule = get("index-untrimmed")
    sev = {ver: rule.severity_for(KafkaVersion.parse(ver)) for ver in ("0.8.2", "1.0.0", "2.2.1", "3.6.0")}
    assert sev == {
        "0.8.2": Severity.CRITICAL,
        "1.0.0": Severity.WARNING,
        "2.2.1": Severity.WARNING,
        "3.6.0": Severity.CRITICAL,
    }
    assert rule.severity_for(None) is Severity.CRITICAL  # unknown version: the worst case


def test_topic_id_rules_apply_from_2_8() -> None:
    for rid in ("topic-id-mismatch", "topic-id-split", "topic-id-missing-in-zk", "partition-metadata-malformed"):
        assert not RULES_BY_ID[rid].applies_to(KafkaVersion.parse("2.7.1"))
        assert RULES_BY_ID[rid].applies_to(KafkaVersion.parse("2.8.0"))


def test_unknown_rule_id_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="index-untrimmed"):
        get("no-such-rule")


def test_remediation_is_what_the_catalogue_maps_each_rule_to() -> None:
    """../shared/docs/RULES.md, "Remediation each rule maps to": the repair planner acts on exactly these."""
    from fleet_doctor.rules import Remediation, rule_ids_with

    assert rule_ids_with(Remediation.QUARANTINE_INDEX) == {
        "index-untrimmed",
        "index-last-offset",
        "index-size",
        "index-not-monotonic",
        "index-beyond-log",
        "timeindex-last-timestamp",
    }
    assert rule_ids_with(Remediation.REMOVE_TOPIC_ID_FILES) == {"topic-id-mismatch"}
    assert rule_ids_with(Remediation.RESTORE_ZK_TOPIC_ID) == {"topic-id-missing-in-zk"}
    # "unless a later issue says otherwise": issue 30, a -stray replica proven stray on KRaft
    assert rule_ids_with(Remediation.QUARANTINE_STRAY_REPLICA) == {"stray-dir"}
    # and issue 30's cleaner and deletion leftovers (.deleted, .cleaned; a .swap stays report only, in the plan)
    assert rule_ids_with(Remediation.QUARANTINE_LEFTOVER) == {"segment-leftover"}
    acted_on = {r.id for r in RULES if r.remediation is not Remediation.REPORT_ONLY}
    assert len(acted_on) == 10 and len(rule_ids_with(Remediation.REPORT_ONLY)) == len(RULES) - 10


def test_severity_order_is_defined_once() -> None:
    from fleet_doctor.rules import SEVERITY_ORDER, severity_rank

    assert SEVERITY_ORDER == ("critical", "warning", "info")
    assert sorted(Severity, reverse=True) == [Severity(s) for s in SEVERITY_ORDER]
    assert [severity_rank(s) for s in (*SEVERITY_ORDER, "bogus")] == [0, 1, 2, 3]


def test_a_catalogue_with_an_unknown_key_or_a_second_definition_is_refused() -> None:
    from fleet_doctor.rules import _catalogue

    rule = "x-rule: X\n    scope segment, needs metadata, remediation report-only{extra}\n    condition c\n    why w\n"
    rule += "    0.8.0+      info\n"
    assert _catalogue(rule.format(extra=""))[0].id == "x-rule"
    with pytest.raises(ValueError, match="unknown key"):
        _catalogue(rule.format(extra=", colour red"))
    with pytest.raises(ValueError, match="second definition"):
        _catalogue(rule.format(extra="") + "\n" + rule.format(extra=""))
