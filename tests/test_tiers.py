"""The suite's split over workers (tests/conftest.py): ``bin/dev test`` runs two pytest-xdist workers with
``--dist loadgroup``, and every module is an ``xdist_group`` of its own, so that its module fixtures (a lab, a live
Airflow, a ``bin/dev ui`` stack) are made once, on one worker. pytest 9.2 stopped reading the node id pytest-xdist
3.8 rewrites to carry the group, and loadgroup then spread every module over both workers without a word: each
worker made every module fixture again, and both started a live Airflow. This checks the split itself, with the
suite's own conftest, pytest and xdist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

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
