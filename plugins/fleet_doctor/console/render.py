"""The Kafka fleet view's HTML: the fleet page and the repair DAG's pre-filled trigger page. Server-rendered, no
external JS or CSS; everything that came from a broker or the store is escaped (``html.escape`` in text and
attributes, ``script_json`` for data in a script). Scripts carry the response's CSP nonce.

The pages live one level under Airflow's root (``<base>/kafka-fleet/``), shown by Airflow in a sandboxed iframe
(no top navigation, no popups): links into Airflow's own pages carry ``data-airflow-link`` and are opened in the
Airflow window by pushing the URL into its history and announcing it with a ``popstate`` event, which Airflow's
router follows (``NAV_JS``); without a parent window they are plain links."""

from __future__ import annotations

import datetime as dt
import html
import json
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from fleet_doctor.airflow_links import (
    REPAIR_DAG,
    RESTORE_DAG,
    SEPARATOR,
    RepairScope,
    approval_dags,
    audit_dag,
    is_repairable,
    repair_dag,
    restore_dag,
    roll_dag,
)
from fleet_doctor.audit.report import registry_notes, svg_history  # one implementation each, the report's
from fleet_doctor.audit.summary import TIME_FORMAT, FindingStatus, parse_time
from fleet_doctor.console.data import ClusterRow, FleetView, RollView, broker_label, distinct, matrix
from fleet_doctor.finding_groups import FindingGroup
from fleet_doctor.inventory import InventoryProblem
from fleet_doctor.lock_state import FREE, HELD, NEEDS_HUMAN, LockState
from fleet_doctor.roll_status import BLOCKED, DONE, HALTED
from fleet_doctor.rules import SEVERITY_ORDER

MAX_FILES = 200  # files listed per group (the count says how many there are)
MAX_TOPICS = 5
STATUSES = tuple(s.value for s in FindingStatus)
GROUP_HEADER = (  # the findings and the resolved tables' columns
    "<th>severity</th><th>broker</th><th>rule</th><th class='num'>findings</th><th class='num'>partitions</th>"
    "<th>topics</th><th>status</th><th>example and files</th>"
)

e = html.escape


def script_json(value: Any) -> str:
    """``value`` as JSON that is safe inside a ``<script>`` element (no ``</script>``, no ``<!--``)."""
    text = json.dumps(value)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


CSS = """
:root{color-scheme:light}
body{font-family:system-ui,sans-serif;margin:1rem 1.5rem;color:#1d232a;background:#fff;font-size:14px}
h1{font-size:1.35rem;margin:.2rem 0 .6rem} h2{font-size:1.1rem;margin:1.6rem 0 .5rem}
a{color:#0b5cad} nav a{margin-right:1rem}
table{border-collapse:collapse;width:100%;font-size:.85rem}
th,td{border-bottom:1px solid #ddd;padding:.3rem .45rem;text-align:left;vertical-align:top}
th{background:#f3f5f7} td.num{text-align:right;font-variant-numeric:tabular-nums}
.msg,.mono{font-family:ui-monospace,monospace;font-size:.78rem;word-break:break-all}
.critical{color:#b00020;font-weight:600}.warning{color:#a15c00}.info{color:#00668a}
.cards{display:flex;flex-wrap:wrap;gap:.6rem;margin:.6rem 0}
.card{border:1px solid #ddd;border-radius:6px;padding:.4rem .8rem;min-width:5rem}.card b{font-size:1.3rem;display:block}
.alert{border-left:4px solid #b00020;background:#fdf0f2;padding:.4rem .8rem;margin:.5rem 0}
.note{border-left:4px solid #a15c00;background:#fff8ec;padding:.4rem .8rem;margin:.5rem 0}
.muted{color:#5f6b76} details summary{cursor:pointer;color:#0b5cad}
.legend span{margin-right:1rem}.sw{display:inline-block;width:.8rem;height:.8rem;margin-right:.3rem;vertical-align:-1px}
.sw.critical{background:#c0392b}.sw.warning{background:#e67e22}.sw.info{background:#7f8c8d}
td.topics{max-width:12rem;word-break:break-word} td.example{width:45%} td.nowrap{white-space:nowrap}
.scroll{overflow-x:auto} .scroll td:first-child{white-space:nowrap}
.cell-critical{background:#f9d9dd}.cell-warning{background:#fde9cf}.cell-info{background:#e3f1f6}
form label{display:block;margin:.7rem 0 .2rem;font-weight:600} form .hint{font-weight:400;color:#5f6b76}
input[type=text]{width:100%;max-width:42rem;padding:.3rem;font:inherit;box-sizing:border-box}
.check{display:flex;gap:.5rem;align-items:flex-start;margin:.7rem 0} .check label{margin:0}
button{font:inherit;padding:.45rem 1.1rem;margin-top:1rem;cursor:pointer}
pre{background:#f3f5f7;padding:.6rem;max-width:42rem;overflow:auto}
"""

