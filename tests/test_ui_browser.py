"""The Airflow UI as the operator's console, in a real browser: Playwright (PyPI) drives Debian's Chromium
(/usr/bin/chromium, installed by bin/dev; Playwright downloads no browser) against the stack ``bin/dev ui
--scenario seed-004`` brings up. The module starts that command's Python entry (``python -m fleet_lab.demo ui``)
once, in a subprocess: a fleet of two lab clusters, a 3-broker ZooKeeper lab (real sshd, ZooKeeper 3.8) with the
seed-004 scenario and a 3-node KRaft lab with the demo's KRaft incidents, a live Airflow (api-server, scheduler,
dag-processor, triggerer as processes) on 127.0.0.1 and each cluster's nightly audit done. In file order:

1. the command says where the UI is, who logs in and where the password is; every component is healthy;
2. log in through Airflow's login page; the home page shows no red health badge; the Kafka fleet overview lists both
   clusters, audited (the KRaft one as kraft, with its findings); the ZooKeeper cluster's page shows the
   published findings (read from the store here, grouped by broker, rule and cause); the run's HTML report, opened
   from the view, links each repairable group to the pre-filled repair inside Airflow;
3. from the view's topic-id-mismatch rule: its repair across every broker opens the pre-filled trigger form (the rule,
   the topic, no broker: nothing typed), it is submitted; Browse ->
   Required Actions -> the request shows the plan's summary and full hash; Reject -> nothing changed on the lab;
4. the same with Approve -> the run succeeds and the lab, read from ZooKeeper and the files, is repaired: every
   replica's partition.metadata holds ZooKeeper's topic ID, every partition has its full ISR, the controller was
   restarted last;
5. SIGINT (Ctrl-C) stops every process the command started (by PID: Airflow's and both labs').

The pre-filled form keeps the repair DAG's timing defaults (60 s between brokers, three health polls 10 s apart);
the tests shorten only those on the request the page sends (asserting the rest is what the form says), as an
operator could in Airflow's own Trigger form. A screenshot of each step is kept under test-artifacts/ui-browser/
when a test fails (its path is in the failure message); a passing test removes its own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor import layout
from fleet_doctor.finding_groups import group_findings
from fleet_doctor.store import Store
from fleet_lab import demo
from fleet_lab import fleet as lab
from fleet_lab.airflow_stack import LiveAirflow
from fleet_lab.fleet import LOOPBACK, descendants, listening_sockets
from fleet_lab.zk_server import free_port, pid_alive, started_at
from harness.live_stack import FAST, REPAIR, attempt_of, events, fleet_snapshot, plan_dir, zk_json

pytestmark = pytest.mark.timeout(1800)
CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts" / "ui-browser"
TOPIC, RULE = "seed-004", "topic-id-mismatch"
KRAFT = f"{lab.DEFAULT_CLUSTER}-kraft"  # the fleet's second cluster, beside the lab (bin/dev ui)
ACTIVE = ("new", "persisting", "unverified")  # the statuses of findings still standing (the view's groups)
TIMING = {k: v for k, v in FAST.items() if k != "isr_timeout_s"}  # pauses and polls; the ISR timeout kept


class UiProcess:
    """``python -m fleet_lab.demo ui`` in a subprocess, its output collected line by line."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleet_lab.demo", "ui", *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("[ui] ready"):
                self.ready.set()
        self.ready.set()  # exited

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self, timeout: float) -> None:
        if not self.ready.wait(timeout) or self.proc.poll() is not None:
            raise AssertionError(f"`ui` not ready within {timeout:.0f} s (exit {self.proc.poll()}):\n{self.output}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("ui-browser")
    lab_dir, home, data = root / "lab", root / "airflow", root / "data"
    port = free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "lab"), str(REPO / "plugins")])
    for var in ("FLEET_DOCTOR_APPROVERS", "FLEET_DOCTOR_UI_PASSWORD", "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"):
        env.pop(var, None)  # the defaults a new user has
    args = ["--scenario", TOPIC, "--lab", str(lab_dir), "--home", str(home), "--data", str(data), "--port", str(port)]
    ui = UiProcess(args, env)
    try:
        ui.wait_ready(900)
        # a REST client of the same Airflow (the same home: its passwords file and the scheduler's log); it starts
        # nothing
        af = LiveAirflow(demo.airflow_environ(home, lab_dir, data, env), port=port)
        store = Path(demo.store_of(data).base)  # the lab cluster's store in the data root: clusters/lab/
        yield {"ui": ui, "af": af, "port": port, "lab": lab_dir, "home": home, "data": store, "root": root, "env": env}
    finally:
        if ui.proc.poll() is None:
            leftovers = descendants(ui.proc.pid)
            ui.proc.send_signal(signal.SIGINT)
            try:
                ui.proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                ui.proc.kill()
                ui.proc.wait(timeout=30)
            for pid in leftovers:
                if pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)
        for d in (lab_dir, demo.kraft_lab_dir(lab_dir)):
            if lab.is_up(d):
                lab.down(d)


