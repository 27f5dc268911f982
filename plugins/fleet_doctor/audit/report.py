"""Render findings for people: terminal text grouped by broker and partition, or one
self-contained HTML page. JSON output is the findings themselves (see fleet_doctor.cli).

The HTML pages list findings one row per group (``fleet_doctor.finding_groups``: one broker, one rule, one cause),
with a count, an example message and the files behind a ``<details>`` disclosure: a broker killed with ``kill -9``
is one ``index-untrimmed`` row, not forty."""

from __future__ import annotations

import html
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any, TextIO

from fleet_doctor.airflow_links import RepairScope, cluster_page, in_airflow, is_repairable
from fleet_doctor.audit.summary import FindingStatus, RunSummary
from fleet_doctor.finding_groups import FindingGroup, group_findings
from fleet_doctor.rules import SEVERITY_ORDER, severity_rank

_COLOR = {"critical": "\033[1;31m", "warning": "\033[33m", "info": "\033[36m"}


def _broker_key(f: dict[str, Any]) -> tuple[int, int]:
    return (1, 0) if f.get("broker_id") is None else (0, f["broker_id"])


def counts(findings: Iterable[dict[str, Any]]) -> dict[str, int]:
    out = dict.fromkeys(SEVERITY_ORDER, 0)
    for f in findings:
        out[f["severity"]] = out.get(f["severity"], 0) + 1
    return out


def metadata_label(kraft: bool) -> str:
    """Where cluster-wide facts come from, in a heading: ZooKeeper, or the KRaft metadata log."""
    return "metadata log" if kraft else "ZooKeeper"


def metadata_source_text(source: dict[str, Any]) -> str:
    """One sentence naming a KRaft run's metadata source (``history.metadata_summary``'s ``metadata_source``)."""
    where = ", ".join(str(x) for x in (source.get("host"), source.get("metadata_log_dir")) if x)
    text = f"controller {source.get('controller')}'s metadata log" + (f" ({where})" if where else "")
    snapshot = source.get("snapshot")
    if snapshot:
        text += f", snapshot {snapshot} (end offset {source.get('snapshot_end_offset')})"
    else:
        text += ", no snapshot"
    text += f", log end offset {source.get('log_end_offset')}"
    own, active = source.get("quorum_leader_id"), source.get("active_controller")
    names = isinstance(own, int) and own >= 0  # -1: its quorum-state knows no leader
    own_text = f"its quorum-state names {own} (epoch {source.get('quorum_leader_epoch')})"
    if active is not None:
        text += f"; quorum leader {active} (epoch {source.get('active_controller_epoch')})"
        text += f", though {own_text}" if names and own != active else ""
    elif "active_controller" in source:  # read since the quorum's view is recorded: no leader has a majority
        text += "; no quorum leader that a majority of the controllers name" + (f" ({own_text})" if names else "")
    elif own is not None:  # a run staged before: this controller's own view only
        text += f"; quorum leader {own} (epoch {source.get('quorum_leader_epoch')})"
    if source.get("whole") is False:
        text += "; its image misses records (a snapshot gap or a CRC failure) and no whole one could be read"
    return text


def render_text(findings: list[dict[str, Any]], summary: dict[str, Any], out: TextIO, color: bool = False) -> None:
    def sev(s: str) -> str:
        label = s.upper().ljust(8)
        return f"{_COLOR.get(s, '')}{label}\033[0m" if color else label

    by_broker: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for f in findings:
        by_broker[_broker_key(f)].append(f)
    for key in sorted(by_broker):
        group = by_broker[key]
        c = counts(group)
        title = f"cluster ({metadata_label(summary.get('metadata_mode') == 'kraft')})" if key[0] else f"broker {key[1]}"
        out.write(f"{title}: {c['critical']} critical, {c['warning']} warning, {c['info']} info\n")
        by_part: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
        for f in group:
            part = f.get("partition")
            by_part[(f.get("log_dir") or "", f.get("topic") or "", -1 if part is None else part)].append(f)
        for log_dir, topic, part in sorted(by_part):
            where = f"{topic}-{part}" if topic and part >= 0 else (topic or log_dir or "(cluster)")
            if log_dir and topic:
                where += f"  ({log_dir})"
            out.write(f"  {where}\n")
            for f in sorted(
                by_part[(log_dir, topic, part)],
                key=lambda f: (
                    severity_rank(f["severity"]),
                    f["rule"],
                    -1 if f.get("segment") is None else f["segment"],
                ),
            ):
                out.write(f"    {sev(f['severity'])} {f['rule']:<28} {f['message']}\n")
        out.write("\n")
    c = counts(findings)
    out.write(
        f"{len(findings)} finding(s): {c['critical']} critical, {c['warning']} warning, {c['info']} info"
        f" on {len({f.get('broker_id') for f in findings if f.get('broker_id') is not None})} broker(s)\n"
    )
    if summary.get("metadata_mode") == "kraft" and summary.get("metadata_source"):
        out.write(f"  cluster metadata from {metadata_source_text(summary['metadata_source'])}\n")
    for rule, why in sorted((summary.get("rules_skipped") or {}).items()):
        out.write(f"  not evaluated: {rule} ({why})\n")