NAV_JS = """
(() => {
  "use strict";
  // Airflow's root, relative to this page: the fleet overview lives one level under it (kafka-fleet/), a cluster's
  // pages three (kafka-fleet/clusters/<cluster>/)
  const airflowBase = new URL(document.documentElement.dataset.airflowRoot || "../", document.baseURI);
  function open(url) {
    // Airflow shows this page in a sandboxed iframe that may not navigate the top window: push the URL into the
    // Airflow window's history (same origin) and announce it; its router follows popstate like a Back/Forward.
    let top;
    try {
      top = window.top;
      if (top === window || top.location.origin !== window.location.origin) return false;
    } catch (err) {
      return false;
    }
    try {
      const st = top.history.state;
      const idx = st && typeof st.idx === "number" ? st.idx + 1 : 0;
      top.history.pushState({usr: null, key: Math.random().toString(36).slice(2, 10), idx}, "", url);
      top.dispatchEvent(new PopStateEvent("popstate", {state: top.history.state}));
      return true;
    } catch (err) {
      return false;
    }
  }
  window.kafkaFleet = {url: (path) => new URL(path, airflowBase).href, open};
  document.addEventListener("click", (ev) => {
    const a = ev.target instanceof Element ? ev.target.closest("a[data-airflow-link]") : null;
    if (!a || ev.defaultPrevented || ev.button !== 0 || ev.ctrlKey || ev.metaKey || ev.shiftKey || ev.altKey) return;
    if (open(a.href)) ev.preventDefault();  // else: a plain link (this frame, or the page when not framed)
  });
})();
"""

PENDING_JS = """
(() => {
  "use strict";
  // the approvals waiting for a person: the repair's and the restore's (Airflow's HITL API, one DAG per query:
  // an exact dag_id, where dag_id_pattern is a substring match)
  const out = document.querySelector('[data-testid="required-actions-count"]');
  if (!out) return;
  const query = "dagRuns/~/hitlDetails?response_received=false&limit=1";
  const pending = (dag) =>
    fetch(kafkaFleet.url(`api/v2/dags/${encodeURIComponent(dag)}/${query}`), {
      credentials: "same-origin",
      headers: {Accept: "application/json"},
    })
      .then((r) => (r.ok ? r.json() : Promise.reject(new Error(`${dag}: HTTP ${r.status}`))))
      .then((d) => d.total_entries);
  Promise.allSettled(DAGS.map(pending)).then((results) => {
    const counted = results.filter((r) => r.status === "fulfilled");
    if (!counted.length) {
      out.textContent = "";
      return;
    }
    const total = counted.reduce((sum, r) => sum + r.value, 0);
    const missed = DAGS.filter((_, i) => results[i].status !== "fulfilled");
    out.dataset.count = String(total);
    out.textContent = `(${total} pending${missed.length ? `; ${missed.join(", ")} not counted` : ""})`;
  });
})();
"""

REPAIR_JS = """
(() => {
  "use strict";
  const form = document.querySelector('[data-testid="repair-form"]');
  const preview = document.querySelector('[data-testid="repair-conf"]');
  const status = document.querySelector('[data-testid="repair-status"]');
  const button = document.querySelector('[data-testid="trigger-repair"]');
  const runLink = document.querySelector('[data-testid="repair-run-link"]');
  const list = (name) => form.elements[name].value.split(",").map((s) => s.trim()).filter(Boolean);
  function ids(name) {
    const bad = list(name).filter((b) => !/^[0-9]+$/.test(b));
    if (bad.length) throw new Error(`${name}: not a broker id: ${bad.join(", ")}`);
    return list(name).map(Number);
  }
  function conf() {
    return {
      audit_run: form.elements.audit_run.value.trim() || "latest",
      rules: list("rules"),
      brokers: ids("brokers"),
      topics: list("topics"),
      hold_out: ids("hold_out"),
      include_internal: form.elements.include_internal.checked,
      dry_run: form.elements.dry_run.checked,
    };
  }
  function refresh() {
    try {
      preview.textContent = JSON.stringify(conf(), null, 2);
      status.textContent = "";
      button.disabled = false;
    } catch (err) {
      status.textContent = err.message;
      button.disabled = true;
    }
  }
  function detail(text) {
    try {
      const d = JSON.parse(text).detail;
      return typeof d === "string" ? d : JSON.stringify(d);
    } catch (err) {
      return text.slice(0, 300);
    }
  }
  const dagState = document.querySelector('[data-testid="repair-dag-state"]');
  fetch(kafkaFleet.url(`api/v2/dags/${DAG}`), {credentials: "same-origin", headers: {Accept: "application/json"}})
    .then(async (r) => {
      if (r.status === 404) dagState.textContent = `${DAG} is not in Airflow (not parsed yet, or an import error).`;
      else if (r.ok && (await r.json()).is_paused) {
        dagState.textContent = `${DAG} is paused: a run triggered here waits until the DAG is unpaused.`;
      }
      dagState.hidden = !dagState.textContent;
    })
    .catch(() => {});
  const internalNote = document.querySelector('[data-testid="internal-topics-note"]');
  if (internalNote) {
    form.elements.include_internal.addEventListener("change", (ev) => { internalNote.hidden = ev.target.checked; });
  }
  form.addEventListener("input", refresh);
  form.addEventListener("change", refresh);
  refresh();
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    let body;
    try {
      body = {logical_date: null, conf: conf()};
    } catch (err) {
      status.textContent = err.message;
      return;
    }
    button.disabled = true;
    status.textContent = "Triggering…";
    try {
      const r = await fetch(kafkaFleet.url(`api/v2/dags/${DAG}/dagRuns`), {
        method: "POST",
        credentials: "same-origin",  // Airflow's UI authenticates its API calls the same way: the _token cookie
        headers: {"Content-Type": "application/json", Accept: "application/json"},
        body: JSON.stringify(body),
      });
      const text = await r.text();
      if (!r.ok) throw new Error(`Airflow refused the trigger (HTTP ${r.status}): ${detail(text)}`);
      const run = JSON.parse(text);
      const url = kafkaFleet.url(`dags/${DAG}/runs/${encodeURIComponent(run.dag_run_id)}`);
      status.dataset.runId = run.dag_run_id;
      status.textContent = `Triggered ${DAG} run ${run.dag_run_id}.`;
      runLink.href = url;
      runLink.hidden = false;
      if (!kafkaFleet.open(url)) window.location.assign(url);
    } catch (err) {
      status.textContent = err.message;
      button.disabled = false;
    }
  });
})();
"""