@pytest.fixture(scope="module")
def browser(stack: dict[str, Any]) -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: the browser tests drive Debian's Chromium (bin/dev setup installs it)")
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=60_000)  # a busy 2-CPU machine
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            yield b
        finally:
            b.close()


class Steps:
    """A screenshot after each step of a test, named in order."""

    def __init__(self, page: Any, directory: Path) -> None:
        self.page, self.dir, self.n = page, directory, 0

    def __call__(self, name: str) -> None:
        self.n += 1
        self.page.screenshot(path=str(self.dir / f"{self.n:02d}-{name}.png"), full_page=True)


@contextmanager
def recorded(browser: Any, request: pytest.FixtureRequest) -> Iterator[tuple[Any, Steps]]:
    """A fresh browser context and page; on failure, a last screenshot and the screenshots' path in the error."""
    directory = ARTIFACTS / request.node.name
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    steps = Steps(page, directory)
    try:
        yield page, steps
    except BaseException as e:
        try:
            steps("failed-here")
        except Exception as shot_error:  # the page may be gone; the error is the point
            e.add_note(f"(no last screenshot: {shot_error})")
        e.add_note(f"screenshots of each step: {directory}")
        raise
    else:
        shutil.rmtree(directory, ignore_errors=True)
    finally:
        context.close()


def credentials(stack: dict[str, Any]) -> tuple[str, str]:
    """The user and password as a new user finds them: from what `ui` printed."""
    out = stack["ui"].output
    user = re.search(r"^\[ui\]\s+user:\s+(\S+)$", out, re.M)
    where = re.search(r"^\[ui\]\s+password:\s+(\S+) \(JSON: user -> password\)$", out, re.M)
    assert user and where, out
    return user.group(1), json.loads(Path(where.group(1)).read_text())[user.group(1)]


def log_in(page: Any, stack: dict[str, Any], steps: Steps) -> None:
    from playwright.sync_api import expect

    user, password = credentials(stack)
    page.goto(f"http://127.0.0.1:{stack['port']}/")
    expect(page).to_have_url(re.compile(r"/auth/login"))
    page.get_by_label("Username").fill(user)
    page.get_by_label("Password").fill(password)
    steps("login")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Welcome")).to_be_visible()


def published_groups(data: Path) -> tuple[str, list[Any]]:
    """The latest audit run and its findings still standing, grouped: read from the store, not from the page."""
    store = Store(data)
    run = str(store.read_jsonl(layout.HISTORY_RUNS)[-1]["audit_run"])
    rows = store.read_jsonl(layout.history_findings(run))
    return run, group_findings(r for r in rows if r.get("status") in ACTIVE)


def shown_and_published(page: Any, frame: Any, data: Path, steps: Steps) -> tuple[Any, list[Any]]:
    """The cluster's view (``frame``) and the groups of the store's latest run, once the view shows that run. The
    stack's audit DAGs keep their nightly schedule: when the clock passes it during a test (02:00 UTC), the scheduler
    publishes a newer run between the page's read of the store and the test's, and the view opened again shows it."""
    from playwright.sync_api import expect

    for _ in range(3):
        view = frame.get_by_test_id("kafka-fleet")
        expect(view).to_have_attribute("data-audit-run", re.compile(r"\S"))
        run, groups = published_groups(data)
        if view.get_attribute("data-audit-run") == run:
            return frame, groups
        frame = open_fleet_view(page, steps)
    raise AssertionError(f"the fleet view does not show the store's latest run {run}")


