"""The Kafka fleet view (fleet_doctor.console, plugins/kafka_fleet_plugin.py) on stores written by the real
publisher (fleet_doctor.audit.history.publish) from the corpus fleet's recorded findings, local and on the S3 test
server, through FastAPI's TestClient; and once against a live Airflow api-server: the plugin listed, its nav entry
valid, Airflow's auth enforced, and in Chromium the iframe's links into Airflow and the pre-filled repair trigger."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from fastapi import Depends, HTTPException
from fastapi.testclient import TestClient

from fleet_doctor import layout
from fleet_doctor.airflow_links import RepairScope, approval_dags, cluster_page, in_airflow, repair_dag
from fleet_doctor.audit import history
from fleet_doctor.console import render
from fleet_doctor.console.app import create_app
from fleet_doctor.finding_groups import group_findings
from fleet_doctor.repair.planner import FleetFacts, build_plan
from fleet_doctor.settings import Settings
from harness import inventories
from harness.dags import ZK_CLUSTER, dag, dag_bag, form
from harness.findings import finding
from harness.live_stack import LAB_CLUSTER, REPAIR, scrape

DATA = Path(__file__).parent / "data" / "detection-findings"
HOSTILE_TOPIC = "<img src=x onerror=alert(1)>"
HOSTILE_MESSAGE = "</script><script>alert('m')</script> \"quoted\" 'single' тема ✓"
HOSTILE_CLUSTER = "eu\"'<marquee>1</marquee>"  # as a summary may name it (an inventory's name cannot be)
CLUSTER = "corpus"
PAGE = f"/{cluster_page(CLUSTER)}"  # the cluster's page: /clusters/corpus/


# ---- reading the pages
class Page(HTMLParser):
    """Elements of a rendered page: every tag with its attributes (entities decoded), the scripts' nonces and the
    text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def find(self, testid: str) -> list[dict[str, str]]:
        return [a for _, a in self.tags if a.get("data-testid") == testid]

    def named(self, tag: str) -> list[dict[str, str]]:
        return [a for t, a in self.tags if t == tag]


def fleet_settings(tmp_path: Path, data: str = "data", **env: str) -> Settings:
    """The settings of cluster ``corpus``, the one cluster of an inventory file, its data root ``tmp_path/data``
    (or ``env``'s)."""
    inv = inventories.write(tmp_path / "inventory.json", inventories.inventory(CLUSTER, brokers=3))
    base = {"FLEET_DOCTOR_INVENTORY": str(inv), "FLEET_DOCTOR_DATA": str(tmp_path / data), **env}
    return Settings.from_env(base).for_cluster(CLUSTER)


def client(settings: Settings) -> TestClient:
    """The view's app without Airflow's auth (the live test below checks that)."""
    return TestClient(create_app(lambda: settings))


def page(c: TestClient, path: str = PAGE) -> Page:
    r = c.get(path)
    assert r.status_code == 200, r.text[:500]
    nonce = re.search(r"script-src 'nonce-([^']+)'", r.headers["content-security-policy"])
    assert nonce, r.headers["content-security-policy"]
    p = Page(r.text)
    scripts = p.named("script")
    assert scripts and all(s.get("nonce") == nonce.group(1) for s in scripts), scripts  # only the page's own
    return p


def publish(settings: Settings, run: str, rows: list[dict[str, Any]], audited: list[int], **facts: Any) -> dict:
    key = layout.staging(run).key
    settings.store.write_jsonl(f"{key}/findings.jsonl", rows)
    settings.store.write_text(f"{key}/summary.json", json.dumps({"rules_skipped": {}}))
    discovered = {"cluster": facts.pop("cluster", CLUSTER), "only_in_inventory": [], "only_in_zookeeper": []}
    return history.publish(settings, run, discovered, {"audited": audited, "not_audited": [], **facts})


@pytest.fixture(scope="module")
def corpus_findings() -> list[dict[str, Any]]:
    """The corpus fleet's recorded findings (every rule firing on real Kafka files and their mutations)."""
    with gzip.open(DATA / "mutated.jsonl.gz", "rt") as f:
        return [r for r in map(json.loads, f) if "rule" in r]