def _script(nonce: str, code: str, **consts: Any) -> str:
    head = "".join(f"const {k} = {script_json(v)};\n" for k, v in consts.items())
    body = f"(() => {{\n{head}{code}}})();" if consts else code
    return f'<script nonce="{e(nonce)}">{body}</script>'


OVERVIEW_ROOT = "../"  # Airflow's root seen from the fleet overview (kafka-fleet/)
CLUSTER_ROOT = "../../../"  # and from a cluster's pages (kafka-fleet/clusters/<cluster>/)


def _page(title: str, body: str, nonce: str, scripts: Iterable[str] = (), root: str = CLUSTER_ROOT) -> str:
    return (
        f"<!doctype html><html lang='en' data-airflow-root='{e(root)}'><head><meta charset='utf-8'>"
        f"<title>{e(title)}</title>"
        f"<meta name='referrer' content='same-origin'><style>{CSS}</style></head><body>{body}"
        + _script(nonce, NAV_JS)
        + "".join(scripts)
        + "</body></html>\n"
    )


def with_nav(report: str, nonce: str) -> str:
    """A stored audit report with the view's link handler, so that its links into Airflow (``data-airflow-link``,
    absolute) open in the Airflow window rather than inside the view's frame."""
    head, body_end, tail = report.rpartition("</body>")
    script = _script(nonce, NAV_JS)
    return f"{head}{script}{body_end}{tail}" if body_end else report + script


def airflow_link(path: str, text: str, testid: str = "", extra: str = "", root: str = CLUSTER_ROOT) -> str:
    """A link to an Airflow UI page (``path`` relative to Airflow's root, already URL-encoded), opened in the
    Airflow window; ``root``: Airflow's root relative to the page the link is on."""
    tid = f' data-testid="{e(testid)}"' if testid else ""
    return f'<a href="{e(root)}{e(path)}" data-airflow-link{tid}{extra}>{text}</a>'


def dag_path(dag_id: str, page: str = "") -> str:
    """An Airflow UI path of one DAG (``dags/<id>``, or one of its pages)."""
    return f"dags/{quote(dag_id, safe='')}" + (f"/{page}" if page else "")


def run_path(dag_id: str, run_id: str) -> str:
    return f"dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def _age(finished_at: Any, now: dt.datetime) -> str:
    when = parse_time(finished_at)
    if when is None:
        return ""
    s = int((now - when).total_seconds())
    if s < 0:
        return ""
    if s < 120:
        return f"{s} s ago"
    if s < 7200:
        return f"{s // 60} min ago"
    if s < 172800:
        return f"{s // 3600} h ago"
    return f"{s // 86400} days ago"


def repair_lock(lock: LockState | None, error: str | None, now: dt.datetime) -> str:
    """The repair lock as last seen (``lock_state``): its state, who holds it, when and by whom it was seen."""
    if error:
        return f"<span class='alert' data-testid='repair-lock' data-state='unreadable'>{e(error)}</span>"
    if lock is None:
        return "<span class='muted' data-testid='repair-lock' data-state='unknown'>not seen yet</span>"
    age = _unix_age(lock.observed_at, now)
    state = lock.state
    style = {NEEDS_HUMAN: "alert", HELD: "note", FREE: ""}[state]
    return (
        f"<span class='{style}' data-testid='repair-lock' data-state='{state}'>{e(lock.describe())}</span> "
        f"<span class='muted'>(seen by {e(lock.seen_by)}{f', {e(age)}' if age else ''})</span>"
    )


def _unix_age(ts: float, now: dt.datetime) -> str:
    return _age(dt.datetime.fromtimestamp(ts, dt.UTC).strftime(TIME_FORMAT), now)


def roll_line(roll: RollView | None, now: dt.datetime, cluster: str) -> str:
    """The cluster's roll as its worker last wrote it (``roll_status``): its step, why it is blocked (the gate, what
    holds it, since when), or how it ended; and the operator's standing holds and skips."""
    if roll is None:
        return ""
    out = []
    if roll.error:
        out.append(f"<p>Roll: <span class='alert' data-testid='roll-error'>{e(roll.error)}</span></p>")
    s = roll.status
    if s is not None:
        style = {BLOCKED: "alert", HALTED: "alert", DONE: ""}.get(s.state, "note")
        gate = f" data-gate='{e(s.blocked.gate)}'" if s.blocked else ""
        written = _unix_age(s.updated_at, now)
        line = (
            f"<p>Roll: <span class='{style}' data-testid='roll' data-state='{e(s.state)}'{gate}>"
            f"{e(s.describe())}</span>"
            f" <span class='muted'>(run {e(s.run_id)}, plan {e(s.plan_hash[:12])}"
            f"{f', written {e(written)}' if written else ''}; "
            + airflow_link(dag_path(roll_dag(cluster)), "Roll DAG")
            + ")</span></p>"
        )
        out.append(line)
        if s.blocked is not None and s.state == BLOCKED:
            blocked_for = _unix_age(s.blocked.since, now).removesuffix(" ago")
            items = "".join(f"<li>{e(x)}</li>" for x in s.blocked.items[:20])
            more = f"<li>… {len(s.blocked.items) - 20} more</li>" if len(s.blocked.items) > 20 else ""
            out.append(
                f"<div data-testid='roll-blocked' data-gate='{e(s.blocked.gate)}'><p>Blocked at gate "
                f"<b>{e(s.blocked.gate)}</b>{f' for {e(blocked_for)}' if blocked_for else ''}: {e(s.blocked.why)}</p>"
                f"<ul>{items}{more}</ul></div>"
            )
    said = roll.control.said()
    if said:
        items = "".join(f"<li data-broker='{b}'>broker {b}: {e(why)}</li>" for b, why in said.items())
        out.append(
            f"<div data-testid='roll-controls'><p>Held or skipped for every roll until released "
            f"(<span class='mono'>bin/fleet-doctor roll-control {e(cluster)} release BROKER</span>):</p>"
            f"<ul>{items}</ul></div>"
        )
    return "".join(out)