def open_fleet_view(page: Any, steps: Steps) -> Any:
    """Kafka fleet in the nav: the view's iframe (its src is the plugin's app), the fleet overview; the lab's row
    opens the lab cluster's page."""
    from playwright.sync_api import expect

    page.get_by_role("link", name="Kafka fleet").click()
    expect(page).to_have_url(re.compile(r"/plugin/kafka-fleet(/kafka-fleet/)?$"))  # Airflow mirrors the frame's path
    expect(page.locator("iframe")).to_have_attribute("src", "kafka-fleet/")
    frame = page.frame_locator("iframe")
    rows = frame.get_by_test_id("cluster-row")
    expect(rows).to_have_count(2)
    kraft = frame.locator(f"[data-testid=cluster-row][data-cluster='{KRAFT}']")
    expect(kraft).to_have_attribute("data-state", "ok")  # audited by the scheduler beside the ZooKeeper one
    expect(kraft.locator("td").nth(1)).to_have_text("kraft")
    expect(kraft.get_by_test_id("critical")).not_to_have_text("0")  # the demo's KRaft incidents, found
    expect(kraft.get_by_test_id("repair-lock")).to_have_attribute("data-state", "free")  # its lock in the repairs dir
    ours = frame.locator(f"[data-testid=cluster-row][data-cluster='{lab.DEFAULT_CLUSTER}']")
    expect(ours).to_have_attribute("data-state", "ok")
    expect(ours.get_by_test_id("repair-lock")).to_have_attribute("data-state", "free")  # its audit saw it
    steps("kafka-fleet-overview")
    ours.get_by_test_id("cluster-link").click()
    expect(frame.get_by_test_id("kafka-fleet")).to_be_visible()
    steps("kafka-fleet")
    return frame


def trigger_from_view(page: Any, stack: dict[str, Any], steps: Steps) -> str:
    """seed-004's drift is on every replica of the topic, so the repair is the rule's across every broker: its link
    beside the groups' -> the form pre-filled with the rule and the topic, no broker named, nothing typed (checked
    against the groups) -> Trigger. Returns the run."""
    from playwright.sync_api import expect

    _, groups = published_groups(stack["data"])
    drift = [g for g in groups if g.rule == RULE]
    assert len({g.broker_id for g in drift}) == 3, drift  # one group per broker: every replica of the topic
    frame = open_fleet_view(page, steps)
    frame.locator(f"[data-testid=rule-repair][data-rule='{RULE}']").get_by_test_id("rule-repair-link").click()
    form = frame.get_by_test_id("repair-form")
    expect(form).to_be_visible()
    expect(form.locator("[name=rules]")).to_have_value(RULE)
    expect(form.locator("[name=brokers]")).to_have_value("")
    topics = sorted({t for g in drift for t in g.topics})
    expect(form.locator("[name=topics]")).to_have_value(", ".join(topics))
    expect(form.locator("[name=dry_run]")).not_to_be_checked()
    steps("repair-form")
    sent: list[dict[str, Any]] = []

    def shorter_waits(route: Any) -> None:
        body = json.loads(route.request.post_data)
        sent.append(json.loads(json.dumps(body)))
        body["conf"].update(TIMING)
        route.continue_(post_data=json.dumps(body))

    runs_url = f"**/api/v2/dags/{REPAIR}/dagRuns"
    page.route(runs_url, shorter_waits)
    posted = f"/dags/{REPAIR}/dagRuns"
    with page.expect_response(lambda r: r.url.endswith(posted) and r.request.method == "POST") as got:
        frame.get_by_test_id("trigger-repair").click()
    assert got.value.status == 200, got.value.text()
    page.unroute(runs_url)
    (body,) = sent
    assert body["conf"]["audit_run"] == "latest"
    assert {k: body["conf"][k] for k in ("rules", "brokers", "topics", "dry_run")} == {
        "rules": [RULE],
        "brokers": [],
        "topics": topics,
        "dry_run": False,
    }
    run = str(got.value.json()["dag_run_id"])
    expect(page).to_have_url(re.compile(rf"/dags/{REPAIR}/runs/"))  # the page opens the new run in Airflow
    steps("run-page")
    return run


