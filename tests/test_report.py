"""The HTML reports (the audit's, and ``fleet-doctor scan --format html``) list findings one row per group (broker,
rule, cause) with the files behind a <details> disclosure: a broker killed with kill -9 is one index-untrimmed row
with its 40 files, not 40 rows. Read back with the standard library's HTML parser; everything escaped."""

from __future__ import annotations

import html
import io
import re
from html.parser import HTMLParser
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fleet_doctor.audit.report import render_audit_html, render_html
from fleet_doctor.audit.summary import RunSummary

HOSTILE = "/data/kafka/<script>alert(1)</script>-0/00000000000000000000.index"


def killed(broker: int = 2, partitions: int = 20) -> list[dict[str, Any]]:
    """What kill -9 of a broker under load leaves: the active segment's offset and time index of each partition
    still preallocated (the messages as the detector writes them)."""
    rows = []
    for p in range(partitions):
        for ext, n in (("index", 13 + p), ("timeindex", 7 + p)):
            path = f"/data/kafka/payments-{p}/00000000000000000000.{ext}"
            rows.append(
                {
                    "broker_id": broker,
                    "rule": "index-untrimmed",
                    "severity": "warning",
                    "remediation": "quarantine-index",
                    "topic": "payments",
                    "partition": p,
                    "segment": 0,
                    "path": path,
                    "log_dir": "/data/kafka",
                    "message": f"{path}: index holds {n} real entries and a preallocated zero tail of 1310707 "
                    "entries (10485760 bytes): not trimmed by a clean close",
                    "status": "new" if p % 2 else "persisting",
                }
            )
    return rows


def drift() -> list[dict[str, Any]]:
    return [
        {
            "broker_id": 1,
            "rule": "topic-id-mismatch",
            "severity": "critical",
            "remediation": "remove-topic-id-files",
            "topic": "<b>t</b>",
            "partition": 0,
            "path": HOSTILE,
            "message": f"{HOSTILE}: topic ID AAAAAAAAAAAAAAAAAAAAAA differs from ZooKeeper's",
            "status": "new",
        },
        {
            "broker_id": 3,
            "rule": "index-untrimmed",
            "severity": "warning",
            "topic": "payments",
            "partition": 1,
            "segment": 0,
            "path": "/data/kafka/payments-1/00000000000000000000.index",
            "message": "/data/kafka/payments-1/00000000000000000000.index: index holds 2 real entries and a "
            "preallocated zero tail of 1310707 entries (10485760 bytes): not trimmed by a clean close",
            "status": "resolved",
        },
    ]