def _brokers(ids: Any) -> str:
    return ", ".join(e(str(b)) for b in ids or []) or "none"


def _latest(view: FleetView, now: dt.datetime) -> str:
    s = view.summary
    assert s is not None  # fleet_page shows the latest audit only when there is one
    run = s.audit_run or str(view.latest)
    out = ["<section id='latest'><h2>Latest audit</h2>"]
    age = _age(s.finished_at or None, now)
    out.append(
        f"<p>Run <span class='mono' data-testid='audit-run'>{e(run)}</span>, finished "
        f"{e(s.finished_at or 'at an unknown time')}{f' ({e(age)})' if age else ''}. "
        f"<a href='reports/{quote(run, safe='')}.html' data-testid='report-link'>Full report</a></p>"
    )
    if view.missing_summary:
        out.append(
            f"<p class='note'>The summary of this run (reports/{e(run)}.json) is not in the store: the run was "
            "published only in part. Its findings are shown as the history has them.</p>"
        )
    out.append("<div class='cards'>")
    for sev in SEVERITY_ORDER:
        n = int(s.by_severity.get(sev, 0))
        out.append(f"<div class='card' data-testid='count-{sev}'><b class='{sev}'>{n}</b>{sev}</div>")
    for st in (FindingStatus.NEW, FindingStatus.RESOLVED, FindingStatus.UNVERIFIED):
        out.append(f"<div class='card' data-testid='count-{st}'><b>{int(s.by_status.get(st, 0))}</b>{st}</div>")
    out.append("</div>")
    out.append(f"<p data-testid='audited'>Brokers audited: {_brokers(s.audited)}.</p>")
    if s.not_audited:
        out.append(
            f"<p class='alert' data-testid='not-audited'>Not audited (could not be reached): broker(s) "
            f"{_brokers(s.not_audited)}. Their earlier findings are carried as <i>unverified</i>.</p>"
        )
    if s.out_of_scope:
        out.append(
            f"<p class='note' data-testid='out-of-scope'>Out of this run's scope: broker(s) "
            f"{_brokers(s.out_of_scope)}. A repair plans from the newest whole-fleet run.</p>"
        )
    for label, brokers in registry_notes(s):
        out.append(f"<p class='note'>{e(label)}: broker(s) {_brokers(brokers)}.</p>")
    for value, label in ((s.zookeeper_error, "ZooKeeper"), (s.metadata_error, "Cluster metadata not read")):
        if value:
            out.append(f"<p class='alert'>{e(label)}: {e(str(value))}</p>")
    skipped = s.rules_skipped or {}
    if skipped:
        items = "".join(f"<li>{e(str(r))}: {e(str(why))}</li>" for r, why in sorted(skipped.items()))
        out.append(f"<details><summary>{len(skipped)} rule(s) not evaluated</summary><ul>{items}</ul></details>")
    out.append("</section>")
    return "".join(out)


def _matrix(groups: list[FindingGroup]) -> str:
    columns, rows = matrix(groups)
    out = ["<section id='matrix'><h2>Findings by rule and broker</h2>"]
    out.append(
        "<div class='scroll'><table data-testid='matrix'><tr><th>rule</th>"
        + "".join(f"<th class='num'>{'cluster' if c == 'cluster' else 'broker ' + e(c)}</th>" for c in columns)
        + "</tr>"
    )
    for rule, cells in rows.items():
        tds = []
        for c in columns:
            if c in cells:
                n, sev = cells[c]
                tds.append(f"<td class='num cell-{e(sev)}' title='{e(sev)}'>{n}</td>")
            else:
                tds.append("<td></td>")
        out.append(f"<tr><td>{e(rule)}</td>{''.join(tds)}</tr>")
    out.append("</table></div></section>")
    return "".join(out)


def _files(group: FindingGroup) -> str:
    files = distinct(group.paths)
    items = "".join(
        f"<li class='mono'>{e(p or '(no file)')}{f' <span class=muted>×{n}</span>' if n > 1 else ''}</li>"
        for p, n in files[:MAX_FILES]
    )
    more = f"<li class='muted'>… and {len(files) - MAX_FILES} more</li>" if len(files) > MAX_FILES else ""
    label = f"{len(files)} file{'s' if len(files) != 1 else ''}"
    return f"<details data-testid='group-files'><summary>{label}</summary><ul>{items}{more}</ul></details>"


def repair_link(group: FindingGroup) -> str:
    scope = RepairScope.of_group(group)
    where = "the cluster" if group.broker_id is None else f"broker {group.broker_id}"
    title = f"Plan a repair of {group.rule} on {where}" + (f", {len(scope.topics)} topic(s)" if scope.topics else "")
    return f"<a href='repair?{e(scope.query())}' data-testid='repair-link' title='{e(title)}'>Repair…</a>"