_CSS = """
body{font-family:system-ui,sans-serif;margin:2rem;color:#1d232a}
h1{font-size:1.4rem} h2{font-size:1.1rem;margin-top:2rem}
table{border-collapse:collapse;width:100%;font-size:.9rem}
th,td{border-bottom:1px solid #ddd;padding:.3rem .5rem;text-align:left;vertical-align:top}
th{background:#f3f5f7} td.msg{font-family:ui-monospace,monospace;font-size:.8rem;word-break:break-all}
.critical{color:#b00020;font-weight:600}.warning{color:#a15c00}.info{color:#00668a}
.cards{display:flex;gap:1rem}.card{border:1px solid #ddd;border-radius:6px;padding:.6rem 1rem}
.card b{font-size:1.4rem;display:block}
details summary{cursor:pointer} details ul{margin:.3rem 0;padding-left:1.2rem}
td.n{text-align:right} code{font-family:ui-monospace,monospace;font-size:.8rem;word-break:break-all}
"""


def render_html(findings: list[dict[str, Any]], summary: dict[str, Any], out: TextIO, title: str) -> None:
    e = html.escape
    c = counts(findings)
    out.write(f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{_CSS}</style>")
    out.write(f"</head><body><h1>{e(title)}</h1><div class='cards'>")
    for s in SEVERITY_ORDER:
        out.write(f"<div class='card'><b class='{s}'>{c[s]}</b>{s}</div>")
    out.write("</div>")
    by_rule: dict[str, int] = defaultdict(int)
    for f in findings:
        by_rule[f["rule"]] += 1
    out.write("<h2>By rule</h2><table><tr><th>rule</th><th>findings</th></tr>")
    for rule, n in sorted(by_rule.items(), key=lambda kv: -kv[1]):
        out.write(f"<tr><td>{e(rule)}</td><td>{n}</td></tr>")
    out.write("</table><h2>Findings</h2>")
    _groups_table(group_findings(findings), out, status=False)
    _not_evaluated(summary.get("rules_skipped") or {}, out)
    out.write("</body></html>\n")


def _partition_label(f: dict[str, Any]) -> str:
    if f.get("topic") and f.get("partition") is not None:
        return f"{f['topic']}-{f['partition']}"
    return f.get("topic") or ""


def _where(g: FindingGroup) -> str:
    """The group's topics (at most three) and how many partitions, for its row."""
    shown = g.topics_text()
    return f"{shown} ({g.partitions} partition(s))" if g.partitions else shown


def _file_item(f: dict[str, Any], status: bool) -> str:
    """One finding of a group: its status, its file (else its partition), and its message without the file name
    it starts with (the detectors write ``<path>: ...``)."""
    e = html.escape
    where = _partition_label(f) + ("" if f.get("segment") is None else f" segment {f['segment']}")
    name = str(f.get("path") or f.get("log_dir") or where or "(cluster)")
    message = str(f.get("message") or "")
    message = message.removeprefix(f"{name}: ")
    state = f"<i>{e(str(f.get('status') or ''))}</i> " if status else ""
    return f"<li>{state}<code>{e(name)}</code>: {e(message)}</li>"


def _repair_link(g: FindingGroup, airflow_url: str, cluster: str) -> str:
    """A repairable group's link to the cluster's repair DAG's trigger, pre-filled with the group's scope (the Kafka
    fleet view's repair page, opened inside Airflow's UI); a report-only group's plain note."""
    if not is_repairable(g):
        return "report only"
    href = f"{airflow_url}/{in_airflow(cluster_page(cluster, 'repair?' + RepairScope.of_group(g).query()))}"
    return f"<a href='{html.escape(href)}' data-airflow-link data-testid='repair-link'>Repair…</a>"


def _groups_table(
    groups: Iterable[FindingGroup], out: TextIO, *, status: bool, airflow_url: str | None = None, cluster: str = ""
) -> None:
    """The findings of both pages, one row per group (severity, broker, rule, count, where, an example message;
    with ``status``, the audit's new / persisting / unverified / resolved counts), the files behind a disclosure;
    with ``airflow_url``, each repairable group's link to a pre-filled repair."""
    e = html.escape
    head = ["severity", "broker", "rule", "count", "where", "example", *(["status"] if status else []), "files"]
    head += ["repair"] if airflow_url else []
    out.write("<table class='groups'><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>")
    for g in groups:
        broker = "cluster" if g.broker_id is None else str(g.broker_id)
        statuses = sorted(g.statuses.items(), key=lambda kv: _STATUS_ORDER.get(kv[0], 9))
        shown = ", ".join(f"{n} {e(s)}" for s, n in statuses)
        files = "".join(_file_item(f, status) for f in g.findings)
        label = f"{g.count} file(s)" if any(f.get("path") for f in g.findings) else f"{g.count} finding(s)"
        cells = [
            f"<td class='{e(g.severity)}'>{e(g.severity)}</td>",
            f"<td>{e(broker)}</td><td>{e(g.rule)}</td><td class='n'>{g.count}</td><td>{e(_where(g))}</td>",
            f"<td class='msg'>{e(g.example)}</td>",
            *([f"<td>{shown}</td>"] if status else []),
            f"<td><details><summary>{label}</summary><ul>{files}</ul></details></td>",
            *([f"<td>{_repair_link(g, airflow_url, cluster)}</td>"] if airflow_url else []),
        ]
        out.write("<tr>" + "".join(cells) + "</tr>")
    out.write("</table>")


def _not_evaluated(skipped: dict[str, str], out: TextIO) -> None:
    if skipped:
        out.write("<h2>Not evaluated</h2><ul>")
        for rule, why in sorted(skipped.items()):
            out.write(f"<li>{html.escape(rule)}: {html.escape(why)}</li>")
        out.write("</ul>")


def _metadata_source(summary: RunSummary, out: TextIO) -> None:
    """KRaft: which controller's metadata log the cluster facts come from, and the controllers that failed."""
    if not summary.kraft:
        return
    e = html.escape
    if summary.metadata_error:
        out.write(
            "<h2 class='critical'>Cluster metadata</h2><p>Not read: the cluster-wide rules did not run. "
            f"{e(summary.metadata_error)}</p>"
        )
    elif summary.metadata_source:
        out.write(f"<h2>Cluster metadata</h2><p>From {e(metadata_source_text(summary.metadata_source))}.</p>")
    if summary.controller_errors and not summary.metadata_error:
        out.write("<p>Controllers not read:</p><ul>")
        for f in summary.controller_errors:
            out.write(f"<li>{e(str(f.get('error')))}</li>")
        out.write("</ul>")


_STATUS_ORDER = {s.value: i for i, s in enumerate(FindingStatus)}


def svg_history(runs: list[dict[str, Any]], width: int = 640, height: int = 160) -> str:
    """Stacked bars of critical/warning/info findings per audit run (the last 30), inline SVG."""
    runs = runs[-30:]
    if not runs:
        return ""
    top = max(sum(r["by_severity"].values()) for r in runs) or 1
    bar = max(4, (width - 40) // max(len(runs), 1) - 4)
    colors = {"critical": "#c0392b", "warning": "#e67e22", "info": "#7f8c8d"}
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height + 30}' role='img'>"]
    parts.append(f"<text x='0' y='12' font-size='11'>{top}</text><text x='0' y='{height}' font-size='11'>0</text>")
    for i, r in enumerate(runs):
        x = 30 + i * (bar + 4)
        y = height
        for sev in ("info", "warning", "critical"):
            n = r["by_severity"].get(sev, 0)
            h = round(n / top * (height - 20))
            if h:
                y -= h
                parts.append(
                    f"<rect x='{x}' y='{y}' width='{bar}' height='{h}' fill='{colors[sev]}'>"
                    f"<title>{html.escape(r['audit_run'])}: {n} {sev}</title></rect>"
                )
    parts.append(f"<text x='30' y='{height + 20}' font-size='11'>{html.escape(runs[0]['audit_run'])}</text>")
    parts.append("</svg>")
    return "".join(parts)


def _airflow_links(airflow_url: str, cluster: str) -> str:
    """The report's way back into Airflow: the cluster's page in the Kafka fleet view and the pending approvals
    (Airflow's Required Actions of every DAG: the repair's and the restore's)."""
    links = [
        (in_airflow(cluster_page(cluster)), "Kafka fleet view"),
        ("required_actions", "Pending approvals (Required Actions)"),
    ]
    return (
        "<p class='links'>"
        + " · ".join(
            f"<a href='{html.escape(f'{airflow_url}/{path}')}' data-airflow-link>{text}</a>" for path, text in links
        )
        + "</p>"
    )


def registry_notes(summary: RunSummary) -> list[tuple[str, list[Any]]]:
    """Where the inventory and the cluster's registry (ZooKeeper's, or the KRaft metadata log's) disagree, and the
    fenced brokers: (what, broker ids) for each that has any."""
    registry = "the metadata log (registered, unfenced)" if summary.kraft else "ZooKeeper"
    notes = (
        (f"In the inventory, not registered in {registry}", summary.only_in_inventory),
        (f"Registered in {registry}, not in the inventory", summary.only_in_cluster_metadata),
        ("Fenced by the controller (stopped, not heartbeating or not caught up)", summary.fenced),
    )
    return [(label, list(brokers)) for label, brokers in notes if brokers]


def render_audit_html(
    rows: list[dict[str, Any]],
    summary: RunSummary,
    runs: list[dict[str, Any]],
    out: TextIO,
    airflow_url: str | None = None,
) -> None:
    """The audit report: summary cards, brokers not audited, findings over time, per-broker and per-rule tables,
    and every finding with its status (new / persisting / unverified / resolved). Self-contained. With
    ``airflow_url`` (Airflow's UI as people open it), links into Airflow: the Kafka fleet view, the pending
    approvals, and a pre-filled repair per repairable group."""
    e = html.escape
    title = f"Kafka Fleet Doctor: cluster {summary.cluster}, audit {summary.audit_run}"
    out.write(f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{_CSS}</style>")
    out.write(f"</head><body><h1>{e(title)}</h1>")
    if airflow_url:
        out.write(_airflow_links(airflow_url, summary.cluster))
    out.write("<div class='cards'>")
    for s in SEVERITY_ORDER:
        out.write(f"<div class='card'><b class='{s}'>{summary.by_severity[s]}</b>{s}</div>")
    for st in (FindingStatus.NEW, FindingStatus.RESOLVED):
        out.write(f"<div class='card'><b>{summary.by_status[st]}</b>{st}</div>")
    out.write("</div>")
    if summary.not_audited:
        out.write(
            "<h2 class='critical'>Not audited</h2><p>These brokers could not be reached; their earlier findings "
            "are carried as <i>unverified</i>: broker(s) " + e(", ".join(map(str, summary.not_audited))) + "</p>"
        )
    if summary.out_of_scope:
        out.write(
            "<h2>Out of scope</h2><p>This run audited only some brokers; the earlier findings of the others are "
            "carried as <i>unverified</i>: broker(s) " + e(", ".join(map(str, summary.out_of_scope))) + "</p>"
        )
    for label, brokers in registry_notes(summary):
        out.write(f"<h2>{e(label)}</h2><p>broker(s) {e(', '.join(map(str, brokers)))}</p>")
    if summary.zookeeper_error:
        out.write(f"<h2 class='critical'>ZooKeeper</h2><p>{e(summary.zookeeper_error)}</p>")
    _metadata_source(summary, out)
    out.write("<h2>Findings over time</h2>" + svg_history(runs))
    active = [r for r in rows if r["status"] != FindingStatus.RESOLVED]
    per_broker: dict[str, Counter[str]] = defaultdict(Counter)
    per_rule: dict[str, Counter[str]] = defaultdict(Counter)
    for r in active:
        per_broker["cluster" if r.get("broker_id") is None else str(r["broker_id"])][r["severity"]] += 1
        per_rule[r["rule"]][r["severity"]] += 1
    for heading, table in (("By broker", per_broker), ("By rule", per_rule)):
        out.write(
            f"<h2>{heading}</h2><table><tr><th></th>" + "".join(f"<th>{s}</th>" for s in SEVERITY_ORDER) + "</tr>"
        )
        for name, c in sorted(table.items()):
            out.write(f"<tr><td>{e(name)}</td>" + "".join(f"<td>{c.get(s, 0)}</td>" for s in SEVERITY_ORDER) + "</tr>")
        out.write("</table>")
    groups = group_findings(active)
    out.write(
        f"<h2>Findings</h2><p>{len(active)} finding(s) in {len(groups)} group(s) (one broker, one rule, one "
        "cause each); the files behind each.</p>"
    )
    _groups_table(groups, out, status=True, airflow_url=airflow_url, cluster=summary.cluster)
    resolved = [r for r in rows if r["status"] == FindingStatus.RESOLVED]
    if resolved:
        out.write(f"<h2>Resolved since the previous run</h2><p>{len(resolved)} finding(s).</p>")
        _groups_table(group_findings(resolved), out, status=True)
    _not_evaluated(summary.rules_skipped, out)
    out.write("</body></html>\n")