class Tables(HTMLParser):
    """The group rows of the findings tables: per row its cells' text, and the items of its disclosure."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, Any]] = []
        self.tags: list[str] = []
        self.in_groups = False
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "script":
            self.scripts += 1
        if tag == "table":
            self.in_groups = ("class", "groups") in attrs
        elif self.in_groups and tag == "tr":
            self.rows.append({"cells": [], "items": [], "summary": ""})
        elif self.in_groups and tag == "td" and self.rows:
            self.rows[-1]["cells"].append("")
        elif self.in_groups and tag == "li":
            self.rows[-1]["items"].append("")

    def handle_endtag(self, tag: str) -> None:
        while self.tags and self.tags.pop() != tag:
            pass

    def handle_data(self, data: str) -> None:
        if not (self.in_groups and self.rows and self.rows[-1]["cells"]):
            return
        row = self.rows[-1]
        if "li" in self.tags:
            row["items"][-1] += data
        elif "summary" in self.tags:
            row["summary"] += data
        else:
            row["cells"][-1] += data


def parsed(page: str) -> Tables:
    t = Tables()
    t.feed(page)
    t.rows = [r for r in t.rows if r["cells"]]  # the header rows have none
    return t


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by_sev = {s: sum(r["severity"] == s for r in rows) for s in ("critical", "warning", "info")}
    by_status = {s: sum(r["status"] == s for r in rows) for s in ("new", "persisting", "resolved", "unverified")}
    return {
        "cluster": "lab",
        "audit_run": "run_2",
        "by_severity": by_sev,
        "by_status": by_status,
        "not_audited": [],
    }


def test_a_killed_broker_is_one_row_with_its_files_behind_a_disclosure() -> None:
    rows = killed() + drift()
    out = io.StringIO()
    render_audit_html(rows, RunSummary.from_dict(summary(rows)), [], out)
    page = out.getvalue()
    t = parsed(page)
    assert t.scripts == 0 and "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b>t</b>" not in page
    active, resolved = t.rows[:2], t.rows[2:]
    # worst first: broker 1's critical drift, then broker 2's 40 untrimmed indexes as one row
    (sev, broker, rule, count, where, example, statuses, _files) = active[1]["cells"]
    assert (sev, broker, rule, count) == ("warning", "2", "index-untrimmed", "40")
    assert where == "payments (20 partition(s))"
    assert example.startswith("/data/kafka/payments-0/00000000000000000000.index: index holds 13 real entries")
    assert statuses == "20 new, 20 persisting" and active[1]["summary"] == "40 file(s)"
    items = active[1]["items"]
    assert len(items) == 40 and len(set(items)) == 40
    assert items[0].startswith("persisting /data/kafka/payments-0/00000000000000000000.index: index holds 13")
    assert active[0]["cells"][:4] == ["critical", "1", "topic-id-mismatch", "1"]
    assert active[0]["items"] == [f"new {HOSTILE}: topic ID AAAAAAAAAAAAAAAAAAAAAA differs from ZooKeeper's"]
    assert active[0]["cells"][4] == "<b>t</b> (1 partition(s))"  # the topic's name, as text
    # the resolved finding of broker 3: its own table, not mixed into broker 2's group
    assert [r["cells"][:4] for r in resolved] == [["warning", "3", "index-untrimmed", "1"]]
    assert resolved[0]["cells"][6] == "1 resolved"
    assert "42 finding(s)" not in page and "41 finding(s) in 2 group(s)" in page


def test_the_scan_page_groups_too() -> None:
    rows = [{k: v for k, v in r.items() if k != "status"} for r in killed(broker=5, partitions=3) + drift()[:1]]
    out = io.StringIO()
    render_html(rows, {}, out, "scan of <x>")
    t = parsed(out.getvalue())
    assert "<title>scan of &lt;x&gt;</title>" in out.getvalue()
    assert [r["cells"][:4] for r in t.rows] == [
        ["critical", "1", "topic-id-mismatch", "1"],
        ["warning", "5", "index-untrimmed", "6"],
    ]
    assert len(t.rows[1]["cells"]) == 7  # no status column on a scan
    assert len(t.rows[1]["items"]) == 6 and t.rows[1]["items"][0].startswith("/data/kafka/payments-0/")


def test_the_audit_report_links_into_airflow_when_it_knows_where_airflow_is() -> None:
    rows = killed(broker=2, partitions=2) + drift()
    bare = io.StringIO()
    render_audit_html(rows, RunSummary.from_dict(summary(rows)), [], bare)
    assert "data-airflow-link" not in bare.getvalue() and "Repair" not in bare.getvalue()

    out = io.StringIO()
    render_audit_html(
        rows, RunSummary.from_dict(summary(rows)), [], out, airflow_url="https://airflow.example.com/base"
    )
    page = out.getvalue()
    links = re.findall(r"<a href='([^']*)' data-airflow-link( data-testid='repair-link')?>([^<]*)</a>", page)
    top = {text: href for href, tid, text in links if not tid}
    assert top == {
        "Kafka fleet view": "https://airflow.example.com/base/plugin/kafka-fleet/kafka-fleet/clusters/lab/",
        "Pending approvals (Required Actions)": "https://airflow.example.com/base/required_actions",
    }
    repairs = [html.unescape(href) for href, tid, _ in links if tid]
    assert len(repairs) == 2  # the drift and the untrimmed indexes: both repairable groups, one link each
    prefix = "https://airflow.example.com/base/plugin/kafka-fleet/kafka-fleet/clusters/lab/repair?"
    assert all(h.startswith(prefix) for h in repairs)
    assert sorted(sorted(parse_qs(urlsplit(h).query).items()) for h in repairs) == [
        [("broker", ["1"]), ("rule", ["topic-id-mismatch"]), ("topic", ["<b>t</b>"])],
        [("broker", ["2"]), ("rule", ["index-untrimmed"]), ("topic", ["payments"])],
    ]
    assert "<b>t</b>" not in page  # the hostile topic only escaped, in text and in the link's query
    t = parsed(page)
    assert t.scripts == 0 and all(r["cells"][-1].startswith("Repair…") for r in t.rows[:2])


def test_a_repair_link_never_ticks_include_internal() -> None:
    """A group on __consumer_offsets links to the repair page with the topic named but include_internal left to a
    person (PRODUCT.md: internal topics are repaired only when explicitly included)."""
    rows = [{**drift()[0], "broker_id": 3, "topic": "__consumer_offsets", "partition": p} for p in (4, 9)]
    out = io.StringIO()
    render_audit_html(rows, RunSummary.from_dict(summary(rows)), [], out, airflow_url="https://airflow.example.com")
    (href,) = re.findall(r"<a href='([^']*)' data-airflow-link data-testid='repair-link'>", out.getvalue())
    assert sorted(parse_qs(urlsplit(html.unescape(href)).query).items()) == [
        ("broker", ["3"]),
        ("rule", ["topic-id-mismatch"]),
        ("topic", ["__consumer_offsets"]),
    ]