def open_required_action(
    page: Any, stack: dict[str, Any], run: str, steps: Steps, dag: str = REPAIR, store: Path | None = None
) -> dict[str, Any]:
    """Browse -> Required Actions -> this run's request (of ``dag``, its plans in ``store``: default the lab
    cluster's); checks its body: the plan summary and the full hash. Waits first until the scheduler can take an
    answer (LiveAirflow.wait_for_approval says why)."""
    from playwright.sync_api import expect

    request = stack["af"].wait_for_approval(dag, run, "approve")
    page.get_by_role("button", name="Browse").click()
    page.get_by_role("menuitem", name="Required Actions").click()
    expect(page).to_have_url(re.compile(r"/required_actions$"))
    row = page.locator("tr", has_text=run)
    subject = row.get_by_role("link", name=re.compile(r"^Kafka repair"))
    expect(subject).to_be_visible()
    steps("required-actions")
    subject.click()
    expect(page).to_have_url(re.compile(r"/tasks/approve/required_actions$"))
    plan_hash = plan_dir(store or stack["data"], request).name
    for text in (request["subject"], "What:", "Risk:", "Backups:", "Undo:", plan_hash):
        expect(page.get_by_text(text, exact=False).first).to_be_visible()
    steps("request")
    return request


def answer(page: Any, option: re.Pattern[str], steps: Steps) -> str:
    """Click the option's button; returns what Airflow recorded as chosen."""
    button = page.get_by_role("button", name=option)
    expect_one(button)
    with page.expect_response(lambda r: "hitlDetails" in r.url and r.request.method == "PATCH") as got:
        button.click()
    assert got.value.status == 200, got.value.text()
    steps("answered")
    (chosen,) = got.value.json()["chosen_options"]
    return str(chosen)


def expect_one(locator: Any) -> None:
    from playwright.sync_api import expect

    expect(locator).to_have_count(1)
    expect(locator).to_be_enabled()


def hover_until_tooltip(page: Any, target: Any, tooltip: Any, tries: int = 5) -> None:
    """Hover ``target`` until its tooltip shows. Chakra opens a tooltip after a delay and only on a pointer that
    enters the element: a hover that lands while the previous tooltip is closing can open none, so the pointer
    leaves and enters again (a condition wait per try, no fixed sleep)."""
    from playwright.sync_api import expect

    for attempt in range(tries):
        target.hover()
        try:
            expect(tooltip).to_have_count(1, timeout=5_000)
            return
        except AssertionError:
            if attempt == tries - 1:
                raise
            page.mouse.move(0, 0)


def listening_addresses(port: int) -> set[str]:
    """The local addresses of sockets listening on ``port`` (from /proc/net/tcp and tcp6)."""
    out = set()
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            local, _, st = line.split()[1:4]
            addr, hexport = local.split(":")
            if st == "0A" and int(hexport, 16) == port:
                out.add(addr)
    return out


def test_ui_says_where_and_who_and_every_component_is_healthy(stack: dict[str, Any]) -> None:
    out, port = stack["ui"].output, stack["port"]
    assert f"[ui] Airflow UI: http://127.0.0.1:{port}/" in out
    user, password = credentials(stack)
    assert user == "admin" and password
    assert f"bin/fleet-lab status --dir {stack['lab']}" in out
    assert "Kafka fleet" in out and "Required Actions" in out and "Approve" in out
    assert "any signed-in user" in out  # no FLEET_DOCTOR_APPROVERS: admin approves its own trigger
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=10) as r:
        health = json.loads(r.read())
    assert {k: v["status"] for k, v in health.items()} == {
        "metadatabase": "healthy",
        "scheduler": "healthy",
        "triggerer": "healthy",
        "dag_processor": "healthy",
    }
    assert listening_addresses(port) == {"0100007F"}  # 127.0.0.1 only
    # nothing ui started listens beyond loopback: Airflow's components and what they forked, the lab's processes
    started = [stack["ui"].proc.pid, *descendants(stack["ui"].proc.pid)]
    for d in (stack["lab"], demo.kraft_lab_dir(stack["lab"])):
        state = lab.LabState.load(d)
        started += [state.zk_pid or 0, *(b.sshd_pid or 0 for b in state.brokers)]
        started += [b["pid"] for b in lab.status(d)["brokers"]]
    sockets = listening_sockets([p for p in started if p])
    assert (("0100007F", port)) in sockets and len(sockets) >= 8, sockets  # the api-server, ZooKeeper, 6 sshd
    assert {k: v for k, v in sockets.items() if k[0] not in LOOPBACK} == {}


