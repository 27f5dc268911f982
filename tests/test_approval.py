"""The approval gate without a scheduler: the HITL users the approve task is given, the check the acting tasks make
on Airflow's record of the answer (built with Airflow's own REST datamodel, as the hitlDetails endpoint returns
it), the approval text on hostile names (rendered by a CommonMark + GFM-tables renderer), and an S3 endpoint with
credentials. The same gate on a live Airflow with two users: tests/test_approval_live.py."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest

from fleet_doctor.repair import approval
from fleet_doctor.repair.approval import ApprovalError, check, hitl_users
from fleet_doctor.repair.executor import RepairError
from fleet_doctor.repair.plan import BrokerPlan, FileAction, Plan, ZkAction, hashes_in, md_cell
from fleet_doctor.settings import Settings, SettingsError

PLAN = "ab" * 32
BODY = f"### Repair plan `{PLAN[:12]}`\n\n| action | file |\n|---|---|\n\nPlan hash: `{PLAN}`\n"


def settings(**env: str) -> Settings:
    return Settings.from_env({"FLEET_DOCTOR_INVENTORY": "/nonexistent", **env})


def detail(
    by: str | None = "alice", option: str | None = "Approve", body: str = BODY, answered: bool = True
) -> dict[str, Any]:
    """A HITL detail as GET .../hitlDetails returns it (Airflow's BaseHITLDetail, dumped as JSON)."""
    from airflow.api_fastapi.core_api.datamodels.hitl import BaseHITLDetail

    now = datetime.now(UTC)
    fields: dict[str, Any] = {"options": ["Approve", "Reject"], "subject": f"plan {PLAN[:12]}", "body": body}
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
    return check(d, task_id="approve", plan_hash=PLAN, settings=settings(**env), triggered_by=triggered_by)


def test_an_approval_by_an_allowed_user_gives_the_journal_record() -> None:
    d = detail("alice")
    got = record(d, FLEET_DOCTOR_APPROVERS="alice,carol")
    assert got == {
        "task": "approve",
        "option": "Approve",
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
        ("rejected", detail(option="Reject"), {}, "bob", "not \\['Approve'\\]"),
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
        approval.confirm({"dag_run": Run()}, "approve", PLAN, settings())


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
    actions = [FileAction("remove", p, "topic-id-mismatch", "t", 0, "why") for p in HOSTILE]
    zk = [ZkAction("restore-topic-id", "<b>t|</b>\nx", "id`|`<script>", "every replica holds this topic ID")]
    return Plan("c1", "run1", {}, [BrokerPlan(1, True, True, actions)], zk, [])


@pytest.mark.parametrize("which", ["to_markdown", "zookeeper_markdown"])
def test_hostile_names_stay_one_literal_cell(which: str) -> None:
    plan = hostile_plan()
    text = getattr(plan, which)()
    html = render(text)
    assert "<script" not in html and "<img" not in html and "<a " not in html and "<b>" not in html
    assert "<strong>bold" not in html and "<em>em" not in html
    tables = [re.findall(r"<tr>(.*?)</tr>", t, re.S) for t in re.findall(r"<table>(.*?)</table>", html, re.S)]
    for head, *rows in tables:  # every row of every table has as many cells as its header: none was split
        assert all(len(re.findall(r"<td", r)) == len(re.findall(r"<th", head)) for r in rows), rows
    rows_per_table = [len(rows) for _, *rows in tables]
    assert rows_per_table == ([1] if which == "zookeeper_markdown" else [0, len(HOSTILE), 1])
    assert hashes_in(text) == [plan.hash]  # a name cannot start a line of its own, so cannot name a plan


def test_md_cell_shows_the_name_as_it_is() -> None:
    """Each value is one code span whose text is the name, control characters shown as escapes."""
    for name in HOSTILE:
        cell = render(f"| f |\n|---|\n| {md_cell(name)} |\n")
        (code,) = re.findall(r"<td><code>(.*?)</code></td>", cell, re.S)
        shown = code.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&")
        assert shown == name.replace("\n", "\\n").replace("\u202e", "\\u202e")
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
            body=BODY,
        )
    ok = check(detail("alice"), task_id="approve", plan_hash=PLAN, settings=settings(), triggered_by="b", body=BODY)
    assert ok["by"]["id"] == "alice"