def _group_rows(groups: list[FindingGroup], *, actions: bool) -> str:
    rows = []
    for g in groups:
        statuses = g.statuses
        status = ", ".join(f"{statuses[st]} {st}" for st in STATUSES if statuses.get(st))
        parts = g.partitions
        action = ""
        if actions:
            link = repair_link(g) if is_repairable(g) else "<span class='muted'>report only</span>"
            action = f"<td class='nowrap'>{link}</td>"
        rows.append(
            f"<tr data-testid='finding-group' data-broker='{e(broker_label(g.broker_id))}' data-rule='{e(g.rule)}' "
            f"data-count='{g.count}' data-severity='{e(g.severity)}'>"
            f"<td class='{e(g.severity)}'>{e(g.severity)}</td><td>{e(broker_label(g.broker_id))}</td>"
            f"<td class='nowrap'>{e(g.rule)}</td><td class='num'>{g.count}</td>"
            f"<td class='num'>{parts or ''}</td><td class='topics'>{e(g.topics_text(MAX_TOPICS))}</td>"
            f"<td>{e(status)}</td>"
            f"<td class='example'><div class='msg'>{e(g.example)}</div>{_files(g)}</td>{action}</tr>"
        )
    return "".join(rows)


def _rule_repairs(groups: list[FindingGroup]) -> str:
    """Each repairable rule's repair across every broker it was found on: one plan for a cluster-wide incident
    (seed-004's drift is on every replica of the topic), beside the per-group links."""
    by_rule: dict[str, list[FindingGroup]] = {}
    for g in groups:
        if is_repairable(g):
            by_rule.setdefault(g.rule, []).append(g)
    if not by_rule:
        return ""
    items = []
    for rule, gs in by_rule.items():
        brokers = sorted({broker_label(g.broker_id) for g in gs}, key=lambda b: (b == "cluster", b.zfill(12)))
        scope = RepairScope.of_rule(gs)
        where = f"{len(brokers)} broker(s): {', '.join(brokers)}" if brokers != ["cluster"] else "the cluster"
        topics = f"; topics {', '.join(scope.topics[:MAX_TOPICS])}" if scope.topics else ""
        more = f" and {len(scope.topics) - MAX_TOPICS} more" if len(scope.topics) > MAX_TOPICS else ""
        items.append(
            f"<li data-testid='rule-repair' data-rule='{e(rule)}'><a href='repair?{e(scope.query())}' "
            f"data-testid='rule-repair-link'>Repair {e(rule)} on every broker…</a> "
            f"<span class='muted'>{sum(g.count for g in gs)} finding(s) on {e(where)}{e(topics)}{e(more)}: one plan, "
            "the controller restarted last</span></li>"
        )
    return (
        "<p>A rule's findings across the cluster, as one repair:</p><ul data-testid='rule-repairs'>"
        + "".join(items)
        + "</ul>"
    )


def _groups(view: FleetView) -> str:
    groups = view.groups
    out = ["<section id='findings'><h2>Findings</h2>"]
    if not groups:
        out.append("<p data-testid='no-findings'>No findings in the latest audit.</p></section>")
        return "".join(out)
    total = sum(g.count for g in groups)
    out.append(
        f"<p class='muted'>{total} finding(s) in {len(groups)} group(s): one row per broker, rule and cause, "
        "the files behind each. <i>Repair…</i> opens the repair DAG's trigger, pre-filled with the group's rule, "
        "broker and topics; nothing changes on a broker before a person approves the plan.</p>"
    )
    out.append(_rule_repairs(groups))
    out.append(f"<table data-testid='finding-groups'><tr>{GROUP_HEADER}<th></th></tr>")
    out.append(_group_rows(groups, actions=True))
    out.append("</table></section>")
    return _matrix(groups) + "".join(out)


def _resolved(view: FleetView) -> str:
    groups = view.resolved
    previous = view.summary.previous_run if view.summary else None
    since = f" (run <span class='mono'>{e(str(previous))}</span>)" if previous else ""
    out = [f"<section id='resolved'><h2>Resolved since the previous run{since}</h2>"]
    if not groups:
        out.append("<p data-testid='no-resolved'>Nothing resolved.</p></section>")
        return "".join(out)
    total = sum(g.count for g in groups)
    out.append(
        f"<details{' open' if len(groups) <= 20 else ''}><summary>{total} finding(s) in {len(groups)} group(s)"
        f"</summary><table data-testid='resolved-groups'><tr>{GROUP_HEADER}</tr>"
    )
    rows = _group_rows(groups, actions=False)
    out.append(rows.replace("data-testid='finding-group'", "data-testid='resolved-group'"))
    out.append("</table></details></section>")
    return "".join(out)


def _trend(view: FleetView, last: int) -> str:
    runs = view.runs[-last:]
    out = [f"<section id='trend'><h2>Trend: the last {len(runs)} run(s)</h2>"]
    out.append(f"<div data-testid='trend'>{svg_history(runs)}</div>")
    out.append(
        "<p class='legend'>"
        + "".join(f"<span><i class='sw {s}'></i>{s}</span>" for s in SEVERITY_ORDER)
        + "<span class='muted'>unverified findings (brokers not audited) are not counted</span></p>"
    )
    out.append(
        "<details><summary>runs</summary><table data-testid='runs'><tr><th>run</th><th>finished</th>"
        + "".join(f"<th class='num'>{s}</th>" for s in SEVERITY_ORDER)
        + "<th class='num'>new</th><th class='num'>resolved</th><th>not audited</th><th>out of scope</th></tr>"
    )
    for r in reversed(runs):
        sev, st = r.get("by_severity") or {}, r.get("by_status") or {}
        out.append(
            f"<tr data-testid='run' data-run='{e(str(r['audit_run']))}'><td class='mono'>{e(str(r['audit_run']))}</td>"
            f"<td>{e(str(r.get('finished_at') or ''))}</td>"
            + "".join(f"<td class='num'>{int(sev.get(s, 0))}</td>" for s in SEVERITY_ORDER)
            + f"<td class='num'>{int(st.get('new', 0))}</td><td class='num'>{int(st.get('resolved', 0))}</td>"
            f"<td>{_brokers(r.get('not_audited')) if r.get('not_audited') else ''}</td>"
            f"<td>{_brokers(r.get('out_of_scope')) if r.get('out_of_scope') else ''}</td></tr>"
        )
    out.append("</table></details></section>")
    return "".join(out)