def test_home_page_is_green_and_the_fleet_view_shows_the_published_findings(
    stack: dict[str, Any], browser: Any, request: pytest.FixtureRequest
) -> None:
    from playwright.sync_api import expect

    with recorded(browser, request) as (page, steps):
        log_in(page, stack, steps)
        badges = page.get_by_test_id("state-badge").filter(
            has_text=re.compile(r"^(MetaDatabase|Scheduler|Triggerer|Dag Processor)$")
        )
        expect(badges).to_have_count(4)
        steps("home")
        status = page.get_by_role("tooltip").filter(has_text="Status:")
        for i in range(4):  # each badge's tooltip says its status; red is anything but Healthy
            hover_until_tooltip(page, badges.nth(i), status)
            expect(status).to_contain_text("Status: Healthy")
            page.get_by_role("heading", name="Welcome").hover()  # away: the tooltip closes
            expect(status).to_have_count(0)
        frame, groups = shown_and_published(page, open_fleet_view(page, steps), stack["data"], steps)
        assert any(g.rule == RULE for g in groups)
        rows = frame.get_by_test_id("finding-group")
        expect(rows).to_have_count(len(groups))
        shown = {
            (r.get_attribute("data-broker"), r.get_attribute("data-rule")): (
                int(r.get_attribute("data-count") or -1),
                r.get_by_test_id("repair-link").count(),
            )
            for r in rows.all()
        }
        assert shown == {
            ("cluster" if g.broker_id is None else str(g.broker_id), g.rule): (
                g.count,
                int(g.remediation != "report-only"),
            )
            for g in groups
        }
        expect(frame.get_by_test_id("required-actions-link")).to_be_visible()
        # the run's HTML report, opened from the view, links each repairable group into Airflow: the pre-filled repair
        frame.get_by_test_id("report-link").click()
        in_report = frame.get_by_test_id("repair-link")
        expect(in_report).to_have_count(sum(g.remediation != "report-only" for g in groups))
        prefix = f"{stack['af'].base}/plugin/kafka-fleet/kafka-fleet/clusters/{lab.DEFAULT_CLUSTER}/repair?"
        expect(in_report.first).to_have_attribute("href", re.compile("^" + re.escape(prefix)))
        steps("report")
        in_report.first.click()
        expect(page).to_have_url(re.compile(r"/plugin/kafka-fleet/kafka-fleet/clusters/lab/repair\?rule="))
        expect(page.frame_locator("iframe").get_by_test_id("repair-form")).to_be_visible()
        steps("report-repair-link")


def test_reject_in_the_browser_changes_nothing(
    stack: dict[str, Any], browser: Any, request: pytest.FixtureRequest
) -> None:
    af, state = stack["af"], lab.LabState.load(stack["lab"])
    before = fleet_snapshot(state)
    with recorded(browser, request) as (page, steps):
        log_in(page, stack, steps)
        run = trigger_from_view(page, stack, steps)
        open_required_action(page, stack, run, steps)
        assert answer(page, re.compile(r"^Reject$"), steps) == "Reject"
    assert af.wait_run(REPAIR, run) == "success"
    assert af.task_states(REPAIR, run)["execute"] == "skipped"
    assert af.hitl_detail(REPAIR, run, "approve")["responded_by_user"]["id"] == "admin"
    assert fleet_snapshot(state) == before  # no file changed, no broker stopped or started, no re-registration


