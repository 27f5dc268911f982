"""Everything the approver reads: the subject, the Markdown text and the approving option of each approval request
(the repair's brokers, its preventive ZooKeeper write, a restore), rendered from the stored plan and from nothing
else, so that the acting task can render them again and compare them with what Airflow showed
(``repair.approval.check``).

Every value that comes from a broker (a path, a topic, a topic ID) goes through ``md_cell`` or ``plain``: it stays
one inline value whatever it holds. Each text is bounded whatever the plan's size (the request's buttons come after
it): at most ``FILES_SHOWN`` files per group and ``ROWS_SHOWN`` rows of each list, the rest named by ``plan.json``.
Each ends with the plan's full hash on a line of its own (``HASH_LINE``), which the acting task checks.
"""

from __future__ import annotations

import re
import unicodedata
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from fleet_doctor.airflow_links import restore_dag
from fleet_doctor.finding_groups import group_findings
from fleet_doctor.layout import PLAN
from fleet_doctor.repair.plan import QUARANTINE_DIR, STRAY_QUARANTINE_DIR, BrokerPlan, Plan
from fleet_doctor.rules import INTERNAL_TOPICS, RULES_BY_ID
from fleet_doctor.zookeeper.cluster import CLUSTER_DEFAULT_PATH

_BACKTICKS = re.compile(r"`+")
FILES_SHOWN = 5  # files listed per group in an approval text: the buttons come after it; plan.json has them all
ROWS_SHOWN = 10  # ZooKeeper topics and unaddressed groups listed, likewise
HASH_LINE = "Plan hash: `{}`"  # the last line of every approval text: the acting task checks it (repair.approval)
_HASH_LINES = re.compile(r"^Plan hash: `([0-9a-f]{64})`$", re.MULTILINE)
_SHOWN_AS = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


@dataclass(frozen=True)
class Request:
    """One approval request as the stored plan renders it: its headline, its Markdown text and the one option that
    approves it (the subject says "DRY RUN" for a dry run)."""

    subject: str
    body: str
    option: str


def repair_request(plan: Plan, plan_dir: str | None = None) -> Request:
    """The approval of the plan's broker chain (``plan_dir``: where plan.json is, named for the full lists)."""
    return Request(repair_subject(plan), repair_markdown(plan, plan_dir), repair_option(plan))


def zookeeper_request(plan: Plan, plan_dir: str | None = None) -> Request:
    """The approval of the plan's preventive ZooKeeper actions."""
    return Request(zookeeper_subject(plan), zookeeper_markdown(plan, plan_dir), zookeeper_option(plan))


def restore_request(plan: Plan) -> Request:
    """The approval of a restore plan (``repair.restore``)."""
    return Request(restore_subject(plan), restore_markdown(plan), restore_option(plan))


def purge_request(plan: Plan, plan_dir: str | None = None) -> Request:
    """The approval of a plan deleting a repair's quarantine (``repair.purge``)."""
    return Request(purge_subject(plan), purge_markdown(plan, plan_dir), purge_option(plan))


def _visible(ch: str) -> str:
    """A character that could start a new line or hide what follows (control, format such as a right-to-left
    override, line and paragraph separators) as its escape: ``\\n``, ``\\x1b``, ``\\u202e``."""
    if unicodedata.category(ch) not in ("Cc", "Cf", "Zl", "Zp"):
        return ch
    return _SHOWN_AS.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")


def plain(text: object) -> str:
    """A value for one line of plain text (the approval's subject): control characters shown as escapes."""
    return "".join(map(_visible, str(text)))


