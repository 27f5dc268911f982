"""The fleet overview in Chromium (Debian's, driven by Playwright): the Kafka fleet view's app served by uvicorn on
127.0.0.1 (a process, stopped by PID) over a fleet of three clusters whose stores hold audits published by the real
publisher from real detection output (the corpus fleet's recorded findings on the ZooKeeper cluster, the KRaft
corpus's on the KRaft one, none on the third). The rows come worst first; a click on a column sorts by it, again the
other way; a cluster's name opens its page, whose rule-wide repair opens its own repair DAG's form; the way back
leads to the overview. The same pages inside a live Airflow: tests/test_console.py, tests/test_ui_browser.py."""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor import layout
from fleet_doctor.audit import history
from fleet_doctor.settings import Settings
from fleet_lab.zk_server import free_port
from harness import inventories

pytestmark = [pytest.mark.live, pytest.mark.timeout(600)]
REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "detection-findings"
CHROMIUM = Path("/usr/bin/chromium")
FLEET = (
    inventories.inventory("zk-prod", brokers=3),
    inventories.inventory("kraft-prod", brokers=3, kraft=True),
    inventories.inventory("calm", brokers=3),
)


def recorded(name: str) -> list[dict[str, Any]]:
    with gzip.open(DATA / name, "rt") as f:
        return [r for r in map(json.loads, f) if "rule" in r]


def publish(settings: Settings, cluster: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    run = "scheduled__2026-11-29T02:00:00+00:00"
    area = layout.staging(run)
    settings.store.write_jsonl(area.findings_json, rows)
    settings.store.write_text(area.summary, "{}")
    discovered = {"cluster": cluster, "only_in_inventory": [], "only_in_zookeeper": []}
    return history.publish(settings, run, discovered, {"audited": [1, 2, 3], "not_audited": []})


@pytest.fixture(scope="module")
def view(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if not CHROMIUM.exists():
        pytest.skip("Chromium not installed (/usr/bin/chromium: bin/dev setup installs Debian's chromium)")
    root = tmp_path_factory.mktemp("fleet-browser")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("FLEET_DOCTOR_", "AIRFLOW"))},
        "FLEET_DOCTOR_INVENTORY": str(inventories.fleet_dir(root / "fleet", *FLEET)),
        "FLEET_DOCTOR_DATA": str(root / "data"),
        "PYTHONPATH": str(REPO / "plugins"),
    }
    settings = Settings.from_env(env)
    summaries = {
        "zk-prod": publish(settings.for_cluster("zk-prod"), "zk-prod", recorded("mutated.jsonl.gz")),
        "kraft-prod": publish(settings.for_cluster("kraft-prod"), "kraft-prod", recorded("kraft.jsonl.gz")),
        "calm": publish(settings.for_cluster("calm"), "calm", []),
    }
    port = free_port()
    code = (
        "import uvicorn\nfrom fleet_doctor.console.app import create_app\n"
        f"uvicorn.run(create_app(), host='127.0.0.1', port={port}, log_level='warning')\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"uvicorn exited {proc.returncode}"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "uvicorn did not listen within 60 s"
            time.sleep(0.2)
        yield {"base": f"http://127.0.0.1:{port}", "summaries": summaries}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_the_overview_sorts_and_leads_to_each_clusters_repair(view: dict[str, Any]) -> None:
    from playwright.sync_api import expect, sync_playwright

    summaries = view["summaries"]
    worst_first = sorted(
        summaries,
        key=lambda c: (-summaries[c]["by_severity"]["critical"], -summaries[c]["by_severity"]["warning"], c),
    )
    assert summaries["zk-prod"]["by_severity"]["critical"] and summaries["kraft-prod"]["findings"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(30_000)
            dialogs: list[str] = []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(view["base"] + "/")
            rows = page.get_by_test_id("cluster-row")
            expect(rows).to_have_count(3)

            def order() -> list[str]:
                return [r.get_attribute("data-cluster") or "" for r in rows.all()]

            assert order() == worst_first
            for c in FLEET:  # the critical and warning counts are the summaries'
                row = page.locator(f"[data-testid=cluster-row][data-cluster='{c['cluster']}']")
                expect(row.get_by_test_id("critical")).to_have_text(
                    str(summaries[c["cluster"]]["by_severity"]["critical"])
                )
                expect(row.get_by_test_id("warning")).to_have_text(
                    str(summaries[c["cluster"]]["by_severity"]["warning"])
                )
            # no Airflow behind this app: the pending approvals say they could not be counted
            expect(page.get_by_test_id("pending").first).to_have_text("?")
            page.get_by_role("columnheader", name="cluster", exact=True).click()
            assert order() == sorted(summaries, reverse=True)  # first click: descending
            page.get_by_role("columnheader", name="cluster", exact=True).click()
            assert order() == sorted(summaries)
            page.get_by_role("columnheader", name="warning", exact=True).click()
            warnings = [summaries[c]["by_severity"]["warning"] for c in order()]
            assert warnings == sorted(warnings, reverse=True)

            # the KRaft cluster's page, its rule-wide repair aimed at its own repair DAG
            page.locator("[data-testid=cluster-row][data-cluster='kraft-prod']").get_by_test_id("cluster-link").click()
            expect(page.get_by_test_id("kafka-fleet")).to_have_attribute("data-cluster", "kraft-prod")
            rule_link = page.get_by_test_id("rule-repair-link").first
            rule = page.get_by_test_id("rule-repair").first.get_attribute("data-rule")
            rule_link.click()
            form = page.get_by_test_id("repair-form")
            expect(form).to_be_visible()
            expect(page.get_by_test_id("repair-dag")).to_have_text("kafka_fleet_repair__kraft-prod")
            expect(form.locator("[name=rules]")).to_have_value(rule or "")
            expect(form.locator("[name=brokers]")).to_have_value("")
            page.go_back()
            page.get_by_test_id("fleet-link").click()
            expect(page.get_by_test_id("kafka-fleet-overview")).to_be_visible()
            assert dialogs == []
        finally:
            browser.close()