def test_approve_in_the_browser_repairs_seed_004(
    stack: dict[str, Any], browser: Any, request: pytest.FixtureRequest
) -> None:
    af, state = stack["af"], lab.LabState.load(stack["lab"])
    zk_topic_id = zk_json(state, f"/brokers/topics/{TOPIC}")["topic_id"]
    controller = zk_json(state, "/controller")["brokerid"]
    t0 = time.time()
    with recorded(browser, request) as (page, steps):
        log_in(page, stack, steps)
        run = trigger_from_view(page, stack, steps)
        approval = open_required_action(page, stack, run, steps)
        plan = json.loads((plan_dir(stack["data"], approval) / "plan.json").read_text())
        order = [b["broker_id"] for b in plan["brokers"] if b["restart"]]
        assert sorted(order) == [1, 2, 3] and order[-1] == controller
        assert answer(page, re.compile(r"^Approve"), steps).startswith("Approve")
    assert af.wait_run(REPAIR, run) == "success", af.task_states(REPAIR, run)
    detail = af.hitl_detail(REPAIR, run, "approve")
    assert detail["responded_by_user"]["id"] == "admin" and detail["chosen_options"][0].startswith("Approve")
    # what a watcher read in the execute task's log, as Airflow serves it: each broker's ISR wait and health polls
    log = af.task_log(REPAIR, run, "execute")
    for b in order:
        assert re.search(rf"broker {b}: waiting for ISR: done, \d+/\d+ partitions back, \d+/\d+ healthy polls", log), b
    # the lab, read on its own: each broker restarted once, in plan order (the controller last) ...
    starts = {b: [e["ts"] for e in es if e["event"] == "running" and e["ts"] > t0] for b, es in events(state).items()}
    assert {b: len(v) for b, v in starts.items()} == {1: 1, 2: 1, 3: 1}
    assert sorted(starts, key=lambda b: starts[b][0]) == order
    # ... every replica's partition.metadata holds ZooKeeper's topic ID, every partition has its full ISR
    lab.wait_healthy(state, timeout=60)
    ids = {k: v for k, v in lab.partition_topic_ids(state).items() if k[1] == TOPIC}
    assert ids and set(ids.values()) == {zk_topic_id}
    assigned = zk_json(state, f"/brokers/topics/{TOPIC}")["partitions"]
    for p, replicas in assigned.items():
        st = zk_json(state, f"/brokers/topics/{TOPIC}/partitions/{p}/state")
        assert sorted(st["isr"]) == sorted(replicas), (p, st)


def test_approve_in_the_browser_repairs_the_kraft_cluster(
    stack: dict[str, Any], browser: Any, request: pytest.FixtureRequest
) -> None:
    """The fleet's KRaft cluster (its demo incidents: a bad index on node 1, a drifted topic ID on node 2, a
    diverged quorum-state on node 3, a replica Kafka will find stray): its repair approved in the browser quarantines
    the index, node 1 restarts behind the quorum gate, and the plan leaves out what KRaft refuses, saying why."""
    from fleet_doctor.airflow_links import repair_dag

    af, dag = stack["af"], repair_dag(KRAFT)
    store = Path(demo.store_of(stack["root"] / "data", cluster=KRAFT).base)
    state = lab.LabState.load(demo.kraft_lab_dir(stack["lab"]))
    t0 = time.time()
    run = af.trigger(dag, FAST)
    with recorded(browser, request) as (page, steps):
        log_in(page, stack, steps)
        approval = open_required_action(page, stack, run, steps, dag, store)
        from playwright.sync_api import expect

        expect(page.get_by_text("KRaft:", exact=False).first).to_be_visible()  # the lock, the gates, the refusals
        plan = json.loads((plan_dir(store, approval) / "plan.json").read_text())
        assert [b["broker_id"] for b in plan["brokers"] if b["restart"]] == [1]
        assert {a["rule"] for b in plan["brokers"] for a in b["actions"]} == {"index-size"}
        assert any("KAFKA-16814" in s["why"] for s in plan["skipped"])  # node 2's topic-ID files: refused
        assert answer(page, re.compile(r"^Approve"), steps).startswith("Approve")
    assert af.wait_run(dag, run) == "success", af.task_states(dag, run)
    journal = json.loads((attempt_of(store, approval, run) / "journal.json").read_text())
    (prechecked,) = [h for h in journal["brokers"]["1"]["history"] if h["state"] == "prechecked"]
    assert "the quorum keeps a caught-up majority without this voter" in prechecked["detail"]
    starts = {b: [e["ts"] for e in es if e["event"] == "running" and e["ts"] > t0] for b, es in events(state).items()}
    assert {b: len(v) for b, v in starts.items()} == {1: 1, 2: 0, 3: 0}
    lab.wait_healthy(state, timeout=60)