def md_cell(text: object, table: bool = True) -> str:
    """A value that comes from a broker (a path, a topic, a topic ID; any name on a broker's disk) as a Markdown
    code span that stays one inline value whatever it holds: inside a code span Markdown and HTML are literal
    (``<script>``, ``[x](javascript:...)``, ``**``), control characters and line breaks are shown as escapes, the
    fence is one backtick longer than any run of backticks inside, and in a table row ``|`` is escaped (GFM splits
    cells on a bare pipe even inside a code span)."""
    s = plain(text)
    if not s:
        return "(empty)"
    if table:
        s = s.replace("|", "\\|")
    fence = "`" * (max((len(m) for m in _BACKTICKS.findall(s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or (s.startswith(" ") and s.endswith(" ")) else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def repair_option(plan: Plan) -> str:
    """The approval's one "yes" (an option of the request): what approving this plan does, and which plan. The
    acting task accepts exactly this answer (``repair.approval.check``), derived from the stored plan."""
    n, files = len(plan.restart_order), plan.files
    if plan.dry_run:
        return f"Approve dry run: {n} {_s(n, 'broker')}, nothing written (plan {plan.hash[:12]})"
    return f"Approve: restart {n} {_s(n, 'broker')}, change {files} {_s(files, 'file')} (plan {plan.hash[:12]})"


def zookeeper_option(plan: Plan) -> str:
    n = len(plan.zookeeper)
    if plan.dry_run:
        return f"Approve dry run: {n} topic {_s(n, 'ID')}, nothing written (plan {plan.hash[:12]})"
    return f"Approve: write {n} topic {_s(n, 'ID')} to ZooKeeper (plan {plan.hash[:12]})"


def repair_subject(plan: Plan) -> str:
    c = plan.counts()
    return (
        f"Kafka repair {plain(plan.cluster)} plan {plan.hash[:12]}: {'DRY RUN, ' if plan.dry_run else ''}"
        f"restart {c['brokers_restarted']} broker(s), remove {c['files_removed']} and quarantine "
        f"{c['files_quarantined']} file(s)"
        + (f" and {c['replicas_quarantined']} stray replica(s)" if c["replicas_quarantined"] else "")
    )


def zookeeper_subject(plan: Plan) -> str:
    return (
        f"Kafka repair {plain(plan.cluster)} plan {plan.hash[:12]}: {'DRY RUN, ' if plan.dry_run else ''}"
        f"write back the topic ID of {len(plan.zookeeper)} topic(s) in ZooKeeper (preventive)"
    )


def hash_line(plan: Plan) -> str:
    """The full plan hash, in both approval texts: the task that acts checks the answer was given to it."""
    return HASH_LINE.format(plan.hash)


def _dry_run_lines(plan: Plan) -> list[str]:
    if not plan.dry_run:
        return []
    return [
        "**DRY RUN: nothing will be written.** Every read and check runs and every command is logged; no file "
        "changes, no broker stops, no ZooKeeper write.",
        "",
    ]


def _undo_line(plan: Plan, plan_dir: str) -> str:
    return (
        f"- **Undo:** trigger `{restore_dag(plan.cluster)}` with plan `{plan.hash[:16]}`: it puts this plan's backups "
        f"back (its own approval, the controller last); what was moved and never copied (stray replicas, leftovers) "
        f"is moved back by hand. Full plan: {md_cell(f'{plan_dir}/{PLAN}', table=False)}."
    )


def zookeeper_markdown(plan: Plan, plan_dir: str | None = None) -> str:
    """The text of the ZooKeeper approval: a summary first, then the topics (at most ``ROWS_SHOWN``)."""
    if not plan.zookeeper:
        return "No ZooKeeper action in this plan.\n"
    where = plan_dir or f"<repairs dir>/{plan.hash}"
    n = len(plan.zookeeper)
    out = [
        f"### Preventive ZooKeeper repair, plan `{plan.hash[:12]}`, cluster {md_cell(plan.cluster, table=False)}",
        "",
        *_dry_run_lines(plan),
        f"- **What:** write back the lost `topic_id` of {n} topic znode(s), the ID every replica's "
        "`partition.metadata` agrees on, with a version-checked update after re-reading every replica.",
        f"- **Where:** cluster {md_cell(plan.cluster, table=False)}, ZooKeeper only: no broker restarts.",
        "- **Risk:** none to running clients. Without it, the next controller failover mints a **new** ID and "
        "every replica goes out of ISR (KAFKA-14190).",
        f"- **Undo:** remove the `topic_id` field from the znode again (zookeeper-shell `set`). Full plan: "
        f"{md_cell(f'{where}/{PLAN}', table=False)}.",
        "",
        hash_line(plan),
        "",
        "| topic | topic ID written | why |",
        "|---|---|---|",
    ]
    out += [f"| {md_cell(z.topic)} | {md_cell(z.topic_id)} | {z.reason} |" for z in plan.zookeeper[:ROWS_SHOWN]]
    if n > ROWS_SHOWN:
        out += ["", f"… and {n - ROWS_SHOWN} more topic(s): full list in {md_cell(f'{where}/{PLAN}', False)}."]
    return "\n".join(out) + "\n"


def _internal_lines(plan: Plan) -> list[str]:
    """With ``include_internal`` (ticked by a person), the summary says so and names the internal topics the
    plan touches: their replicas are otherwise never part of a topic-ID repair."""
    if not plan.scope.get("include_internal"):
        named = [t for t in plan.scope.get("topics") or () if t in INTERNAL_TOPICS]
        if not named:
            return []
        shown = ", ".join(md_cell(t, table=False) for t in named)
        return [
            f"- **Internal topics named, not included:** {shown}: their replicas are left out of the topic-ID "
            "repair; a quarantine of their broken index files is planned all the same."
        ]
    touched: dict[str, set[tuple[int, int | None]]] = defaultdict(set)
    for b in plan.brokers:
        for a in b.actions:
            if a.topic in INTERNAL_TOPICS:
                touched[a.topic].add((b.broker_id, a.partition))
    shown = [
        f"{md_cell(t, table=False)} ({len({n for _, n in touched[t]})} partition(s), {len(touched[t])} replica(s))"
        for t in sorted(touched)
    ]
    return [f"- **Internal topics included:** {', '.join(shown) or 'none of them is touched by this plan'}."]


def repair_markdown(plan: Plan, plan_dir: str | None = None) -> str:
    """The text of the broker approval: a summary (what, where, how many, risk, the full hash, backups, undo),
    the restart preview, then the details per broker, one block per group of files (``finding_groups``), at
    most ``FILES_SHOWN`` files each, and each rule's "why" once. ``plan_dir``: where plan.json is, named for
    the full lists (the request's buttons come after the text: it stays short whatever the plan's size)."""
    c = plan.counts()
    where = plan_dir or f"<repairs dir>/{plan.hash}"
    order = " → ".join(map(str, plan.restart_order)) or "none"
    controller = next((b.broker_id for b in plan.brokers if b.is_controller), None)
    if controller is None:
        ctl = " (no active controller in the audit's snapshot)"
    elif controller in plan.restart_order:
        ctl = f" (the active controller, broker {controller}, last)"
    else:
        ctl = f" (the active controller, broker {controller}, is not restarted)"
    rules = sorted({a.rule for b in plan.brokers for a in b.actions})
    what = []
    if c["files_removed"]:
        what.append(f"back up and remove {c['files_removed']} topic-ID file(s)")
    indexes = c["files_quarantined"] - c["leftovers_quarantined"]
    if indexes:
        what.append(f"quarantine {indexes} index file(s) (moved aside, Kafka rebuilds them)")
    if c["leftovers_quarantined"]:
        what.append(
            f"quarantine {c['leftovers_quarantined']} leftover .deleted / .cleaned file(s) (Kafka deletes them at its "
            "next start; moved aside instead, not copied)"
        )
    if c["replicas_quarantined"]:
        what.append(
            f"quarantine {c['replicas_quarantined']} stray replica dir(s) (moved whole beside the log dir, the broker "
            "stopped)"
        )
    out = [
        f"### Repair plan `{plan.hash[:12]}` for cluster {md_cell(plan.cluster, table=False)}",
        "",
        *_dry_run_lines(plan),
        f"- **What:** {' and '.join(what) or 'nothing'}, then restart each changed broker, one at a time "
        f"({', '.join(md_cell(r, table=False) for r in rules) or 'no rule'}).",
        f"- **Where:** cluster {md_cell(plan.cluster, table=False)}, restart order **{order}**{ctl}; from audit "
        f"run {md_cell(plan.audit_run, table=False)}.",
        *_internal_lines(plan),
        f"- **How many:** {c['files_removed'] + indexes} file(s) backed up first, "
        f"{c['files_removed']} removed, {c['files_quarantined']} quarantined"
        + (f", {c['replicas_quarantined']} stray replica dir(s) moved whole" if c["replicas_quarantined"] else "")
        + f"; {c['brokers_restarted']} broker(s) restarted; {len(plan.skipped)} finding(s) in scope not addressed.",
        *_risk_lines(plan),
        f"- **Backups:** per broker a tar.gz with a sha256 manifest, fetched to "
        f"{md_cell(where + '/attempts/<run>/broker-<id>/', table=False)} before anything changes; quarantined "
        f"files stay on the broker in `<partition dir>/{QUARANTINE_DIR}/<plan>/`"
        + (" (the leftovers only there: moved, never copied)" if c["leftovers_quarantined"] else "")
        + (
            f", stray replicas in `<log dir's parent>/{STRAY_QUARANTINE_DIR}/<log dir>/<plan>/` (not copied: moved "
            "back by hand, `mv`, with the broker stopped)."
            if c["replicas_quarantined"]
            else "."
        ),
        *_kraft_lines(plan),
        _undo_line(plan, where),
        *_gates_lines(plan),
        "",
        hash_line(plan),
        "",
        "#### Restart preview",
        "",
        "| order | broker | controller | last stop clean | above recovery point | indexes rebuilt | est. recovery |",
        "|---:|---:|---|---|---:|---:|---:|",
    ]
    for i, b in enumerate(plan.brokers, 1):
        pv = b.preview
        if pv is None:
            continue
        clean = "running" if pv.running else ("yes" if pv.last_stop_clean else "**no**")
        if pv.untrimmed_indexes_with_marker:
            clean = f"marker, but **{pv.untrimmed_indexes_with_marker} untrimmed index(es)**: killed mid-load"
        out.append(
            f"| {i if b.restart else '-'} | {b.broker_id} | {'**yes**' if b.is_controller else ''} | {clean} | "
            f"{pv.segments_above_recovery_point} seg, {_mib(pv.bytes_above_recovery_point)} | "
            f"{pv.indexes_rebuilt} ({_mib(pv.bytes_to_rebuild)}) | {pv.estimated_recovery_s:.0f} s |"
        )
    out += _broker_details(plan, where)
    out += _why_lines(plan, rules)
    if plan.zookeeper:
        n = len(plan.zookeeper)
        out += ["", "#### ZooKeeper (preventive, separate approval)", "", "| action | topic | topic ID |"]
        out += ["|---|---|---|"]
        out += [f"| {z.action} | {md_cell(z.topic)} | {md_cell(z.topic_id)} |" for z in plan.zookeeper[:ROWS_SHOWN]]
        if n > ROWS_SHOWN:
            out += ["", f"… and {n - ROWS_SHOWN} more topic(s) in {md_cell(f'{where}/{PLAN}', False)}."]
    out += _skipped_lines(plan, where)
    return "\n".join(out) + "\n"


def _risk_lines(plan: Plan) -> list[str]:
    """What the restarts may cost: partitions under min ISR (or without any other in-sync replica) while a
    broker is down, as the audit saw the ISR, and the log recovery of brokers that stopped uncleanly."""
    risks = []
    for b in plan.brokers:
        if not b.restart:
            continue
        seen = (plan.risk.get("brokers") or {}).get(str(b.broker_id)) or {}
        if seen.get("offline"):
            risks.append(
                f"broker {b.broker_id} is the only in-sync replica of {seen['offline']} partition(s): they are "
                "unavailable while it restarts"
            )
        if seen.get("under_min_isr"):
            shown = ", ".join(md_cell(t, table=False) for t in seen["under_min_isr_examples"])
            more = seen["under_min_isr"] - len(seen["under_min_isr_examples"])
            risks.append(
                f"while broker {b.broker_id} is down, {seen['under_min_isr']} partition(s) go under "
                f"min.insync.replicas ({shown}{f', and {more} more' if more else ''}): its pre-check halts the "
                "run there unless their ISR has grown by then"
            )
        pv = b.preview
        if pv and pv.last_stop_clean is False:
            risks.append(
                f"broker {b.broker_id} stopped uncleanly: its start recovers {pv.segments_above_recovery_point} "
                f"segment(s), {_mib(pv.bytes_above_recovery_point)}, est. {pv.estimated_recovery_s:.0f} s"
            )
        elif pv and pv.untrimmed_indexes_with_marker:
            risks.append(
                f"broker {b.broker_id} was killed while loading its logs ({pv.untrimmed_indexes_with_marker} "
                f"untrimmed index(es) despite the clean-shutdown marker): est. recovery "
                f"{pv.estimated_recovery_s:.0f} s"
            )
    if not plan.risk:
        risks.append("ISR not assessed for this plan (no restart_risk)")
    elif not plan.risk.get("cluster_default_known"):
        risks.append(_unknown_default_line(plan))
    elif not risks:
        risks.append(
            f"none seen at audit time: every partition keeps min.insync.replicas ({plan.risk.get('min_isr')}, "
            f"{md_cell(plan.risk.get('min_isr_source') or 'source not recorded', table=False)}, unless the "
            "topic sets its own) with any one of these brokers down; the pre-check checks again before each stop"
        )
    if len(risks) == 1:
        return [f"- **Risk:** {risks[0]}."]
    return ["- **Risk:**", *(f"  - {r}." for r in risks)]


def _kraft_lines(plan: Plan) -> list[str]:
    """What a KRaft plan's run does differently (docs/repair.md, "On KRaft")."""
    if not plan.kraft:
        return []
    loss = (
        [
            "- **Quorum loss accepted:** a voter of a quorum of fewer than 3 is restarted: the cluster has no "
            "quorum (no metadata change, no leader election) until it is back."
        ]
        if plan.gates.get("allow_quorum_loss")
        else []
    )
    return [
        *loss,
        "- **KRaft:** no ZooKeeper: the repair lock is a file in the shared repairs dir (`locks/<cluster.id>`), the "
        "gates read the quorum's committed metadata (up to its high watermark) from the controllers' logs; voters "
        "restart after the other brokers, one at a time, the active controller last, each only while the other "
        "voters keep a caught-up majority (and nothing while more than one voter is impaired). Editing "
        "`partition.metadata`, `quorum-state` or the metadata log, and any ZooKeeper write, are refused (see "
        '"Not addressed").',
    ]


def _unknown_default_line(plan: Plan) -> str:
    """The risk when ZooKeeper's cluster-wide min.insync.replicas was not known at plan time: said, with what
    was counted instead and the partitions it matters most for, never read as "no risk"."""
    static = plan.risk.get("static_min_isr")
    assumed = (
        f"counted here with {static} (the brokers' static default, inventory or form) for topics without their "
        "own setting"
        if static
        else "no static default is set (inventory or form): Kafka's 1 unless ZooKeeper holds one"
    )
    kept = "the metadata's cluster-wide broker ConfigRecord" if plan.kraft else f"ZooKeeper's `{CLUSTER_DEFAULT_PATH}`"
    line = (
        f"cluster default min.insync.replicas not known: the pre-check reads it ({kept}) before each stop and halts "
        f"the run there if a partition would go under it; {assumed}"
    )
    thin = plan.risk.get("thinnest")
    if thin:
        shown = ", ".join(md_cell(t, table=False) for t in thin["examples"])
        more = thin["partitions"] - len(thin["examples"])
        n = thin["in_sync_left"]
        line += (
            f"; with one of these brokers down, {thin['partitions']} partition(s) of topics without their own "
            f"setting keep only {n} in-sync {_s(n, 'replica')} ({shown}{f', and {more} more' if more else ''}): "
            f"under min ISR if that default is above {n}"
        )
    return line


def _broker_details(plan: Plan, where: str) -> list[str]:
    """Per broker in restart order, one block per group of files (rule and action), at most ``FILES_SHOWN``."""
    out = ["", "#### Details per broker"]
    nth = {bid: i for i, bid in enumerate(plan.restart_order, 1)}
    for b in plan.brokers:
        if not b.actions:
            continue
        role = " (controller)" if b.is_controller else ""
        restarted = f": restarted {_ordinal(nth[b.broker_id])}" if b.broker_id in nth else ""
        out += ["", f"**Broker {b.broker_id}**{role}{restarted}"]
        for g in group_findings(_action_rows(b)):
            action = g.findings[0]["action"]
            verb = "back up and remove" if action == "remove" else action
            topics = g.topics
            shown_topics = ", ".join(md_cell(t, table=False) for t in topics[:3])
            if len(topics) > 3:
                shown_topics += f" and {len(topics) - 3} more topic(s)"
            out += [
                "",
                f"{md_cell(g.rule, table=False)}: {verb} {g.count} file(s) of {g.partitions} partition(s)"
                + (f" in {shown_topics}" if topics else ""),
                "",
            ]
            out += [f"- {md_cell(path, table=False)}" for path in g.paths[:FILES_SHOWN]]
            if g.count > FILES_SHOWN:
                out.append(f"- … and {g.count - FILES_SHOWN} more: full list in {md_cell(f'{where}/{PLAN}', False)}")
    return out


def _why_lines(plan: Plan, rules: list[str]) -> list[str]:
    """Each rule's "why" (the registry's) and what the plan does about it, said once."""
    if not rules:
        return []
    out = ["", "#### Why, per rule", ""]
    for rule in rules:
        known = RULES_BY_ID.get(rule)
        reasons = sorted({a.reason for b in plan.brokers for a in b.actions if a.rule == rule})
        why = f"{known.title}. {known.why}" if known else "not in the rule registry"
        out.append(f"- {md_cell(rule, table=False)}: {why} The plan: {'; '.join(reasons)}.")
    return out


def _skipped_lines(plan: Plan, where: str) -> list[str]:
    """The findings in scope that no action addresses: first each decision left to a human (its topic and the
    candidate topic IDs with their replica counts), then one line per group of the others (at most
    ``ROWS_SHOWN`` of each)."""
    if not plan.skipped:
        return []
    out = ["", f"#### Not addressed by this plan: {len(plan.skipped)} finding(s)", ""]
    out += _decision_lines(plan, where)
    groups = group_findings(
        {**s, "message": s.get("why") or "", "severity": _severity(str(s.get("rule")))}
        for s in plan.skipped
        if not s.get("decision")
    )
    for g in groups[:ROWS_SHOWN]:
        broker = "cluster" if g.broker_id is None else f"broker {g.broker_id}"
        out.append(f"- {broker}, {md_cell(g.rule, table=False)} ×{g.count}: {plain(g.example)}")
    if len(groups) > ROWS_SHOWN:
        out.append(f"- … and {len(groups) - ROWS_SHOWN} more group(s) in {md_cell(f'{where}/{PLAN}', False)}")
    return out


def _decision_lines(plan: Plan, where: str) -> list[str]:
    """One line per decision left to a human (``decisions``): the topic, what to decide, the candidate topic IDs
    with how many replicas hold each (in the audit's probe); at most ``ROWS_SHOWN``."""
    decisions = plan.decisions
    out = []
    for d in decisions[:ROWS_SHOWN]:
        held = d.get("replicas_per_id") or {}
        ids = ", ".join(
            md_cell(i, table=False) + (f" ({held[i]} {_s(held[i], 'replica')})" if i in held else "")
            for i in d.get("topic_ids") or ()
        )
        broker = "" if d.get("broker_id") is None else f" (broker {d['broker_id']})"
        out.append(
            f"- **A decision for a human:** topic {md_cell(d.get('topic'), table=False)}{broker}, "
            f"{plain(d['decision'])}: {ids or 'no topic ID seen'}. ZooKeeper has none; the plan touches none "
            "of its replicas."
        )
    if len(decisions) > ROWS_SHOWN:
        out.append(f"- … and {len(decisions) - ROWS_SHOWN} more decision(s) in {md_cell(f'{where}/{PLAN}', False)}")
    return out


def _gates_lines(plan: Plan) -> list[str]:
    """The run's gates as approved (part of the hash): a second person sees what the first one set."""
    gates = plan.scope.get("gates") or {}
    if not gates:
        return []
    shown = ", ".join(f"`{k}` {md_cell(v, table=False)}" for k, v in sorted(gates.items()))
    return [f"- **Gates:** {shown}."]


def _s(n: int, word: str) -> str:
    return word if n == 1 else f"{word}s"


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _severity(rule: str) -> str:
    known = RULES_BY_ID.get(rule)
    return known.severity_for(None).value if known else "info"


def _action_rows(b: BrokerPlan) -> list[dict[str, Any]]:
    """A broker's file actions as rows ``finding_groups`` groups: one group per rule and action."""
    return [
        {**asdict(a), "broker_id": b.broker_id, "message": f"{a.action}: {a.reason}", "severity": _severity(a.rule)}
        for a in b.actions
    ]


def hashes_in(markdown: str) -> list[str]:
    """The plan hashes an approval text names on a line of its own (``Plan hash: `...```): a value from a broker
    never starts a line there (``md_cell`` shows line breaks as escapes)."""
    return _HASH_LINES.findall(markdown)


def _mib(n: int) -> str:
    return f"{n / 1048576:.1f} MiB"


# ---- the restore (repair.restore)
def restore_subject(plan: Plan) -> str:
    """The restore approval's headline (the restore task checks the request showed exactly this)."""
    left = "" if plan.scope["start"] else ", left stopped"
    return (
        f"Kafka restore {md_cell(plan.cluster, table=False)} plan {plan.hash[:12]}: put back {plan.files} file(s) on "
        f"broker(s) {', '.join(map(str, plan.restart_order))}{left} from repair {plan.scope['restore_of'][:12]}"
    )


def restore_option(plan: Plan) -> str:
    """The restore approval's one "yes": what approving does (and that the broker stays stopped with
    ``start=false``), and which restore plan. The restore task accepts exactly this answer (``approval.check``)."""
    n = len(plan.restart_order)
    left = "" if plan.scope["start"] else ", left stopped"
    return f"Approve: put back {plan.files} file(s) on {n} broker(s){left} (restore {plan.hash[:12]})"


def restore_markdown(plan: Plan) -> str:
    scope = plan.scope
    lines = [
        f"**Restore** of repair plan `{scope['restore_of'][:16]}` (attempt {md_cell(scope['attempt'], table=False)}) "
        f"on cluster {md_cell(plan.cluster, table=False)}.",
        "",
        f"Order (the controller last): {', '.join(str(b) for b in plan.restart_order)}. "
        + ("Each broker is started again and gated (ISR, healthy polls)." if scope["start"] else "")
        + ("" if scope["start"] else "The broker is **left stopped** after its files are back (start=false)."),
        "",
        "Per broker: pre-check, stop, back up the files as they are now, put the backup back (checksums checked "
        "before unpacking), files checked against the manifest below.",
        "",
    ]
    for b in plan.brokers:
        lines += [f"### Broker {b.broker_id}{' (controller)' if b.is_controller else ''}", ""]
        for bk in scope["backups"][str(b.broker_id)]:
            lines.append(f"- backup {md_cell(bk['tarball'], table=False)} sha256 `{bk['sha256'][:16]}…`")
        lines += ["", "| file | sha256 after restore |", "|---|---|"]
        lines += [f"| {md_cell(a.path)} | `{a.reason.rsplit(' ', 1)[-1]}` |" for a in b.actions[:FILES_SHOWN]]
        if len(b.actions) > FILES_SHOWN:  # the buttons come after the text: plan.json has every file and checksum
            listed = md_cell(f"{scope['restore_of']}/restores/{plan.hash}/{PLAN}")
            lines.append(f"| … and {len(b.actions) - FILES_SHOWN} more: every file in {listed} of the repairs dir | |")
        lines.append("")
    lines += [*_gates_lines(plan), ""]
    lines.append(hash_line(plan))  # the restore task checks the approval names this plan
    return "\n".join(lines)


# ---- deleting a repair's quarantine (repair.purge)
def purge_totals(plan: Plan) -> dict[str, Any]:
    """What a purge plan frees: entries, bytes, the oldest and newest quarantine time (ISO), per broker; and how many
    younger entries it keeps."""
    per: dict[str, dict[str, int]] = {}
    stamps = []
    for b in plan.brokers:
        entries = plan.scope["entries"][str(b.broker_id)]
        per[str(b.broker_id)] = {"entries": len(entries), "bytes": sum(int(e["bytes"]) for e in entries)}
        stamps += [e["quarantined"] for e in entries]
    return {
        "entries": sum(v["entries"] for v in per.values()),
        "bytes": sum(v["bytes"] for v in per.values()),
        "oldest": min(stamps, default=None),
        "newest": max(stamps, default=None),
        "brokers": per,
        "kept_younger": len(plan.skipped),
    }


def purge_subject(plan: Plan) -> str:
    t = purge_totals(plan)
    return (
        f"Kafka purge {plain(plan.cluster)} plan {plan.hash[:12]}: delete {t['entries']} quarantined entr(ies), free "
        f"{_mib(t['bytes'])}, of repair {plan.scope['purge_of'][:12]}"
    )


def purge_option(plan: Plan) -> str:
    """The purge approval's one "yes" (the purge task accepts exactly this answer)."""
    t = purge_totals(plan)
    return f"Approve: delete {t['entries']} entr(ies), free {_mib(t['bytes'])} (purge {plan.hash[:12]})"


def purge_markdown(plan: Plan, plan_dir: str | None = None) -> str:
    t = purge_totals(plan)
    where = plan_dir or f"<repairs dir>/{plan.scope['purge_of']}/purges/{plan.hash}"
    lines = [
        f"### Delete the quarantine of repair plan `{plan.scope['purge_of'][:16]}`, cluster "
        f"{md_cell(plan.cluster, table=False)}",
        "",
        f"- **What:** delete {t['entries']} quarantined entr(ies) (index and leftover files moved aside, stray "
        f"replicas moved beside their log dir), quarantined at least {plan.scope['older_than_days']:g} day(s) ago: "
        f"the oldest {t['oldest'] or '-'}, the newest {t['newest'] or '-'}.",
        f"- **Freed:** {_mib(t['bytes'])} ({t['bytes']} bytes) on {len(t['brokers'])} broker(s); "
        f"{t['kept_younger']} younger entr(ies) kept.",
        "- **Risk:** none to Kafka: its own files are not touched and no broker restarts. **Undo: none**: once "
        "deleted, a quarantined file is gone (the repair's backups, if any, stay in the repairs dir).",
        "- **Each entry** is deleted only while it is still in that quarantine with the size planned here; one that "
        "changed is refused.",
        f"- **Full plan:** {md_cell(f'{where}/{PLAN}', table=False)}.",
        "",
        hash_line(plan),
        "",
        "| broker | entries | bytes | examples |",
        "|---:|---:|---:|---|",
    ]
    for b in plan.brokers:
        per = t["brokers"][str(b.broker_id)]
        shown = "<br>".join(md_cell(a.path) for a in b.actions[:FILES_SHOWN])
        more = len(b.actions) - FILES_SHOWN
        lines.append(
            f"| {b.broker_id} | {per['entries']} | {_mib(per['bytes'])} | {shown}{f' (+{more})' if more > 0 else ''} |"
        )
    return "\n".join(lines) + "\n"


# ---- a rolling restart (repair.roll_plan, repair.roll)
def roll_request(plan: Plan) -> Request:
    """The approval of a roll plan (``repair.roll_plan.build_roll_plan``)."""
    return Request(roll_subject(plan), roll_markdown(plan), roll_option(plan))


def _roll_counts(plan: Plan) -> tuple[int, int]:
    return len(plan.restart_order), len(plan.scope.get("batches") or ())


def roll_subject(plan: Plan) -> str:
    n, batches = _roll_counts(plan)
    reason = plan.scope["reason"]
    dry = "DRY RUN: " if plan.dry_run else ""
    return (
        f"{dry}Kafka roll {md_cell(plan.cluster, table=False)} plan {plan.hash[:12]}: restart {n} broker(s) in "
        f"{batches} step(s) ({md_cell(reason['kind'], table=False)})"
    )


def roll_option(plan: Plan) -> str:
    """The roll approval's one "yes" (the roll task accepts exactly this answer)."""
    n, batches = _roll_counts(plan)
    return f"Approve: restart {n} broker(s) in {batches} step(s) (roll {plan.hash[:12]})"


def _duration(seconds: float) -> str:
    seconds = float(seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def roll_markdown(plan: Plan) -> str:
    scope, risk = plan.scope, plan.risk
    predicted = risk.get("predicted") or {}
    per = predicted.get("brokers") or {}
    racks = risk.get("racks") or {}
    reason = scope["reason"]
    text = f": {md_cell(reason['text'], table=False)}" if reason.get("text") else ""
    lines = [
        *_dry_run_lines(plan),
        f"**Rolling restart** of cluster {md_cell(plan.cluster, table=False)} for a "
        f"**{md_cell(reason['kind'], table=False)}**{text}. No file is changed: each broker is stopped (a controlled "
        "shutdown), started and gated, then leads its preferred partitions again before the next step.",
        "",
        f"- **Batching:** {scope['batching']}"
        + (
            f" (every partition keeps at least min.insync.replicas + {scope['isr_margin']} in ISR with a whole batch "
            "stopped; checked again, live, before each batch)"
            if scope["batching"] != "one-at-a-time"
            else ""
        )
        + (f"; at most {scope['max_batch']} broker(s) per batch" if scope.get("max_batch") else "")
        + ".",
        f"- **Predicted time:** {_duration(predicted.get('batched_s', 0))} as planned, against "
        f"{_duration(predicted.get('one_at_a_time_s', 0))} one broker at a time "
        f"({md_cell(predicted.get('step_times_source', ''), table=False)}; log recovery at "
        f"{_mib(int(predicted.get('recovery_bytes_per_s') or 0))}/s, "
        f"{md_cell(predicted.get('recovery_source') or 'the default rate', table=False)}).",
        f"- **Leadership back:** {md_cell(scope['leadership'].get('via'), table=False)} "
        f"({md_cell(scope['leadership'].get('why', ''), table=False)}).",
    ]
    balance = risk.get("leadership") or {}
    if balance:
        lines.append(
            f"- **Leadership now:** {balance.get('not_preferred', 0)} of {balance.get('partitions', 0)} partitions "
            "are led by a replica other than their preferred one."
        )
    if scope.get("hold_out"):
        lines.append(f"- **Held out:** broker(s) {', '.join(map(str, scope['hold_out']))}.")
    if risk.get("controls"):
        said = "; ".join(f"broker {b}: {why}" for b, why in risk["controls"].items())
        lines.append(
            f"- **Held or skipped by an operator now** (`bin/fleet-doctor roll-control`; the roll honours them as "
            f"they stand at each step): {md_cell(said, table=False)}."
        )
    lines += [*_gates_lines(plan), "", "| step | brokers | racks | why | predicted |", "|---|---|---|---|---|"]
    for i, batch in enumerate(scope.get("batches") or (), 1):
        ids = batch["brokers"]
        slowest = max((per.get(str(b), {}).get("restart_s", 0.0) for b in ids), default=0.0)
        rack_names = sorted({str(racks.get(str(b))) for b in ids if racks.get(str(b))})
        lines.append(
            f"| {i} | {', '.join(map(str, ids))} | {md_cell(', '.join(rack_names) or '-')} | {md_cell(batch['why'])} "
            f"| {_duration(slowest)} |"
        )
    recovering = [
        (b, v) for b, v in sorted(per.items(), key=lambda kv: int(kv[0])) if v.get("recovery_if_unclean_s", 0) >= 1
    ]
    if recovering:
        lines += [
            "",
            "**Log recovery** (kafka-reference.md §2.4): a clean stop recovers nothing, but a broker down after an "
            "unclean stop, or killed because its controlled shutdown did not finish, recovers its segments past the "
            "recovery point before it serves. The roll waits for a recovering broker (its BrokerState), never "
            "restarting it and never stopping the next:",
            "",
            "| broker | at this start | if its stop is not clean |",
            "|---|---|---|",
        ]
        lines += [
            f"| {b} | {_duration(v['recovery_s'])} | {_duration(v['recovery_if_unclean_s'])} |"
            for b, v in recovering[:ROWS_SHOWN]
        ]
        if len(recovering) > ROWS_SHOWN:
            lines.append(f"| … and {len(recovering) - ROWS_SHOWN} more (plan.json) | | |")
    lines += ["", hash_line(plan)]
    return "\n".join(lines)
