"""Repeated findings said once. A broker killed with ``kill -9`` leaves dozens of ``index-untrimmed`` findings that
differ only in their file; people read them as one thing: one group per (broker, rule, cause), with a count and
the files behind it. The audit report, the Kafka fleet view in Airflow and the repair's approval text group with
this module; the findings themselves (JSON, the store) stay one row per file.

The cause is a finding's message with what varies from one finding of the same kind to the next taken out: its
own path and log dir, any other path, the topic's name, topic IDs, numbers, and which of a segment's two
indexes (offset or time) it is. Two findings of one rule on one
broker share a cause when their messages say the same thing about different files.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fleet_doctor.rules import severity_rank

_TOPIC_ID = re.compile(r"(?<![\w-])[A-Za-z0-9_-]{22}(?![\w-])")  # Kafka's Uuid in base64url, no padding
_PATH = re.compile(r"(?:\$\w+|[a-z]+:)?/[^\s,;:()'\"]*")  # /a/b, $FLEET/a/b, zk:/brokers/..., kraft:/topics/...
_NUMBER = re.compile(r"\d+")
_INDEX_KIND = re.compile(r"\b(?:time)?index\b")  # an offset index and its time index: one cause


def cause_of(finding: Mapping[str, Any]) -> str:
    """The message of ``finding`` with its specifics (paths, topic, topic IDs, numbers) replaced by placeholders."""
    text = str(finding.get("message") or "")
    for own in (finding.get("path"), finding.get("log_dir")):
        if own:
            text = text.replace(str(own), "<path>")
    topic = finding.get("topic")
    if topic:
        text = re.sub(rf"(?<![\w.-]){re.escape(str(topic))}(?:-\d+)?(?![\w.-])", "<topic>", text)
    text = _TOPIC_ID.sub("<topic-id>", text)
    text = _PATH.sub("<path>", text)
    text = _INDEX_KIND.sub("index", text)
    return _NUMBER.sub("N", text)


@dataclass(frozen=True)
class FindingGroup:
    """Findings of one rule on one broker (None: the cluster's own) that share a cause, worst first."""

    broker_id: int | None
    rule: str
    cause: str
    findings: tuple[dict[str, Any], ...]

    @property
    def count(self) -> int:
        return len(self.findings)

    @property
    def severity(self) -> str:
        """The worst severity among the group's findings (a rule's severity can depend on the Kafka version)."""
        return min((str(f["severity"]) for f in self.findings), key=severity_rank)

    @property
    def example(self) -> str:
        """One finding's message, as the detector wrote it (the first by path)."""
        return str(self.findings[0].get("message") or "")

    @property
    def paths(self) -> list[str]:
        return [str(f.get("path") or "") for f in self.findings]

    @property
    def topics(self) -> list[str]:
        return sorted({str(f["topic"]) for f in self.findings if f.get("topic") is not None})

    def topics_text(self, limit: int = 3) -> str:
        """The group's topics for a row: the first ``limit``, then how many more (plain text: escape it)."""
        topics = self.topics
        more = f" and {len(topics) - limit} more" if len(topics) > limit else ""
        return ", ".join(topics[:limit]) + more

    @property
    def partitions(self) -> int:
        """How many distinct partitions the group's findings are about."""
        return len({(f.get("topic"), f.get("partition")) for f in self.findings if f.get("partition") is not None})

    @property
    def statuses(self) -> dict[str, int]:
        """Findings per history status (new, persisting, unverified, resolved), when the rows carry one."""
        return dict(Counter(str(f["status"]) for f in self.findings if f.get("status")))

    @property
    def remediation(self) -> str | None:
        return self.findings[0].get("remediation")


def _broker_order(broker_id: int | None) -> tuple[int, int]:
    return (1, 0) if broker_id is None else (0, broker_id)


def group_findings(findings: Iterable[Mapping[str, Any]]) -> list[FindingGroup]:
    """The findings grouped by (broker, rule, cause): the worst groups first, then by broker (the cluster's own
    last), rule and cause; each group's findings in path order."""
    by_key: dict[tuple[int | None, str, str], list[dict[str, Any]]] = {}
    for f in findings:
        by_key.setdefault((f.get("broker_id"), str(f["rule"]), cause_of(f)), []).append(dict(f))
    groups = [
        FindingGroup(
            broker,
            rule,
            cause,
            tuple(sorted(rows, key=lambda r: (str(r.get("path") or ""), str(r.get("message") or "")))),
        )
        for (broker, rule, cause), rows in by_key.items()
    ]
    return sorted(groups, key=lambda g: (severity_rank(g.severity), _broker_order(g.broker_id), g.rule, g.cause))