def _nav(cluster: str) -> str:
    return (
        "<nav>"
        + "<a href='../../' data-testid='fleet-link'>← Kafka fleet</a>"
        # the repair's and the restore's approvals: Airflow's Required Actions of every DAG (one page lists both)
        + airflow_link("required_actions", "Pending approvals", "required-actions-link")
        + " <span data-testid='required-actions-count' class='muted'></span> "
        + airflow_link(dag_path(repair_dag(cluster)), "Repair DAG")
        + airflow_link(dag_path(restore_dag(cluster)), "Restore DAG")
        + airflow_link(dag_path(audit_dag(cluster)), "Audit DAG")
        + "</nav>"
    )


def fleet_page(
    view: FleetView,
    nonce: str,
    *,
    cluster: str,
    last: int = 30,
    now: dt.datetime | None = None,
    lock: LockState | None = None,
    lock_error: str | None = None,
    roll: RollView | None = None,
) -> str:
    """A cluster's page: the repair lock, the roll, the latest audit, its findings grouped, what was resolved, the
    trend over the last runs."""
    now = now or dt.datetime.now(dt.UTC)
    lock_line = f"<p>Repair lock: {repair_lock(lock, lock_error, now)}</p>" + roll_line(roll, now, cluster)
    scripts = [_script(nonce, PENDING_JS, DAGS=list(approval_dags(cluster)))]
    if view.summary is None:
        body = (
            f"<main data-testid='kafka-fleet' data-cluster='{e(cluster)}'>"
            f"<h1>Kafka fleet: cluster <span data-testid='cluster'>{e(cluster)}</span></h1>"
            + _nav(cluster)
            + lock_line
            + f"<p data-testid='no-audit'>No audit has been published in <span class='mono'>{e(view.store_url)}</span>"
            " yet: run the " + airflow_link(dag_path(audit_dag(cluster)), e(audit_dag(cluster))) + " DAG.</p></main>"
        )
        return _page(f"Kafka fleet: {cluster}", body, nonce, scripts)
    run = view.summary.audit_run or str(view.latest)
    body = (
        f"<main data-testid='kafka-fleet' data-cluster='{e(cluster)}' data-audit-run='{e(run)}'>"
        f"<h1>Kafka fleet: cluster <span data-testid='cluster'>{e(cluster)}</span></h1>"
        + _nav(cluster)
        + lock_line
        + _latest(view, now)
        + _groups(view)
        + _resolved(view)
        + _trend(view, last)
        + f"<p class='muted'>Read from <span class='mono'>{e(view.store_url)}</span>.</p></main>"
    )
    return _page(f"Kafka fleet: {cluster}", body, nonce, scripts)


FLEET_PENDING_JS = """
(() => {
  "use strict";
  // every cluster's approvals waiting for a person in one query (the repair and restore DAGs' ids start with the
  // prefixes below), counted per cluster into its row
  const found = document.querySelectorAll("[data-testid='pending'][data-cluster]");
  const cells = new Map([...found].map((c) => [c.dataset.cluster, c]));
  if (!cells.size) return;
  const query = "api/v2/dags/~/dagRuns/~/hitlDetails?response_received=false&limit=1000&dag_id_prefix_pattern=";
  const get = (prefix) =>
    fetch(kafkaFleet.url(query + encodeURIComponent(prefix)), {
      credentials: "same-origin",
      headers: {Accept: "application/json"},
    }).then((r) => (r.ok ? r.json() : Promise.reject(new Error(`HTTP ${r.status}`))));
  Promise.all(PREFIXES.map(get)).then((pages) => {
    const counts = new Map();
    for (const page of pages) {
      for (const item of page.hitl_details || []) {
        const dag = (item.task_instance || {}).dag_id || "";
        const prefix = PREFIXES.find((p) => dag.startsWith(p));
        if (prefix) counts.set(dag.slice(prefix.length), (counts.get(dag.slice(prefix.length)) || 0) + 1);
      }
    }
    for (const [cluster, cell] of cells) {
      const n = counts.get(cluster) || 0;
      cell.dataset.count = String(n);
      cell.textContent = String(n);
    }
  }).catch((err) => {
    for (const cell of cells.values()) cell.textContent = "?";
  });
})();
"""

SORT_JS = """
(() => {
  "use strict";
  // a click on a column header sorts the table by it (again: the other way); numbers as numbers
  const table = document.querySelector("[data-testid='clusters']");
  if (!table) return;
  const heads = [...table.querySelectorAll("th[data-sort]")];
  heads.forEach((th, i) => th.addEventListener("click", () => {
    const desc = th.dataset.dir !== "desc";
    heads.forEach((h) => delete h.dataset.dir);
    th.dataset.dir = desc ? "desc" : "asc";
    const rows = [...table.querySelectorAll("tr[data-testid='cluster-row']")];
    const key = (tr) => tr.children[i].dataset.value ?? tr.children[i].textContent;
    const num = th.dataset.sort === "num";
    rows.sort((a, b) => {
      const x = key(a), y = key(b);
      const c = num ? Number(x) - Number(y) : x.localeCompare(y);
      return desc ? -c : c;
    });
    rows.forEach((tr) => table.tBodies[0].appendChild(tr));
  }));
})();
"""


