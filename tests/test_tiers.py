"""The suite's split over workers (tests/conftest.py): ``bin/dev test`` runs three pytest-xdist workers with
``--dist loadgroup``, and every module is an ``xdist_group`` of its own, so that its module fixtures (a lab, a live
Airflow, a ``bin/dev ui`` stack) are made once, on one worker. pytest 9.2 stopped reading the node id pytest-xdist
3.8 rewrites to carry the group, and loadgroup then spread every module over both workers without a word: each
worker made every module fixture again, and both started a live Airflow. This checks the split itself, with the
suite's own conftest, pytest and xdist; and the order in which the workers take the groups (the longest first)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
MODULES = ["tests/test_records.py", "tests/test_min_isr.py", "tests/test_finding_groups.py"]


def test_each_module_runs_on_one_worker() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "FLEET_LAB_PORT_SLICE"))}
    args = ["-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "-v", "-m", "not live", *MODULES]
    r = subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, module in re.findall(r"^\[(gw\d+)\] .*? (tests/[\w/]+\.py)::", r.stdout, re.MULTILINE):
        workers[module].add(worker)
    assert set(workers) == set(MODULES), r.stdout[-3000:]
    assert {m: len(w) for m, w in workers.items()} == dict.fromkeys(MODULES, 1), dict(workers)


# ---- the order the workers take the groups in
class _Item:
    def __init__(self, name: str, group: str) -> None:
        self.name, self.group = name, group

    def get_closest_marker(self, name: str) -> Any:
        return type("Marker", (), {"args": (self.group,)})() if name == "xdist_group" else None


def test_the_longest_groups_go_first_and_each_keeps_its_order() -> None:
    from conftest import AIRFLOW_GROUP, GROUP_SECONDS_PER_TEST, ordered_by_group_seconds

    many_short = [_Item(f"u{i}", "test_unit_many") for i in range(30)]  # 30 tests: 3 s by the per-test estimate
    items = [
        *many_short[:10],
        _Item("k1", "test_kraft_fault_matrix"),
        _Item("l1", AIRFLOW_GROUP),
        _Item("f1", "test_fault_matrix"),
        *many_short[10:],
        _Item("l2", AIRFLOW_GROUP),
        _Item("f2", "test_fault_matrix"),
    ]
    assert 30 * GROUP_SECONDS_PER_TEST < 15
    ordered = [i.name for i in ordered_by_group_seconds(items)]  # type: ignore[arg-type]
    assert ordered == ["l1", "l2", "f1", "f2", "k1", *(f"u{i}" for i in range(30))]


def test_every_group_timed_is_a_group_of_the_suite() -> None:
    from conftest import AIRFLOW_GROUP, AIRFLOW_MODULES, GROUP_SECONDS

    stale = [g for g in GROUP_SECONDS if g != AIRFLOW_GROUP and not (REPO / "tests" / f"{g}.py").is_file()]
    assert stale == [], f"GROUP_SECONDS names groups the suite no longer has: {stale}"
    assert not set(GROUP_SECONDS) & AIRFLOW_MODULES  # those modules run as the one live Airflow group


def test_xdist_hands_out_the_groups_in_the_suites_order(pytestconfig: pytest.Config) -> None:
    assert getattr(pytestconfig.option, "loadscopereorder", False) is False