def test_a_second_ui_leaves_a_running_lab_alone(stack: dict[str, Any]) -> None:
    """Another ``bin/dev ui`` (another port) on the lab dir of a running one refuses, before it touches anything."""
    before = lab.status(stack["lab"])
    home, data = stack["root"] / "second-airflow", stack["root"] / "second-data"
    args = ["ui", "--lab", str(stack["lab"]), "--home", str(home), "--data", str(data), "--port", str(free_port())]
    r = subprocess.run(
        [sys.executable, "-m", "fleet_lab.demo", *args], env=stack["env"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and f"a fleet lab is already up in {stack['lab']}" in r.stderr, r.stdout + r.stderr
    assert lab.status(stack["lab"]) == before and not home.exists() and not data.exists()


def test_ctrl_c_stops_every_process_ui_started(stack: dict[str, Any]) -> None:
    ui, port = stack["ui"], stack["port"]
    assert ui.proc.poll() is None, ui.output
    status = lab.status(stack["lab"])
    state = lab.LabState.load(stack["lab"])
    kraft_dir = demo.kraft_lab_dir(stack["lab"])
    kraft = lab.LabState.load(kraft_dir)
    started = {
        "ui's children (Airflow and what it forked, ZooKeeper, sshd)": descendants(ui.proc.pid),
        "lab": [state.zk_pid or 0, *(b.sshd_pid or 0 for b in state.brokers)]
        + [b["pid"] for b in status["brokers"] if b["pid"]],
        "KRaft lab": [b.sshd_pid or 0 for b in kraft.brokers] + [b["pid"] for b in lab.status(kraft_dir)["brokers"]],
    }
    assert len(started["lab"]) == 7 and all(started["lab"]), status  # ZooKeeper, 3 sshd, 3 brokers
    assert len(started["KRaft lab"]) == 6 and all(started["KRaft lab"])  # 3 sshd, 3 combined nodes
    assert len(started["ui's children (Airflow and what it forked, ZooKeeper, sshd)"]) >= 4
    # each process by its PID and start time: the suite starts enough processes that PIDs wrap within minutes
    when = {what: {p: started_at(p) for p in pids} for what, pids in started.items()}
    ui.proc.send_signal(signal.SIGINT)
    assert ui.proc.wait(timeout=180) == 0, ui.output
    assert "[ui] every process started is stopped" in ui.output
    left = {what: [p for p, t in pids.items() if t is not None and started_at(p) == t] for what, pids in when.items()}
    assert left == {what: [] for what in started}, ui.output[-3000:]
    assert not listening_addresses(port)
    assert not lab.is_up(stack["lab"]) and not lab.is_up(kraft_dir)


def test_chosen_password_is_written_for_the_simple_auth_manager(tmp_path: Path) -> None:
    """FLEET_DOCTOR_UI_PASSWORD's path (the live stack above uses the generated one): the chosen password replaces
    the user's in the simple auth manager's passwords file, readable by its owner only; the reader keeps its own."""
    env = {"AIRFLOW_HOME": str(tmp_path), "PATH": os.environ.get("PATH", "")}
    af = LiveAirflow(env, port=free_port(), passwords={"admin": "chosen-one"})
    stored = json.loads(af.passwords_file.read_text())
    assert stored["admin"] == "chosen-one" and stored["fleet_doctor_reader"] not in ("", "chosen-one")
    assert af.passwords_file.stat().st_mode & 0o077 == 0
    again = LiveAirflow(env, port=free_port())  # kept across restarts
    assert json.loads(again.passwords_file.read_text()) == stored


def test_metadata_chooses_which_lab_clusters_ui_brings_up(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``bin/dev ui --metadata kraft`` brings up the KRaft lab alone (its repair approved like the other's);
    ``--metadata zookeeper`` and ``--no-kraft`` the ZooKeeper one alone; both by default."""
    asked: list[tuple[bool, bool]] = []
    monkeypatch.setattr(demo, "ui", lambda *a, **k: asked.append((k["zookeeper"], k["kraft"])) or 0)
    where = ["--home", str(tmp_path / "h"), "--data", str(tmp_path / "d"), "--lab", str(tmp_path / "lab")]
    for extra in ([], ["--metadata", "kraft"], ["--metadata", "zookeeper"], ["--no-kraft"]):
        assert demo.main(["ui", *where, *extra]) == 0
    assert asked == [(True, True), (False, True), (True, False), (True, False)]