def _spark(runs: list[dict[str, Any]], last: int = 10) -> str:
    """A small trend: critical and warning findings of the last runs, one bar each (inline SVG)."""
    runs = runs[-last:]
    if not runs:
        return ""
    counts = [[int((r.get("by_severity") or {}).get(s, 0)) for s in ("critical", "warning")] for r in runs]
    top = max(sum(c) for c in counts) or 1
    bars = []
    for i, (crit, warn) in enumerate(counts):
        hc, hw = round(16 * crit / top), round(16 * warn / top)
        bars.append(f"<rect x='{i * 6}' y='{16 - hc - hw}' width='5' height='{hw}' fill='#e67e22'/>")
        bars.append(f"<rect x='{i * 6}' y='{16 - hc}' width='5' height='{hc}' fill='#c0392b'/>")
    title = ", ".join(f"{c}/{w}" for c, w in counts)
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{len(runs) * 6}' height='16' role='img' "
        f"data-testid='spark'><title>critical/warning, oldest first: {e(title)}</title>{''.join(bars)}</svg>"
    )


def _roll_mark(row: ClusterRow) -> str:
    """In the overview's lock cell: a roll blocked or halted now, and the gate."""
    s = row.roll.status if row.roll else None
    if s is None or s.state not in (BLOCKED, HALTED):
        return ""
    what = f"roll blocked at {s.blocked.gate}" if s.state == BLOCKED and s.blocked else f"roll {s.state}"
    return f" <span class='alert' data-testid='roll-mark' data-state='{e(s.state)}'>{e(what)}</span>"


def _lock_rank(row: ClusterRow) -> int:
    """The lock column's sort value: left for a person, held, unreadable, not seen, free."""
    if row.lock_error:
        return 2
    if row.lock is None:
        return 1
    return {NEEDS_HUMAN: 4, HELD: 3, FREE: 0}[row.lock.state]


def _cluster_row(row: ClusterRow, now: dt.datetime) -> str:
    s = row.summary
    link = f"<a href='clusters/{quote(row.cluster, safe='')}/' data-testid='cluster-link'>{e(row.cluster)}</a>"
    if row.error:
        last, state, value = f"<span class='alert'>{e(row.error)}</span>", "unreadable", ""
    elif s is None:
        last, state, value = "<span class='muted'>no audit yet</span>", "none", ""
    else:
        age = _age(s.finished_at, now)
        last = f"{e(s.finished_at or '')}" + (f" <span class='muted'>({e(age)})</span>" if age else "")
        state, value = ("partial" if s.out_of_scope else "ok"), str(s.finished_at or "")
    if row.stale and row.error is None:
        state = "stale"
        last += f" <span class='note' data-testid='stale' title='{e(f'schedule {row.schedule}')}'>stale</span>"
    runs = row.view.runs if row.view else []
    return (
        f"<tr data-testid='cluster-row' data-cluster='{e(row.cluster)}' data-state='{e(state)}'>"
        f"<td>{link}</td><td>{e(row.metadata_mode)}</td><td>{e(', '.join(row.kafka_versions))}</td>"
        f"<td class='num'>{row.brokers}</td><td data-value='{e(value)}'>{last}</td>"
        f"<td class='num critical' data-testid='critical'>{row.count('critical')}</td>"
        f"<td class='num warning' data-testid='warning'>{row.count('warning')}</td>"
        f"<td>{_spark(runs)}</td>"
        f"<td data-testid='not-audited' data-value='{len(row.not_audited)}'>"
        f"{_brokers(row.not_audited) if row.not_audited else ''}</td>"
        f"<td class='num' data-testid='pending' data-cluster='{e(row.cluster)}'></td>"
        f"<td data-value='{_lock_rank(row)}'>{repair_lock(row.lock, row.lock_error, now)}{_roll_mark(row)}</td></tr>"
    )


