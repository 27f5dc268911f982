"""The approval gate without a scheduler: the HITL users the approve task is given, the check the acting tasks make
on Airflow's record of the answer (built with Airflow's own REST datamodel, as the hitlDetails endpoint returns
it), the approval text on hostile names (rendered by a CommonMark + GFM-tables renderer), and an S3 endpoint with
credentials. The same gate on a live Airflow with two users: tests/test_approval_live.py."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest

from fleet_doctor.repair import approval, approval_text
from fleet_doctor.repair.approval import ApprovalError, check, hitl_users
from fleet_doctor.repair.approval_text import FILES_SHOWN, hashes_in, md_cell, restore_markdown
from fleet_doctor.repair.errors import RepairError
from fleet_doctor.repair.plan import BrokerPlan, FileAction, Plan, RestartPreview, ZkAction
from fleet_doctor.rules import RULES_BY_ID
from fleet_doctor.settings import Settings, SettingsError

PLAN = "ab" * 32
BODY = f"### Repair plan `{PLAN[:12]}`\n\n| action | file |\n|---|---|\n\nPlan hash: `{PLAN}`\n"
APPROVE = f"Approve: restart 3 brokers, change 6 files (plan {PLAN[:12]})"  # what the stored plan offers


def settings(**env: str) -> Settings:
    return Settings.from_env({"FLEET_DOCTOR_INVENTORY": "/nonexistent", **env})


def detail(
    by: str | None = "alice", option: str | None = APPROVE, body: str = BODY, answered: bool = True
) -> dict[str, Any]:
    """A HITL detail as GET .../hitlDetails returns it (Airflow's BaseHITLDetail, dumped as JSON)."""
    from airflow.api_fastapi.core_api.datamodels.hitl import BaseHITLDetail

    now = datetime.now(UTC)
    options = [APPROVE, "Reject"] + ([option] if option and option not in (APPROVE, "Reject") else [])
    fields: dict[str, Any] = {"options": options, "subject": f"plan {PLAN[:12]}", "body": body}
    if answered:
        fields.update(
            responded_by_user={"id": by, "name": by} if by else None,
            responded_at=now,
            chosen_options=[option] if option else None,
            response_received=True,
        )
    return BaseHITLDetail(created_at=now, **fields).model_dump(mode="json")


def test_approvers_are_hitl_users_airflow_accepts() -> None:
    """FLEET_DOCTOR_APPROVERS=alice,bob gave ['alice', 'bob']: Airflow's upsert_hitl_detail reads user['id'] and
    failed the approve task (TypeError: string indices must be integers)."""
    from airflow.sdk.api.datamodels._generated import HITLUser

    users = hitl_users(settings(FLEET_DOCTOR_APPROVERS="alice, bob"))
    assert users == [{"id": "alice", "name": "alice"}, {"id": "bob", "name": "bob"}]
    assert [HITLUser(id=u["id"], name=u["name"]).id for u in users] == ["alice", "bob"]  # what Airflow does with them
    assert hitl_users(settings()) is None  # no list: anyone allowed to answer


def record(d: dict[str, Any] | None, triggered_by: str | None = "bob", **env: str) -> dict[str, Any]:
    return check(
        d, task_id="approve", plan_hash=PLAN, settings=settings(**env), triggered_by=triggered_by, option=APPROVE
    )


def test_an_approval_by_an_allowed_user_gives_the_journal_record() -> None:
    d = detail("alice")
    got = record(d, FLEET_DOCTOR_APPROVERS="alice,carol")
    assert got == {
        "task": "approve",
        "option": APPROVE,
        "by": {"id": "alice", "name": "alice"},
        "at": d["responded_at"],
        "plan_hash": PLAN,
        "triggered_by": "bob",
    }
    assert record(detail("mallory"))["by"]["id"] == "mallory"  # no list: any user Airflow let answer
    assert record(detail("bob"))["by"]["id"] == "bob"  # no list: no four eyes either


@pytest.mark.parametrize(
    "case,d,env,triggered_by,message",
    [
        ("marked success, no request", None, {}, "bob", "no approval on record"),
        ("marked success while waiting", detail(answered=False), {}, "bob", "no answer on record"),
        ("rejected", detail(option="Reject"), {}, "bob", "answered \\['Reject'\\], not \\['Approve: restart"),
        ("the bare Approve", detail(option="Approve"), {}, "bob", "answered \\['Approve'\\]"),
        ("another label", detail(option="Approve: restart 1 broker"), {}, "bob", "not \\['Approve: restart 3"),
        (
            "another plan's label",
            detail(option=APPROVE.replace(PLAN[:12], "cd" * 6)),
            {},
            "bob",
            "answered \\['Approve: .*cdcdcdcdcdcd",
        ),
        ("a default, not a user", detail(by=None), {}, "bob", "not given by a user"),
        ("not an approver", detail("bob"), {"FLEET_DOCTOR_APPROVERS": "alice"}, "carol", "not one of"),
        ("self-approval", detail("alice"), {"FLEET_DOCTOR_APPROVERS": "alice,bob"}, "alice", "four eyes"),
        ("another plan", detail(body=BODY.replace(PLAN, "cd" * 32)), {}, "bob", f"not the plan.*{PLAN[:12]}"),
        ("no plan named", detail(body="approve?"), {}, "bob", "none named"),
        ("two plans named", detail(body=BODY + f"Plan hash: `{'cd' * 32}`\n"), {}, "bob", "not the plan"),
        ("trigger user unknown", detail("alice"), {"FLEET_DOCTOR_APPROVERS": "alice"}, None, "four eyes cannot"),
    ],
)
def test_no_valid_approval_refuses(
    case: str, d: dict[str, Any] | None, env: dict[str, str], triggered_by: str, message: str
) -> None:
    with pytest.raises(ApprovalError, match=message) as e:
        record(d, triggered_by, **env)
    assert isinstance(e.value, RepairError) and "nothing was touched" in str(e.value)


def test_self_approval_only_when_allowed() -> None:
    env = {"FLEET_DOCTOR_APPROVERS": "alice"}
    with pytest.raises(ApprovalError, match="four eyes"):
        record(detail("alice"), "alice", **env)
    assert record(detail("alice"), "alice", FLEET_DOCTOR_ALLOW_SELF_APPROVAL="true", **env)["triggered_by"] == "alice"
    assert not settings().allow_self_approval


def test_confirm_without_the_api_connection_refuses() -> None:
    """Outside a task (no Airflow connection to read approvals through), ``confirm`` refuses: it never falls back
    to trusting the upstream state."""

    class Run:
        dag_id, run_id, triggering_user_name = "kafka_fleet_repair", "manual__x", "bob"

    with pytest.raises(ApprovalError, match="fleet_doctor_airflow_api"):
        approval.confirm({"dag_run": Run()}, "approve", PLAN, settings(), approval_text.Request("s", BODY, APPROVE))


# ---- the approval text on hostile names
HOSTILE = [
    "/data/kafka/evil-0\n| remove | /etc/passwd | `x` | fine |",
    "/data/kafka/t|x-0/partition.metadata",
    "/data/kafka/a`</code><script>alert(1)</script>`-0/partition.metadata",
    "/data/kafka/[click](javascript:alert(1))-0/partition.metadata",
    "/data/kafka/**bold**_em_<img src=x onerror=alert(1)>-0/leader-epoch-checkpoint",
    "/data/kafka/rtl\u202egpj.exe-0/partition.metadata",
    "``double``",
    "` padded `",
]


def render(markdown: str) -> str:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable("table").render(markdown)


def hostile_plan() -> Plan:
    """One broker per hostile name (each its own group of files, so each is listed), hostile topics too."""
    brokers = [
        BrokerPlan(i, i == 1, True, [FileAction("remove", p, "topic-id-mismatch", HOSTILE[-i], 0, "why")])
        for i, p in enumerate(HOSTILE, 1)
    ]
    zk = [ZkAction("restore-topic-id", "<b>t|</b>\nx", "id`|`<script>", "every replica holds this topic ID")]
    return Plan("c1", "run1", {}, brokers, zk, [])


def unescaped(code: str) -> str:
    return code.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&")


def shown_as(name: str) -> str:
    return name.replace("\n", "\\n").replace("\u202e", "\\u202e")


@pytest.mark.parametrize("which", ["repair_markdown", "zookeeper_markdown"])
def test_hostile_names_stay_one_literal_cell(which: str) -> None:
    plan = hostile_plan()
    text = getattr(approval_text, which)(plan)
    html = render(text)
    assert "<script" not in html and "<img" not in html and "<a " not in html and "<b>" not in html
    assert "<strong>bold" not in html and "<em>em" not in html
    tables = [re.findall(r"<tr>(.*?)</tr>", t, re.S) for t in re.findall(r"<table>(.*?)</table>", html, re.S)]
    for head, *rows in tables:  # every row of every table has as many cells as its header: none was split
        assert all(len(re.findall(r"<td", r)) == len(re.findall(r"<th", head)) for r in rows), rows
    rows_per_table = [len(rows) for _, *rows in tables]
    assert rows_per_table == ([1] if which == "zookeeper_markdown" else [0, 1])  # restart preview, ZooKeeper
    if which == "repair_markdown":  # each file one list item holding one code span: the name as it is
        items = re.findall(r"<li>(.*?)</li>", html, re.S)
        files = [unescaped(c) for i in items for c in re.findall(r"^<code>(.*?)</code>$", i, re.S)]
        assert files == [shown_as(n) for n in HOSTILE]
        for name in HOSTILE:  # each hostile topic shown once, as one code span, in its group's line
            assert f"<code>{shown_as(name)}</code>" in unescaped(html)
    assert hashes_in(text) == [plan.hash]  # a name cannot start a line of its own, so cannot name a plan


def test_md_cell_shows_the_name_as_it_is() -> None:
    """Each value is one code span whose text is the name, control characters shown as escapes."""
    for name in HOSTILE:
        cell = render(f"| f |\n|---|\n| {md_cell(name)} |\n")
        (code,) = re.findall(r"<td><code>(.*?)</code></td>", cell, re.S)
        assert unescaped(code) == shown_as(name)
    assert md_cell("") == "(empty)"


# ---- FLEET_DOCTOR_S3_ENDPOINT
@pytest.mark.parametrize("var", ["FLEET_DOCTOR_S3_ENDPOINT", "AWS_ENDPOINT_URL"])
def test_an_s3_endpoint_with_credentials_is_refused(var: str) -> None:
    with pytest.raises(SettingsError, match="no credentials in the endpoint URL") as e:
        settings(**{var: "http://key:s3cr3t@127.0.0.1:9000", "FLEET_DOCTOR_DATA": "s3a://bucket/fd"})
    assert "s3cr3t" not in str(e.value) and "key" not in str(e.value).replace("no credentials", "")
    ok = settings(FLEET_DOCTOR_S3_ENDPOINT="http://127.0.0.1:9000", FLEET_DOCTOR_DATA="s3a://bucket/fd")
    assert ok.detect_conf({})["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"


def test_the_text_shown_must_be_the_stored_plans() -> None:
    """The request's body is rendered from the plan task's XCom, which the REST API can overwrite: a tidied table
    over the right hash line is refused when it is not what the stored plan renders."""
    tidied = BODY.replace("| action | file |", "| action | file (nothing to see) |")
    with pytest.raises(ApprovalError, match="not the stored plan"):
        check(
            detail("alice", body=tidied),
            task_id="approve",
            plan_hash=PLAN,
            settings=settings(),
            triggered_by="b",
            option=APPROVE,
            body=BODY,
        )
    ok = check(
        detail("alice"),
        task_id="approve",
        plan_hash=PLAN,
        settings=settings(),
        triggered_by="b",
        option=APPROVE,
        body=BODY,
    )
    assert ok["by"]["id"] == "alice"


# ---- the approval text: summary first, files bounded, options that say what approving does
def big_plan(dry_run: bool = False, partitions: int = 30) -> Plan:
    """What `kill -9` of three brokers under load leaves: hundreds of untrimmed indexes per broker, and topic-ID
    drift on a few partitions; broker 2 is the controller."""
    why_q, why_r = "moved aside; Kafka rebuilds the segment's indexes at start", "re-created at start"
    brokers = []
    for bid in (1, 3, 2):
        acts = [
            FileAction("quarantine", f"/data/kafka/payments-{p}/{s:020d}.{e}", "index-untrimmed", "payments", p, why_q)
            for p in range(partitions)
            for s in range(5)
            for e in ("index", "timeindex")
        ]
        acts += [
            FileAction("remove", f"/data/kafka/orders-{p}/{n}", "topic-id-mismatch", "orders", p, why_r)
            for p in range(3)
            for n in ("leader-epoch-checkpoint", "partition.metadata")
        ]
        preview = RestartPreview(bid != 3, False, 40, 3 << 30, 300, 1 << 30, 41.0)
        brokers.append(BrokerPlan(bid, bid == 2, True, acts, preview))
    gates = {"dry_run": dry_run, "healthy_polls": 3}
    split = {"rule": "topic-id-split", "broker_id": 1, "topic": "t", "why": "report only"}
    skipped = [{**split, "partition": p, "path": f"/d/t-{p}"} for p in range(40)]
    seen = {"under_min_isr": 7, "under_min_isr_examples": ["a-0", "a-1"], "offline": 1}
    risk = {"min_isr": 2, "brokers": {"3": seen}}
    return Plan("c1", "run1", {"gates": gates}, brokers, [], skipped, risk)


def test_a_big_plan_keeps_the_approval_short_summary_first() -> None:
    """900 quarantined indexes and 18 removed files: the text lists FILES_SHOWN per group and points at plan.json
    for the rest, so the request's buttons (below the text) stay near; the summary comes before any file."""
    plan = big_plan()
    text = approval_text.repair_markdown(plan, f"/srv/repairs/{plan.hash}")
    lines = text.splitlines()
    assert sum(len(b.actions) for b in plan.brokers) == 918
    assert len(lines) < 100 and len(text) < 8_000, (len(lines), len(text))
    bigger = big_plan(partitions=300)  # ten times the files: not one line more
    assert len(approval_text.repair_markdown(bigger, f"/srv/repairs/{bigger.hash}").splitlines()) == len(lines)
    listed = [x for x in lines if x.startswith("- `/data/kafka/")]
    assert len(listed) == 3 * 2 * FILES_SHOWN  # three brokers, two groups each (quarantine, remove)
    assert lines.count(f"- … and {300 - FILES_SHOWN} more: full list in `/srv/repairs/{plan.hash}/plan.json`") == 3
    assert lines.count(f"- … and {6 - FILES_SHOWN} more: full list in `/srv/repairs/{plan.hash}/plan.json`") == 3
    summary = lines[: lines.index("#### Restart preview")]
    joined = "\n".join(summary)
    for part in ("**What:**", "**Where:**", "**How many:**", "**Risk:**", "**Backups:**", "**Undo:**"):
        assert part in joined
    assert "restart order **1 → 3 → 2** (the active controller, broker 2, last)" in joined
    assert "918 file(s) backed up first, 18 removed, 900 quarantined; 3 broker(s) restarted" in joined
    assert "while broker 3 is down, 7 partition(s) go under min.insync.replicas (`a-0`, `a-1`, and 5 more)" in joined
    assert "broker 3 is the only in-sync replica of 1 partition(s)" in joined
    assert "broker 3 stopped uncleanly: its start recovers 40 segment(s), 3072.0 MiB, est. 41 s" in joined
    assert f"`kafka_fleet_restore__{plan.cluster}` with plan `{plan.hash[:16]}`" in joined  # the cluster's own
    assert f"`/srv/repairs/{plan.hash}/attempts/<run>/broker-<id>/`" in joined
    assert f"Plan hash: `{plan.hash}`" in summary and hashes_in(text) == [plan.hash]
    assert "DRY RUN" not in text
    # the rule's why once, not per file: the registry's text for index-untrimmed appears exactly once
    assert text.count(RULES_BY_ID["index-untrimmed"].why) == 1 and text.count(RULES_BY_ID["topic-id-mismatch"].why) == 1
    # 40 unaddressed findings of one kind: one line
    assert "- broker 1, `topic-id-split` ×40: report only" in lines


def test_a_dry_run_says_so_in_the_text_the_subject_and_the_button() -> None:
    dry, real = big_plan(dry_run=True), big_plan()
    assert dry.hash != real.hash  # dry_run is one of the gates: part of the plan
    text = approval_text.repair_markdown(dry)
    assert "**DRY RUN: nothing will be written.**" in text.splitlines()[2]  # right under the title
    assert "DRY RUN" in approval_text.repair_subject(dry) and "DRY RUN" not in approval_text.repair_subject(real)
    assert approval_text.repair_option(dry) == f"Approve dry run: 3 brokers, nothing written (plan {dry.hash[:12]})"
    assert approval_text.repair_option(real) == f"Approve: restart 3 brokers, change 918 files (plan {real.hash[:12]})"


def test_the_zookeeper_approval_has_its_own_option_and_bounded_table() -> None:
    zk = [ZkAction("restore-topic-id", f"topic-{i}", "A" * 22, "every replica holds this topic ID") for i in range(25)]
    plan = Plan("c1", "run1", {}, [], zk, [])
    text = approval_text.zookeeper_markdown(plan, "/srv/repairs/x")
    assert approval_text.zookeeper_option(plan) == f"Approve: write 25 topic IDs to ZooKeeper (plan {plan.hash[:12]})"
    assert approval_text.zookeeper_option(plan) != approval_text.repair_option(
        plan
    )  # one answer cannot approve the other request
    assert sum(line.startswith("| `topic-") for line in text.splitlines()) == 10
    assert "… and 15 more topic(s)" in text and hashes_in(text) == [plan.hash]


def test_the_hash_is_the_canonical_contents_not_the_text() -> None:
    """The risk (ISR as the audit saw it) and the rendering are for the approver: neither moves the hash."""
    plan = big_plan()
    assessed = Plan(plan.cluster, plan.audit_run, plan.scope, plan.brokers, plan.zookeeper, plan.skipped, {})
    assert assessed.hash == plan.hash and "risk" not in plan.canonical()
    again = Plan.from_json(plan.to_json())
    assert again.risk == plan.risk and approval_text.repair_markdown(again, "/x") == approval_text.repair_markdown(
        plan, "/x"
    )  # what execute re-renders


def test_the_risk_is_read_from_the_audits_isr() -> None:
    """Per restarted broker, from the audit's ZooKeeper snapshot: partitions under min ISR while it is down (the
    topic's own setting, else the default), and those it is the only in-sync replica of."""
    from fleet_doctor.repair.planner import FleetFacts, restart_risk

    zk = [
        {"kind": "topic", "topic": "strict", "min_insync_replicas": 3, "partitions": {"0": [1, 2, 3]}},
        {"kind": "topic", "topic": "lax", "min_insync_replicas": None, "partitions": {"0": [1, 2, 3], "1": [2]}},
        {"kind": "partition_state", "topic": "strict", "partition": 0, "isr": [1, 2, 3]},
        {"kind": "partition_state", "topic": "lax", "partition": 0, "isr": [1, 2]},
        {"kind": "partition_state", "topic": "lax", "partition": 1, "isr": [2]},
    ]
    risk = restart_risk(FleetFacts({}, zk), [1, 2, 3], static_min_isr=2)
    assert risk["min_isr"] == 2
    assert risk["brokers"]["1"] == {"under_min_isr": 2, "under_min_isr_examples": ["lax-0", "strict-0"], "offline": 0}
    assert risk["brokers"]["2"] == {"under_min_isr": 2, "under_min_isr_examples": ["lax-0", "strict-0"], "offline": 1}
    assert risk["brokers"]["3"] == {"under_min_isr": 1, "under_min_isr_examples": ["strict-0"], "offline": 0}
    assert restart_risk(FleetFacts({}, zk), [3])["brokers"]["3"]["under_min_isr"] == 1  # default 1: strict only


def test_a_restore_approval_lists_a_bounded_number_of_files_and_says_where_the_rest_are() -> None:
    many = [
        FileAction("restore", f"/data/kafka/t-{i}/partition.metadata", "restore", "t", i, f"backup 1, sha256 {i:064x}")
        for i in range(40)
    ]
    few = many[:2]
    backups = {str(b): [{"tarball": f"/r/b{b}.tar.gz", "sha256": "ab" * 32, "files": {}}] for b in (1, 2)}
    scope = {"restore_of": "f" * 64, "attempt": "manual__x", "start": True, "backups": backups}
    p = Plan("lab", "restore-ffff", scope, [BrokerPlan(1, False, True, many), BrokerPlan(2, True, True, few)], [], [])
    text = restore_markdown(p)
    rows = [line for line in text.splitlines() if line.startswith("| `/data/kafka/")]
    assert len(rows) == FILES_SHOWN + 2  # broker 1's first files, both of broker 2's
    assert f"| … and {40 - FILES_SHOWN} more: every file in `{'f' * 64}/restores/{p.hash}/plan.json`" in text
    assert text.count("… and") == 1 and hashes_in(text) == [p.hash]


def test_the_summary_says_when_internal_topics_are_included() -> None:
    """include_internal (ticked by a person) is named in the summary with the internal topics the plan touches;
    without it the summary says nothing of them (the planner leaves their topic-ID files alone)."""
    why = "re-created at start"
    orders = FileAction("remove", "/data/kafka/orders-0/partition.metadata", "topic-id-mismatch", "orders", 0, why)

    def plan(include_internal: bool, topic: str = "__consumer_offsets") -> Plan:
        brokers = [
            BrokerPlan(
                bid,
                bid == 2,
                True,
                [
                    FileAction("remove", f"/data/kafka/{topic}-{p}/{n}", "topic-id-mismatch", topic, p, why)
                    for p in (0, 7)
                    for n in ("leader-epoch-checkpoint", "partition.metadata")
                ]
                + [orders],
            )
            for bid in (1, 2)
        ]
        return Plan("c1", "run1", {"include_internal": include_internal}, brokers, [], [])

    included = approval_text.repair_markdown(plan(True))
    summary = included.splitlines()[: included.splitlines().index("#### Restart preview")]
    assert "- **Internal topics included:** `__consumer_offsets` (2 partition(s), 4 replica(s))." in summary
    assert "Internal topics" not in approval_text.repair_markdown(plan(False))
    untouched = approval_text.repair_markdown(plan(True, topic="orders"))
    assert "- **Internal topics included:** none of them is touched by this plan." in untouched.splitlines()


# ---- review of the approval changes: the cluster default min ISR, decisions by topic, the subject, the restore option
def _isr_facts() -> Any:
    from fleet_doctor.repair.planner import FleetFacts

    return FleetFacts(
        {},
        [
            {"kind": "topic", "topic": "lax", "min_insync_replicas": None, "partitions": {"0": [1, 2], "1": [1, 2, 3]}},
            {"kind": "partition_state", "topic": "lax", "partition": 0, "isr": [1, 2]},
            {"kind": "partition_state", "topic": "lax", "partition": 1, "isr": [1, 2, 3]},
        ],
    )


def _restarting(risk: dict[str, Any]) -> Plan:
    return Plan("c1", "run1", {}, [BrokerPlan(1, False, True, [], None)], [], [], risk)


def test_the_risk_never_reads_an_unknown_cluster_default_as_no_risk() -> None:
    """With nothing in the inventory or the form, a cluster whose ZooKeeper default is 2 (`/config/brokers/<default>`,
    which the audit's snapshot does not read) stops the run at broker 1's pre-check (lax-0 keeps 1 in-sync replica):
    the risk line said "none seen" with an assumed 1. It says the default is not known and names lax-0."""
    from fleet_doctor.repair.planner import default_min_isr, restart_risk

    risk = restart_risk(_isr_facts(), [1])
    assert risk["cluster_default_known"] is False and risk["brokers"]["1"]["under_min_isr"] == 0
    text = approval_text.repair_markdown(_restarting(risk))
    (line,) = [x for x in text.splitlines() if x.startswith("- **Risk:**")]
    assert "none seen" not in line and "cluster default min.insync.replicas not known: the pre-check reads it" in line
    assert "`/config/brokers/<default>`" in line and "no static default is set" in line
    assert "1 partition(s) of topics without their own setting keep only 1 in-sync replica (`lax-0`)" in line
    assert "under min ISR if that default is above 1" in line
    with_static = approval_text.repair_markdown(_restarting(restart_risk(_isr_facts(), [1], static_min_isr=2)))
    assert "go under min.insync.replicas (`lax-0`)" in with_static and "counted here with 2" in with_static
    # known (the gates' order: ZooKeeper's default over the static one over Kafka's 1): then "none seen" may be said
    known = restart_risk(_isr_facts(), [1], static_min_isr=3, cluster_default=1)
    assert known["min_isr"] == 1 and known["cluster_default_known"] and "thinnest" not in known
    assert "none seen at audit time" in approval_text.repair_markdown(_restarting(known))
    assert default_min_isr(2, 3) == (2, "ZooKeeper's /config/brokers/<default>")
    assert default_min_isr(None, 3)[0] == 3 and default_min_isr(None, None) == (1, "Kafka's default")
    old = {"min_isr": 1, "brokers": {"1": {"under_min_isr": 0, "under_min_isr_examples": [], "offline": 0}}}
    assert "not known" in approval_text.repair_markdown(
        _restarting(old)
    )  # a plan stored before: never "none seen" either


def test_the_plan_and_the_gates_take_the_same_static_min_isr() -> None:
    """plan_from's risk and the lock's gates resolve the brokers' static default with one helper."""
    from fleet_doctor import inventory
    from fleet_doctor.repair.gates import static_min_isr
    from fleet_doctor.repair.session import ZooKeeperLock

    def inv(**extra: Any) -> inventory.Inventory:
        broker = {"id": 1, "host": "127.0.0.1", "ssh_port": 22, "ssh_user": "k", "ssh_key_file": "/k"}
        broker |= {"host_key": "ssh-ed25519 AAAA", "log_dirs": ["/d"], "kafka_version": "3.6.2"}
        broker |= {"service": {"stop": "x", "start": "y", "status": "z"}}
        data = {"inventory_version": 1, "cluster": "c1", "zookeeper": "h:2181/kafka", "brokers": [broker]}
        return inventory.parse(data | extra)

    for params, i, want in (({}, inv(), None), ({"min_insync_replicas": 3}, inv(min_insync_replicas=2), 3)):
        assert static_min_isr(params, i.min_insync_replicas) == want
        assert ZooKeeperLock(None, "k").gates(i, params).default_min_isr == want
    assert static_min_isr({"min_insync_replicas": 1}, inv(min_insync_replicas=2).min_insync_replicas) == 2  # raised


def _split_facts(topics: dict[str, dict[str, int]], in_zk: dict[str, str] | None = None) -> Any:
    """Per topic, how many replicas hold each topic ID (ZooKeeper's: ``in_zk``, else none): broker 1's probe."""
    from fleet_doctor.repair.planner import FleetFacts

    probe, zk = [], []
    for t, ids in topics.items():
        zk.append({"kind": "topic", "topic": t, "topic_id": (in_zk or {}).get(t), "partitions": {}})
        n = 0
        for tid, replicas in ids.items():
            for _ in range(replicas):
                probe.append({"kind": "partition", "path": f"/d/{t}-{n}", "topic": t, "partition": n, "topic_id": tid})
                n += 1
    return FleetFacts({1: probe}, zk)


def test_a_decision_left_to_a_human_names_its_topic_and_the_candidate_ids() -> None:
    """A topic-id-split without a ZooKeeper ID was one grouped line without its topic or its IDs; each decision is
    listed first, escaped, with how many replicas hold each candidate ID, and at most ROWS_SHOWN of them."""
    from fleet_doctor.repair.planner import build_plan

    hostile = "t|x`<b>\n"
    facts = _split_facts(
        {hostile: {"AAAAAAAAAAAAAAAAAAAAAA": 4, "BBBBBBBBBBBBBBBBBBBBBB": 2}, "ok": {"C" * 22: 1, "D" * 22: 1}},
        {"ok": "C" * 22},
    )
    split = [{"rule": "topic-id-split", "broker_id": None, "topic": hostile, "partition": None, "path": None}]
    report = [{"rule": "topic-id-split", "broker_id": None, "topic": "ok", "partition": None, "path": None}]
    plan = build_plan("c1", "run1", split + report, facts)
    (decision,) = plan.decisions
    assert decision["replicas_per_id"] == {"AAAAAAAAAAAAAAAAAAAAAA": 4, "BBBBBBBBBBBBBBBBBBBBBB": 2}
    lines = approval_text.repair_markdown(plan).splitlines()
    first = lines.index("#### Not addressed by this plan: 2 finding(s)") + 2
    assert lines[first] == (
        f"- **A decision for a human:** topic {md_cell(hostile, table=False)}, which topic ID to keep: "
        "`AAAAAAAAAAAAAAAAAAAAAA` (4 replicas), `BBBBBBBBBBBBBBBBBBBBBB` (2 replicas). ZooKeeper has none; the plan "
        "touches none of its replicas."
    )
    assert "<b>" not in render(lines[first]).replace("<code>", "").replace("</code>", "").replace("&lt;b&gt;", "")
    assert sum("decision for a human" in x for x in lines[first:]) == 1  # the other groups leave it out
    many = build_plan(
        "c1",
        "run1",
        [{**split[0], "topic": f"t{i:02d}"} for i in range(13)],
        _split_facts({f"t{i:02d}": {} for i in range(13)}),
    )
    text = approval_text.repair_markdown(many, "/srv/r")
    assert sum(x.startswith("- **A decision for a human:** topic `t") for x in text.splitlines()) == 10
    assert "- … and 3 more decision(s) in `/srv/r/plan.json`" in text and "`t09`" in text and "`t10`" not in text


def test_the_subject_shown_must_be_the_stored_plans(tmp_path: Any) -> None:
    """The subject is rendered from the plan task's XCom (the REST API can write it) and carries "DRY RUN": a request
    whose subject lost it is refused, for the repair, ZooKeeper and restore approvals alike."""
    import dataclasses

    from fleet_doctor.repair import restore_tasks, tasks

    s = settings(FLEET_DOCTOR_REPAIR_DIR=str(tmp_path))
    dry = big_plan(dry_run=True)
    dry = dataclasses.replace(dry, zookeeper=(ZkAction("restore-topic-id", "t", "A" * 22, "every replica holds it"),))
    tasks.save_plan(s, dry)
    subjects = {tasks.BROKERS: approval_text.repair_subject(dry), tasks.ZOOKEEPER: approval_text.zookeeper_subject(dry)}
    for which, subject in subjects.items():
        asked = tasks.approval_request(s, {"hash": dry.hash}, which)
        assert asked.subject == subject and "DRY RUN" in subject
        d = detail("alice", option=asked.option, body=asked.body) | {"subject": subject}
        args = {"task_id": "approve", "plan_hash": dry.hash, "settings": s, "triggered_by": "bob"}
        shown = {"option": asked.option, "body": asked.body, "subject": asked.subject}
        assert check(d, **args, **shown)["plan_hash"] == dry.hash
        with pytest.raises(ApprovalError, match=r"subject .* is not the stored plan's.*nothing was touched"):
            check(d | {"subject": subject.replace("DRY RUN, ", "")}, **args, **shown)
    restore = _restore_plan(start=False)
    where = tmp_path / restore.scope["restore_of"] / "restores" / restore.hash
    where.mkdir(parents=True)
    (where / "plan.json").write_text(restore.to_json())
    asked = restore_tasks.approval_request(s, {"hash": restore.hash, "restore_of": restore.scope["restore_of"]})
    d = detail("alice", option=asked.option, body=asked.body) | {"subject": asked.subject}
    args = {"task_id": "approve", "plan_hash": restore.hash, "settings": s, "triggered_by": "bob"}
    shown = {"option": asked.option, "body": asked.body, "subject": asked.subject}
    assert check(d, **args, **shown)["option"] == asked.option
    with pytest.raises(ApprovalError, match="subject"):
        check(d | {"subject": asked.subject.replace(", left stopped", "")}, **args, **shown)


def _restore_plan(start: bool) -> Plan:
    acts = [
        FileAction("restore", f"/d/t-{i}/partition.metadata", "restore", "t", i, f"sha256 {i:064x}") for i in (0, 1)
    ]
    backups = {"2": [{"tarball": "/r/b2.tar.gz", "sha256": "ab" * 32, "files": {}}]}
    scope = {"restore_of": "f" * 64, "attempt": "manual__x", "start": start, "backups": backups}
    return Plan("lab", "restore-ffff", scope, [BrokerPlan(2, True, True, acts)], [], [])


def test_the_restore_gates_are_in_its_hash_and_its_approval_text() -> None:
    """Issue 28 item 6: a restore's gates are approved like a repair's: another value is another plan."""
    from fleet_doctor.repair.gates import RESTORE_GATE_PARAMS, gates_of

    form = {"timeout_s": 600, "healthy_polls": 3, "poll_interval_s": 10, "isr_timeout_s": 900, "plan": "f" * 12}
    plans = []
    for changed in ({}, {"healthy_polls": 1}, {"timeout_s": 30}, {"min_insync_replicas": 2}):
        p = _restore_plan(start=True)
        scope = {**p.scope, "gates": gates_of({**form, **changed}, RESTORE_GATE_PARAMS)}
        plans.append(Plan(p.cluster, p.audit_run, scope, p.brokers, (), ()))
    assert len({p.hash for p in plans}) == len(plans)
    assert "plan" not in plans[0].gates and plans[3].gates["min_insync_replicas"] == 2
    text = restore_markdown(plans[1])
    assert "- **Gates:** `healthy_polls` `1`, `isr_timeout_s` `900`, `poll_interval_s` `10`, `timeout_s` `600`." in text


def test_the_restore_option_says_when_the_broker_is_left_stopped() -> None:
    from fleet_doctor.repair.approval_text import restore_option, restore_subject

    stopped, started = _restore_plan(start=False), _restore_plan(start=True)
    assert restore_option(stopped) == (
        f"Approve: put back 2 file(s) on 1 broker(s), left stopped (restore {stopped.hash[:12]})"
    )
    assert restore_option(started) == f"Approve: put back 2 file(s) on 1 broker(s) (restore {started.hash[:12]})"
    assert ", left stopped" in restore_subject(stopped) and "left stopped" not in restore_subject(started)
    assert "**left stopped**" in restore_markdown(stopped)


def test_the_scope_takes_kafka_topic_names_only_and_the_approval_names_internal_topics_left_out() -> None:
    """Issue 28 item 16: the page splits the form's topics on commas, so a partition dir named
    ``a,__consumer_offsets-0`` could slip an internal topic into the scope without the page's note: the page leaves a
    name that is not Kafka's out (saying so), the planner refuses one, and the approval names the internal topics a
    scope names without *include internal topics*."""
    from fleet_doctor.airflow_links import RepairScope
    from fleet_doctor.repair.errors import RepairError
    from fleet_doctor.repair.planner import FleetFacts, build_plan

    scope, problems = RepairScope.from_query([("topic", "a,__consumer_offsets"), ("topic", "orders")])
    assert scope.topics == ("orders",) and problems == [
        "topic 'a,__consumer_offsets' is not a Kafka topic name: left out"
    ]
    facts = FleetFacts({1: []}, [])
    for bad in ("a,__consumer_offsets", "..", "x" * 250, "t/../../etc"):
        with pytest.raises(RepairError, match="not Kafka topic names"):
            build_plan("c", "run1", [], facts, topics=[bad])
    plan = build_plan("c", "run1", [], facts, topics=["a", "__consumer_offsets"])
    text = approval_text.repair_markdown(plan)
    assert "- **Internal topics named, not included:** `__consumer_offsets`" in text
    assert "Internal topics named" not in approval_text.repair_markdown(
        build_plan("c", "run1", [], facts, topics=["a"])
    )


def test_approvals_are_read_over_https_or_loopback_and_never_through_a_redirect() -> None:
    """Issue 28 item 13: the approval's source is the deployment's FLEET_DOCTOR_APPROVALS_URL when set (a UI user
    who edits the connection cannot point it elsewhere), https unless on loopback, and a redirect (which would carry
    the bearer token on to wherever it points) is refused."""
    import threading
    import types
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from fleet_doctor.repair import approval
    from fleet_doctor.repair.errors import ApprovalError

    conn = types.SimpleNamespace(host="http://10.1.2.3:8080", schema=None, port=None)
    with pytest.raises(ApprovalError, match=r"10\.1\.2\.3:8080: not https"):
        approval.approvals_base(Settings("i.json", "/d"), conn)
    https = Settings("i.json", "/d", approvals_url="https://airflow.example")
    assert approval.approvals_base(https, conn) == "https://airflow.example"
    loopback = Settings("i.json", "/d", approvals_url="http://127.0.0.1:28080")
    assert approval.approvals_base(loopback, conn) == "http://127.0.0.1:28080"  # the deployment's, not the UI's

    seen: list[tuple[str, str | None]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("Authorization")))
            if self.path == "/hitl":
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/elsewhere")
                self.end_headers()
            else:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        with pytest.raises(ApprovalError, match="answered a redirect"):
            approval._call("GET", f"{url}/hitl", token="secret-token")
        assert seen == [("/hitl", "Bearer secret-token")]  # the redirect's target never saw the token
        assert approval._call("GET", f"{url}/ok", token="t") == (200, {})
    finally:
        server.shutdown()
        server.server_close()