@pytest.fixture(params=["local", "s3"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    if request.param == "local":
        return fleet_settings(tmp_path)
    s3 = request.getfixturevalue("s3")
    return fleet_settings(
        tmp_path,
        FLEET_DOCTOR_DATA=s3.url(f"console/{request.node.name}"),
        AWS_ACCESS_KEY_ID="fleet",
        AWS_SECRET_ACCESS_KEY="doctor",
        AWS_REGION="us-east-1",
        FLEET_DOCTOR_S3_ENDPOINT=s3.endpoint,
    )


def _key(row: dict[str, Any]) -> tuple[str, str]:
    return ("cluster" if row.get("broker_id") is None else str(row["broker_id"]), str(row["rule"]))


def three_runs(settings: Settings, found: list[dict[str, Any]], n: int = 3) -> list[dict[str, Any]]:
    """run 1: every corpus finding; run 2: broker 1's gone (resolved) and one new; run 3: broker 2 not reached.
    The first ``n`` of them."""
    brokers = sorted({f["broker_id"] for f in found if f.get("broker_id") is not None})
    extra = {**finding("index-untrimmed", 3, "/k/t-0/00000000000000000007.index", "warning")}
    extra["remediation"] = "quarantine-index"
    second = [f for f in found if f.get("broker_id") != 1] + [extra]
    runs = [
        ("scheduled__2026-11-01T02:00:00+00:00", found, brokers, []),
        ("scheduled__2026-11-02T02:00:00+00:00", second, brokers, []),
        ("scheduled__2026-11-03T02:00:00+00:00", [f for f in second if f.get("broker_id") != 2], brokers, [2]),
    ]
    return [
        publish(settings, run, rows, [b for b in audited if b not in missing], not_audited=missing)
        for run, rows, audited, missing in runs[:n]
    ]


# ---- the fleet page
def test_the_page_shows_the_published_findings_grouped_with_repair_links(
    settings: Settings, corpus_findings: list[dict[str, Any]]
) -> None:
    summaries = three_runs(settings, corpus_findings)
    latest = summaries[-1]
    rows = settings.store.read_jsonl(layout.history_findings(latest["audit_run"]))
    active = [r for r in rows if r["status"] != "resolved"]
    p = page(client(settings))

    root = p.find("kafka-fleet")
    assert root == [{**root[0], "data-cluster": CLUSTER, "data-audit-run": latest["audit_run"]}]
    assert settings.store.url().endswith(f"/clusters/{CLUSTER}")  # the cluster's own store
    # every standing finding in exactly one group row, per (broker, rule) the same counts as the store's rows
    groups = p.find("finding-group")
    shown = Counter[tuple[str, str]]()
    for g in groups:
        shown[(g["data-broker"], g["data-rule"])] += int(g["data-count"])
    assert shown == Counter(_key(r) for r in active)
    assert len(groups) == len(group_findings(active)) < len(active) / 5  # repeated findings said once
    # the cards are the summary's counts
    for name, value in [*latest["by_severity"].items(), *latest["by_status"].items()]:
        if p.find(f"count-{name}"):
            assert f"{value}{name}" in "".join(p.text).replace("\n", ""), name
    # broker 2 was not reached: its findings are carried as unverified, and the page says so
    assert p.find("not-audited")
    assert "Not audited (could not be reached): broker(s) 2." in "".join(p.text)
    assert {g["data-broker"] for g in groups} >= {"2"}

    # one repair link per repairable group, pre-filled with its rule, broker and topics
    links = [a for a in p.named("a") if a.get("data-testid") == "repair-link"]
    repairable = [r for r in active if r.get("remediation") not in (None, "report-only")]
    assert len(links) == len(group_findings(repairable)) > 0
    for a in links:
        assert a["href"].startswith("repair?")
        q = parse_qs(urlsplit(a["href"]).query)
        (rule,) = q["rule"]
        (broker,) = q.get("broker", ["cluster"])
        mine = [r for r in repairable if _key(r) == (broker, rule)]
        assert mine, (broker, rule)
        assert set(q.get("topic", [])) <= {r["topic"] for r in mine if r.get("topic")}
        assert "include_internal" not in q  # only a person ticks it, never a link (PRODUCT.md)
    assert {(a["href"].split("rule=")[1].split("&")[0]) for a in links} == {r["rule"] for r in repairable}
    # beside them, each repairable rule's repair across every broker it was found on, as one plan (no broker named)
    rule_links = {a["href"]: a for a in p.named("a") if a.get("data-testid") == "rule-repair-link"}
    assert len(rule_links) == len({r["rule"] for r in repairable})
    for href in rule_links:
        q = parse_qs(urlsplit(href).query)
        (rule,) = q["rule"]
        assert "broker" not in q
        mine = [r for r in repairable if r["rule"] == rule]
        if all(r.get("topic") for r in mine):
            assert set(q["topic"]) == {r["topic"] for r in mine}
    # a group on an internal topic (the corpus's __consumer_offsets drift): its repair page leaves the box unticked
    # and says what the repair does with that topic
    internal = [a["href"] for a in links if "topic=__consumer_offsets" in a["href"]]
    assert internal  # some broker's topic-id-mismatch group
    form = page(client(settings), PAGE + internal[0])
    assert "checked" not in {a["name"]: a for a in form.named("input")}["include_internal"]
    assert len(form.find("internal-topics-note")) == 1
    assert "The topic-ID repair leaves them out unless you tick it" in "".join(form.text)

    # the report link opens the run's HTML report through the plugin
    (report,) = p.find("report-link")
    c = client(settings)
    r = c.get(PAGE + report["href"])
    stored = settings.store.read_text(f"reports/{latest['audit_run']}.html")
    assert r.status_code == 200 and "<script" not in stored
    # served as stored, plus only the view's own link handler: the CSP lets that one script (its nonce) run
    nonce = r.headers["content-security-policy"].split("'nonce-", 1)[1].split("'", 1)[0]
    assert r.text.replace(f'<script nonce="{nonce}">{render.NAV_JS}</script>', "") == stored
    # a store writer may plant HTML in a report: no form of it can submit (issue 28 item 15)
    policy = dict(d.strip().split(" ", 1) for d in r.headers["content-security-policy"].split(";"))
    assert policy["form-action"] == "'none'" and policy["script-src"] == f"'nonce-{nonce}'"
    assert "allow-forms" not in policy["sandbox"] and "allow-scripts" in policy["sandbox"].split()
    assert c.get(f"{PAGE}reports/scheduled__1999-01-01T00_00_00_00_00.html").status_code == 404


def test_new_resolved_and_the_trend_over_the_runs(tmp_path: Path, corpus_findings: list[dict[str, Any]]) -> None:
    settings = fleet_settings(tmp_path)
    summaries = three_runs(settings, corpus_findings)
    c = client(settings)
    rows3 = settings.store.read_jsonl(layout.history_findings(summaries[2]["audit_run"]))
    p = page(c)
    assert p.find("no-resolved")  # run 3 resolved nothing: broker 2 was not reached, its findings unverified
    statuses = Counter(r["status"] for r in rows3)
    assert statuses["unverified"] > 0 and statuses["resolved"] == 0

    # the runs table and the chart: one entry per published run, newest first
    runs = [r["data-run"] for r in p.find("run")]
    assert runs == [s["audit_run"] for s in reversed(summaries)]
    text = c.get(PAGE).text
    chart = text.split("data-testid='trend'>", 1)[1].split("</svg>", 1)[0]
    for s in summaries:
        for sev, n in s["by_severity"].items():
            if n:
                assert f"<title>{s['audit_run']}: {n} {sev}</title>" in chart
    assert [r["data-run"] for r in page(c, f"{PAGE}?runs=2").find("run")] == runs[:2]

    # as of run 2: broker 1's findings resolved, one new index-untrimmed on broker 3
    second = fleet_settings(tmp_path, "data2")
    summaries = three_runs(second, corpus_findings, n=2)
    rows2 = second.store.read_jsonl(layout.history_findings(summaries[1]["audit_run"]))
    c = client(second)
    p = page(c)
    resolved = Counter[tuple[str, str]]()
    for g in p.find("resolved-group"):
        resolved[(g["data-broker"], g["data-rule"])] += int(g["data-count"])
    assert resolved == Counter(_key(r) for r in rows2 if r["status"] == "resolved")
    assert {b for b, _ in resolved} == {"1"}
    (new,) = [g for g in p.find("finding-group") if g["data-rule"] == "index-untrimmed" and g["data-broker"] == "3"]
    assert new["data-count"] == "1"
    row = c.get(PAGE).text.split("data-broker='3' data-rule='index-untrimmed'", 1)[1].split("</tr>", 1)[0]
    assert "1 new" in row
    assert p.find("count-new") and f"{summaries[1]['by_status']['new']}new" in "".join(p.text).replace("\n", "")


def test_hostile_values_from_a_broker_are_shown_as_text(tmp_path: Path) -> None:
    settings = fleet_settings(tmp_path)
    bad = finding("index-untrimmed", 1, f"/k/{HOSTILE_TOPIC}-0/\"q'.index", "warning")
    bad.update(topic=HOSTILE_TOPIC, message=HOSTILE_MESSAGE, remediation="quarantine-index")
    other = finding("stray-dir", 2, "/k/тема-✓-0", "info")
    other.update(topic="тема-✓", message="stray directory тема-✓ & <marquee>", remediation="report-only")
    publish(settings, "manual__2026-11-05T10:00:00+00:00", [bad, other], [1, 2], cluster=HOSTILE_CLUSTER)
    c = client(settings)
    text = c.get(PAGE).text + c.get("/").text
    for raw in (HOSTILE_TOPIC, "</script><script>alert", HOSTILE_CLUSTER, "<marquee>"):
        assert raw not in text, raw
    p = page(c)
    assert not p.named("img") and not p.named("marquee")  # no element made from the data
    assert p.find("kafka-fleet")[0]["data-cluster"] == CLUSTER  # the inventory's name, not what a summary says
    body = "".join(p.text)
    assert HOSTILE_MESSAGE in body and HOSTILE_TOPIC in body and "тема-✓" in body
    (link,) = [a for a in p.named("a") if a.get("data-testid") == "repair-link"]
    assert parse_qs(urlsplit(link["href"]).query) == {
        "rule": ["index-untrimmed"],
        "broker": ["1"],
        "topic": [HOSTILE_TOPIC],
    }
    # the repair page puts the values back into its form as values, nothing else
    r = c.get(PAGE + link["href"])
    assert r.status_code == 200 and HOSTILE_TOPIC not in r.text
    form = page(c, PAGE + link["href"])
    assert not form.named("img")
    # a name Kafka would never give a topic is left out of the form's scope, and the page says so, as text
    assert {a["name"]: a["value"] for a in form.named("input") if a.get("type") == "text"}["topics"] == ""
    assert f"topic {HOSTILE_TOPIC!r} is not a Kafka topic name: left out" in "".join(form.text)
    # the runs' ids in a page: the publisher keeps file-name-safe forms, shown as given
    assert [r["data-run"] for r in p.find("run")] == ["manual__2026-11-05T10_00_00_00_00"]


# ---- the repair page
def test_the_repair_page_is_the_dags_form_pre_filled(tmp_path: Path) -> None:
    c = client(fleet_settings(tmp_path))
    q = "rule=index-untrimmed&broker=3&broker=x&topic=orders&topic=__consumer_offsets&dry_run=1"
    p = page(c, f"{PAGE}repair?{q}")
    assert p.find("repair-dag")[0] and f"kafka_fleet_repair__{CLUSTER}" in "".join(p.text)
    assert p.find("repair-form") and p.find("trigger-repair")
    inputs = {a["name"]: a for a in p.named("input")}
    assert {k: inputs[k]["value"] for k in ("audit_run", "rules", "brokers", "topics", "hold_out")} == {
        "audit_run": "latest",
        "rules": "index-untrimmed",
        "brokers": "3",
        "topics": "orders, __consumer_offsets",
        "hold_out": "",
    }
    assert "checked" in inputs["dry_run"]
    assert "checked" not in inputs["include_internal"]  # an internal topic named does not tick it: a person does
    assert len(p.find("internal-topics-note")) == 1
    text = "".join(p.text)
    assert (
        "This scope names internal topics (__consumer_offsets) and Include internal topics is not ticked. "
        "Their broken index files are quarantined whether or not it is ticked." in text
    )
    assert "topic-ID repair" not in text  # not in this scope's rules
    ticked = page(c, f"{PAGE}repair?{q}&include_internal=1")
    assert "checked" in {a["name"]: a for a in ticked.named("input")}["include_internal"]
    assert not ticked.find("internal-topics-note")
    assert not page(c, f"{PAGE}repair?rule=index-untrimmed&topic=orders").find("internal-topics-note")
    assert "broker 'x' is not a broker id (a number): left out" in "".join(p.text)
    # every field is one of the DAG's params, with the DAG's default when the link says nothing
    params = form(repair_dag(ZK_CLUSTER))  # every cluster's repair DAG has the same form
    assert set(inputs) <= set(params), set(inputs) - set(params)
    empty = {a["name"]: a for a in page(c, f"{PAGE}repair").named("input")}
    for name, a in empty.items():
        if a.get("type") == "checkbox":
            assert ("checked" in a) == params[name], name
        else:
            assert a["value"] == ("latest" if name == "audit_run" else ""), name
            assert params[name] in ("latest", []), name
    # the script builds the conf from the fields and posts it to Airflow's REST API, then opens the run
    text = c.get(f"{PAGE}repair").text
    assert f'const DAG = "kafka_fleet_repair__{CLUSTER}";' in text
    assert "api/v2/dags/${DAG}/dagRuns" in text and "logical_date: null" in text
    assert "dags/${DAG}/runs/${encodeURIComponent(run.dag_run_id)}" in text


def test_the_repair_pages_internal_topics_note_says_what_the_planner_does(
    tmp_path: Path, corpus_findings: list[dict[str, Any]]
) -> None:
    """The note against what ``build_plan`` does with a scope naming __consumer_offsets and the box unticked:
    the topic-ID repair leaves the corpus's __consumer_offsets drift out (not addressed, internal topic), an
    index quarantine on it goes ahead all the same."""
    c = client(fleet_settings(tmp_path))
    drift = [f for f in corpus_findings if f["rule"] == "topic-id-mismatch" and f["topic"] == "__consumer_offsets"]
    assert drift
    scope, _ = RepairScope.from_query([("rule", "topic-id-mismatch"), ("topic", "__consumer_offsets")])
    plan = build_plan("c", "r", drift, FleetFacts({}, []), **scope_args(scope))
    assert plan.counts()["files_removed"] == 0 and len(plan.skipped) == len(drift)
    (why,) = {s["why"] for s in plan.skipped}
    p = page(c, f"{PAGE}repair?{scope.query()}")
    assert len(p.find("internal-topics-note")) == 1
    text = "".join(p.text)
    said = "The topic-ID repair leaves them out unless you tick it; the approval lists their findings as not addressed"
    assert f"{said}: {why}." in text
    assert "quarantined" not in text

    # an untrimmed index of __consumer_offsets: quarantined with the box unticked, as the note says
    pdir = "/k/__consumer_offsets-0"
    untrimmed = {**finding("index-untrimmed", 1, f"{pdir}/00000000000000000000.index", "warning")}
    untrimmed.update(topic="__consumer_offsets", partition=0, segment=0, remediation="quarantine-index")
    probe = {
        1: [
            {"kind": "partition", "path": pdir, "topic": "__consumer_offsets", "partition": 0},
            {"kind": "segment", "path": pdir, "base_offset": 0, "has_index": True, "has_timeindex": True},
        ]
    }
    scope, _ = RepairScope.from_query([("rule", "index-untrimmed"), ("topic", "__consumer_offsets")])
    plan = build_plan("c", "r", [untrimmed], FleetFacts(probe, []), **scope_args(scope))
    assert plan.counts()["files_quarantined"] == 2 and not scope.include_internal
    text = "".join(page(c, f"{PAGE}repair?{scope.query()}").text)
    assert "Their broken index files are quarantined whether or not it is ticked." in text


def scope_args(scope: RepairScope) -> dict[str, Any]:
    """The repair DAG's planning arguments for a scope (its conf, as the plan task reads it)."""
    conf = scope.conf()
    keys = ("rules", "brokers", "topics", "include_internal")
    return {k: conf[k] for k in keys}


def test_the_repair_page_has_its_own_guard(tmp_path: Path) -> None:
    """``repair`` guards a cluster's repair page on top of ``read``: a user who may read the view but not repair gets
    403 there; ``read`` guards the cluster's pages; the overview lists only the clusters ``readable`` allows."""

    def allow() -> None:
        return None

    def refuse() -> None:
        raise HTTPException(403, "no repair for you")

    settings = fleet_settings(tmp_path)
    c = TestClient(create_app(lambda: settings, read=[Depends(allow)], repair=[Depends(refuse)]))
    assert c.get(PAGE).status_code == 200
    r = c.get(f"{PAGE}repair?rule=index-untrimmed")
    assert r.status_code == 403 and r.json() == {"detail": "no repair for you"}
    c = TestClient(create_app(lambda: settings, read=[Depends(refuse)], repair=[Depends(allow)]))
    assert c.get(PAGE).status_code == 403 and c.get(f"{PAGE}repair").status_code == 403
    assert c.get(f"{PAGE}reports/r1.html").status_code == 403
    hidden = TestClient(create_app(lambda: settings, readable=lambda: lambda dag_id: False))
    p = page(hidden, "/")
    assert not p.find("cluster-row") and "1 not readable by you" in "".join(p.text)
    shown = TestClient(
        create_app(lambda: settings, readable=lambda: lambda dag_id: dag_id == f"kafka_fleet_audit__{CLUSTER}")
    )
    assert [r["data-cluster"] for r in page(shown, "/").find("cluster-row")] == [CLUSTER]


def test_pending_approvals_count_the_repair_and_the_restore(tmp_path: Path) -> None:
    """Every DAG that waits for an approval is counted (the restore's and the purge's too), and the link opens
    Airflow's Required Actions of every DAG, where they are all listed."""
    c = client(fleet_settings(tmp_path))
    r = c.get(PAGE)
    dags = {d for d in dag_bag().dags if any(type(t).__name__ == "PlanApprovalOperator" for t in dag(d).tasks)}
    assert {d for d in dags if d.endswith(f"__{ZK_CLUSTER}")} == set(approval_dags(ZK_CLUSTER))
    assert f"const DAGS = {json.dumps(list(approval_dags(CLUSTER)))};" in r.text
    assert "api/v2/dags/${encodeURIComponent(dag)}/${query}" in r.text and "response_received=false" in r.text
    (link,) = Page(r.text).find("required-actions-link")
    assert link["href"] == "../../../required_actions"  # Airflow's root, from kafka-fleet/clusters/corpus/
    assert Page(r.text).named("html")[0]["data-airflow-root"] == "../../../"
    # the overview counts every cluster's in one query per DAG kind (their ids' prefixes)
    text = c.get("/").text
    assert 'const PREFIXES = ["kafka_fleet_repair__", "kafka_fleet_restore__"];' in text
    assert "dag_id_prefix_pattern=" in text and Page(text).named("html")[0]["data-airflow-root"] == "../"


def test_an_empty_or_broken_store_says_so(tmp_path: Path) -> None:
    settings = fleet_settings(tmp_path)
    c = client(settings)
    p = page(c)
    assert p.find("no-audit") and str(settings.store.url()) in "".join(p.text)
    settings.store.write_text(layout.HISTORY_RUNS, '{"audit_run": "r1"}\nnot json\n')
    r = c.get(PAGE)
    assert r.status_code == 503
    assert f"{settings.store.url('history/runs.jsonl')}: not JSON Lines (line 2)" in "".join(Page(r.text).text)
    assert c.get(f"{PAGE}reports/r1.html").status_code == 503
    # the overview still answers: that cluster's row says what could not be read
    (row,) = page(c, "/").find("cluster-row")
    assert row["data-state"] == "unreadable"
    assert c.get(f"/{cluster_page('nope')}").status_code == 404  # not a cluster of the fleet


# ---- a live Airflow
def get(url: str, token: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Cookie": f"_token={token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


@pytest.fixture(scope="module")
def live(shared: Any) -> Any:
    """The session's live Airflow (harness.shared: it loads plugins/ as the demo does), its store holding only a
    published audit with a hostile finding."""
    af = shared.live_airflow()
    shared.finish_runs()
    settings = Settings.from_env(af.env).for_cluster(LAB_CLUSTER)
    if shared.data.exists():
        shutil.rmtree(shared.data)
    bad = finding("index-untrimmed", 1, f"/k/{HOSTILE_TOPIC}-0/0.index", "warning")
    bad.update(topic=HOSTILE_TOPIC, message=HOSTILE_MESSAGE, remediation="quarantine-index")
    publish(settings, "scheduled__2026-11-05T02:00:00+00:00", [bad], [1], cluster=HOSTILE_CLUSTER)
    return af


def test_live_plugin_listed_auth_enforced_and_page_rendered(live: Any) -> None:
    from airflow.api_fastapi.core_api.datamodels.plugins import ExternalViewResponse

    plugins = {p["name"]: p for p in live.api("GET", "/api/v2/plugins")["plugins"]}
    assert "kafka_fleet" in plugins, plugins.keys()  # an invalid entry would drop the whole plugin
    mine = plugins["kafka_fleet"]
    assert [a["url_prefix"] for a in mine["fastapi_apps"]] == ["/kafka-fleet"]
    (view,) = mine["external_views"]
    ExternalViewResponse.model_validate(view)
    assert (view["name"], view["href"], view["url_route"], view["destination"]) == (
        "Kafka fleet",
        "kafka-fleet/",
        "kafka-fleet",
        "nav",
    )
    lab = f"/kafka-fleet/{cluster_page(LAB_CLUSTER)}"
    routes = (
        "/kafka-fleet/",
        lab,
        f"{lab}repair?rule=index-untrimmed",
        f"{lab}reports/x.html",
        "/kafka-fleet/repair",
        "/kafka-fleet/metrics",
    )
    for path in routes:
        assert get(live.base + path)[0] == 401, path  # no credential
        assert get(live.base + path, "not-a-jwt")[0] in (401, 403), path
    viewer = live.token("fleet_doctor_reader")  # a viewer: may read DAGs
    status, text = get(live.base + "/kafka-fleet/", viewer)  # the overview: the lab, its one cluster
    assert status == 200 and HOSTILE_TOPIC not in text
    (row,) = Page(text).find("cluster-row")
    assert row["data-cluster"] == LAB_CLUSTER and row["data-state"] == "ok"
    status, text = get(live.base + lab, viewer)
    assert status == 200 and HOSTILE_TOPIC not in text
    p = Page(text)
    assert p.find("kafka-fleet")[0]["data-cluster"] == LAB_CLUSTER
    assert [g["data-rule"] for g in p.find("finding-group")] == ["index-untrimmed"]
    assert get(live.base + f"{lab}repair?rule=index-untrimmed", viewer)[0] == 200
    assert get(live.base + f"{lab}reports/scheduled__2026-11-05T02_00_00_00_00.html", viewer)[0] == 200
    assert get(live.base + f"/kafka-fleet/{cluster_page('elsewhere')}", viewer)[0] == 404
    # the metrics, scraped with a viewer's bearer token (as Prometheus' authorization setting sends it)
    m = scrape(live, "fleet_doctor_reader")
    cluster = (("cluster", LAB_CLUSTER),)
    assert m["kafka_fleet_store_up"] == {cluster: 1} and m["kafka_fleet_pending_approvals"] == {cluster: 0}
    assert m["kafka_fleet_findings"] == {
        (*cluster, ("rule", "index-untrimmed"), ("severity", "warning"), ("status", "new")): 1
    }
    # a link from before there were fleets: the fleet of one's repair page
    status, text = get(live.base + "/kafka-fleet/repair?rule=index-untrimmed", viewer)
    assert status == 200 and Page(text).find("repair-form")


def chromium() -> Any:
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("Chromium not installed (/usr/bin/chromium: bin/dev setup installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    return sync_playwright()


def test_live_in_chromium_the_views_links_open_airflow_pages_and_trigger_the_repair(live: Any) -> None:
    admin = live.token()
    with chromium() as pw:
        browser = pw.chromium.launch(
            executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
            ctx.add_cookies([{"name": "_token", "value": admin, "url": live.base}])  # what Airflow's login sets
            pg = ctx.new_page()
            dialogs: list[str] = []
            pg.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            pg.goto(live.base + "/")
            pg.get_by_role("link", name="Kafka fleet").first.click()  # the nav entry
            pg.wait_for_url("**/plugin/kafka-fleet**")
            frame = pg.frame_locator("iframe")
            frame.locator('[data-testid="kafka-fleet-overview"]').wait_for()  # the fleet: one row per cluster
            pending = frame.locator(f'[data-testid="pending"][data-cluster="{LAB_CLUSTER}"]')
            pending.filter(has_text="0").wait_for()  # counted from Airflow's HITL API
            frame.locator('[data-testid="cluster-link"]').click()
            frame.locator('[data-testid="kafka-fleet"]').wait_for()
            assert frame.locator('[data-testid="cluster"]').inner_text() == LAB_CLUSTER
            count = frame.locator('[data-testid="required-actions-count"]')
            count.filter(has_text="pending").wait_for()
            assert count.get_attribute("data-count") == "0"
            # a link into Airflow opens in the Airflow window, not inside the iframe
            frame.locator('[data-testid="required-actions-link"]').click()
            pg.wait_for_url(f"{live.base}/required_actions")
            pg.goto(f"{live.base}/{in_airflow(cluster_page(LAB_CLUSTER))}")  # a deep link to the cluster's page
            frame = pg.frame_locator("iframe")
            frame.locator('[data-testid="repair-link"]').click()
            form = frame.locator('[data-testid="repair-form"]')
            form.wait_for()
            # a name Kafka never gives a topic is left out of the scope (issue 28 item 16), and the page says so
            assert frame.locator('input[name="topics"]').input_value() == ""
            assert "is not a Kafka topic name: left out" in frame.locator("body").inner_text()
            frame.locator('input[name="dry_run"]').check()
            shown = json.loads(frame.locator('[data-testid="repair-conf"]').inner_text())
            frame.locator('[data-testid="trigger-repair"]').click()
            pg.wait_for_url(re.compile(re.escape(f"{live.base}/dags/{REPAIR}/runs/") + r"[^/]+$"))
            run_id = unquote(pg.url.rsplit("/", 1)[1])
            assert dialogs == []  # nothing from the data ran

            # a deep link opens a page of the view inside Airflow (Airflow restores the iframe from its URL)
            scope = RepairScope(rules=("index-untrimmed",), brokers=(1,), dry_run=True)
            pg.goto(f"{live.base}/{in_airflow(cluster_page(LAB_CLUSTER, f'repair?{scope.query()}'))}")
            frame = pg.frame_locator("iframe")
            frame.locator('[data-testid="repair-form"]').wait_for()
            assert frame.locator('input[name="rules"]').input_value() == "index-untrimmed"
            assert frame.locator('input[name="dry_run"]').is_checked()

            # a viewer may open the page (here on its own, not framed) but Airflow refuses her trigger: said there
            viewer = browser.new_context()
            viewer.add_cookies([{"name": "_token", "value": live.token("fleet_doctor_reader"), "url": live.base}])
            alone = viewer.new_page()
            alone.goto(f"{live.base}/kafka-fleet/{cluster_page(LAB_CLUSTER)}repair?rule=index-untrimmed&broker=1")
            alone.locator('[data-testid="trigger-repair"]').click()
            status = alone.locator('[data-testid="repair-status"]')
            status.filter(has_text="refused").wait_for()
            assert "Airflow refused the trigger (HTTP 403)" in status.inner_text()
            assert alone.url.startswith(f"{live.base}/kafka-fleet/{cluster_page(LAB_CLUSTER)}repair?")
        finally:
            browser.close()
    conf = live.api("GET", f"/api/v2/dags/{REPAIR}/dagRuns/{urllib.parse.quote(run_id, safe='')}")["conf"]
    assert (
        conf
        == shown
        == {
            "audit_run": "latest",
            "rules": ["index-untrimmed"],
            "brokers": [1],
            "topics": [],
            "hold_out": [],
            "include_internal": False,
            "dry_run": True,
        }
    )