def overview_page(
    rows: list[ClusterRow],
    problems: list[InventoryProblem],
    nonce: str,
    *,
    hidden: int = 0,
    now: dt.datetime | None = None,
) -> str:
    """The fleet overview: one row per cluster the user may read, worst first; the inventory files that give no
    cluster. ``hidden``: clusters not shown (the user may not read their audit DAG)."""
    now = now or dt.datetime.now(dt.UTC)
    out = ["<main data-testid='kafka-fleet-overview'><h1>Kafka fleet</h1>"]
    out.append(
        "<nav>"
        + airflow_link("required_actions", "Pending approvals", "required-actions-link", root=OVERVIEW_ROOT)
        + "</nav>"
    )
    if hidden and problems:  # a broken file may be another team's cluster: its paths and fields are not theirs to see
        out.append(
            f"<p class='alert' data-testid='inventory-problems-hidden'>{len(problems)} inventory file(s) of the fleet "
            "give no cluster; someone who may read every cluster's audit DAG sees which and why.</p>"
        )
    for p in problems if not hidden else ():
        out.append(f"<p class='alert' data-testid='inventory-problem' data-path='{e(p.path)}'>{e(p.message)}</p>")
    if not rows:
        why = f"{hidden} not readable by you" if hidden else "FLEET_DOCTOR_INVENTORY names none (docs/fleet.md)"
        out.append(f"<p data-testid='no-clusters'>No cluster to show: {e(why)}.</p></main>")
        return _page("Kafka fleet", "".join(out), nonce, root=OVERVIEW_ROOT)
    out.append(
        f"<p class='muted'>{len(rows)} cluster(s), worst first (critical, then warning findings, then brokers not "
        "audited, then a repair lock left for a person, then stale audits); click a column to sort. A cluster's "
        "name opens its page."
        + (f" {hidden} cluster(s) not shown: you may not read their audit DAG." if hidden else "")
        + "</p>"
    )
    out.append(
        "<table data-testid='clusters'><thead><tr><th data-sort='text'>cluster</th><th data-sort='text'>metadata</th>"
        "<th data-sort='text'>Kafka</th><th data-sort='num' class='num'>brokers</th>"
        "<th data-sort='text'>last audit</th><th data-sort='num' class='num'>critical</th>"
        "<th data-sort='num' class='num'>warning</th><th>trend</th><th data-sort='num'>not audited</th>"
        "<th data-sort='num' class='num'>pending approvals</th><th data-sort='num'>repair lock</th></tr></thead>"
        "<tbody>"
    )
    out += [_cluster_row(r, now) for r in sorted(rows, key=ClusterRow.sort_key)]
    out.append("</tbody></table></main>")
    prefixes = [f"{REPAIR_DAG}{SEPARATOR}", f"{RESTORE_DAG}{SEPARATOR}"]
    scripts = [_script(nonce, FLEET_PENDING_JS, PREFIXES=prefixes), _script(nonce, SORT_JS)]
    return _page("Kafka fleet", "".join(out), nonce, scripts, root=OVERVIEW_ROOT)


def error_page(message: str, nonce: str, cluster: str | None = None) -> str:
    """An error instead of a page (a cluster's, or the overview's when ``cluster`` is None)."""
    body = (
        "<main data-testid='kafka-fleet'><h1>Kafka fleet"
        + (f": cluster {e(cluster)}" if cluster else "")
        + "</h1>"
        + (_nav(cluster) if cluster else "")
        + f"<p class='alert' data-testid='error'>{e(message)}</p></main>"
    )
    return _page("Kafka fleet", body, nonce, root=CLUSTER_ROOT if cluster else OVERVIEW_ROOT)


def _text(name: str, label: str, hint: str, value: str) -> str:
    return (
        f"<label for='{name}'>{e(label)} <span class='hint'>{e(hint)}</span></label>"
        f"<input type='text' id='{name}' name='{name}' value='{e(value)}' autocomplete='off' spellcheck='false'>"
    )


def _check(name: str, label: str, hint: str, checked: bool) -> str:
    return (
        f"<div class='check'><input type='checkbox' id='{name}' name='{name}'{' checked' if checked else ''}>"
        f"<label for='{name}'>{e(label)} <span class='hint'>{e(hint)}</span></label></div>"
    )


def repair_page(scope: RepairScope, problems: list[str], nonce: str, *, cluster: str) -> str:
    """The cluster's repair DAG's trigger form, pre-filled from ``scope``; its script posts the run to Airflow's
    REST API as the logged-in user and opens the new run."""
    dag = repair_dag(cluster)
    problems_html = "".join(f"<p class='alert'>{e(p)}</p>" for p in problems)
    note = scope.internal_topics_note()
    if note:
        problems_html += f"<p class='alert' data-testid='internal-topics-note'>{e(note)}</p>"
    body = (
        "<main data-testid='kafka-fleet-repair'><p>"
        + f"<a href='./'>← Kafka fleet: cluster {e(cluster)}</a></p>"
        + f"<h1>Trigger <span class='mono' data-testid='repair-dag'>{e(dag)}</span></h1>"
        + f"<p>This starts a repair <b>plan</b> of cluster <b>{e(cluster)}</b> for the scope below. Nothing changes on "
        "a broker until a person approves the plan in "
        + airflow_link(dag_path(dag, "required_actions"), "Required Actions")
        + ", where "
        "the approval shows exactly which files are backed up and removed and the restart order. Empty fields mean "
        "all (every repairable rule, every broker, every topic).</p>"
        + problems_html
        + "<p class='note' data-testid='repair-dag-state' hidden></p>"
        + "<form data-testid='repair-form' autocomplete='off'>"
        + _text("audit_run", "Audit run", "(an audit run id, or latest: the newest whole-fleet audit)", scope.audit_run)
        + _text("rules", "Rules", "(comma-separated rule ids)", ", ".join(scope.rules))
        + _text("brokers", "Brokers", "(comma-separated broker ids)", ", ".join(map(str, scope.brokers)))
        + _text("topics", "Topics", "(comma-separated)", ", ".join(scope.topics))
        + _text("hold_out", "Hold out", "(broker ids left out of this run)", "")
        + _check(
            "include_internal",
            "Include internal topics",
            "(__consumer_offsets, __transaction_state)",
            scope.include_internal,
        )
        + _check(
            "dry_run",
            "Dry run",
            "(do every read and check and log the commands, change nothing on a broker)",
            scope.dry_run,
        )
        + "<p class='muted'>The other settings (pauses, health polls, ISR timeout) keep the DAG's defaults. "
        "Run conf sent:</p><pre data-testid='repair-conf'></pre>"
        + "<button type='submit' data-testid='trigger-repair'>Trigger repair plan</button> "
        "<p data-testid='repair-status' role='status'></p>"
        "<p><a data-testid='repair-run-link' data-airflow-link hidden>Open the run</a></p>"
        "</form></main>"
    )
    return _page(f"Kafka fleet: repair {cluster}", body, nonce, [_script(nonce, REPAIR_JS, DAG=dag)])
