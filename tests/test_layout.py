"""The three houses stay apart: the product (plugins/fleet_doctor, dags/, spark_apps/) imports nothing from the fleet
lab (lab/fleet_lab) or the test harness (tests/harness), and the lab imports nothing from the harness. Checked on
the source (every import statement, at any depth), so a lazy import inside a function counts too."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from harness.corpus import REPO

PRODUCT = ("plugins/fleet_doctor", "dags", "spark_apps")
LAB = ("lab/fleet_lab",)
TEST_MODULES = {p.stem for p in (REPO / "tests").glob("*.py")} | {"harness"}
FORBIDDEN = {"product": {"fleet_lab", *TEST_MODULES}, "lab": TEST_MODULES}


def imported_modules(source: str, filename: str) -> list[tuple[int, str]]:
    """(line, top-level module) of every import in ``source``."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.lineno, node.module.split(".")[0]))
    return out


def violations(roots: tuple[str, ...], forbidden: set[str]) -> list[str]:
    found = []
    for root in roots:
        for path in sorted((REPO / root).rglob("*.py")):
            for line, module in imported_modules(path.read_text(encoding="utf-8"), str(path)):
                if module in forbidden:
                    found.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    return found


@pytest.mark.parametrize("house,roots", [("product", PRODUCT), ("lab", LAB)])
def test_no_import_across_houses(house: str, roots: tuple[str, ...]) -> None:
    assert violations(roots, FORBIDDEN[house]) == []


def test_the_check_sees_lazy_imports() -> None:
    source = "import os\n\ndef f():\n    from fleet_lab.fleet import up\n    import harness.corpus\n"
    assert imported_modules(source, "x.py") == [(1, "os"), (4, "fleet_lab"), (5, "harness")]


def test_the_product_is_what_airflow_loads() -> None:
    """Airflow puts plugins/ on sys.path: the lab and the harness are not there, so nothing of theirs can ship."""
    assert sorted(p.name for p in (REPO / "plugins").iterdir() if not p.name.startswith("__")) == [
        ".airflowignore",
        "fleet_doctor",
        "kafka_fleet_plugin.py",  # the Airflow plugin (the Kafka fleet view): imports only fleet_doctor and Airflow
    ]


def test_every_module_in_the_architecture_picture_exists() -> None:
    """docs/architecture.md's picture names folders and modules only: each one is in the repository."""
    import re

    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    picture = text.split("```")[1]
    names = set(re.findall(r"[A-Za-z_][\w/]*(?:\.py|/)(?=[\s│),:]|$)", picture))
    roots = (REPO / "plugins" / "fleet_doctor", REPO, REPO / "plugins", REPO / "lab", REPO / "tests")
    missing = sorted(n for n in names if not any((root / n).exists() for root in roots))
    assert len(names) > 30 and missing == [], missing


def test_parsing_the_dags_imports_nothing_heavy(tmp_path: Path) -> None:
    """Airflow's dag-processor parses the DAG files again and again: they and the library modules they import load
    no Spark, Arrow, ZooKeeper or SSH client, and nothing of the lab or the harness."""
    import subprocess
    import sys

    code = (
        "import importlib.util, sys\n"
        "for f in ('kafka_fleet_audit', 'kafka_fleet_repair', 'kafka_fleet_restore'):\n"
        "    spec = importlib.util.spec_from_file_location(f, f'dags/{f}.py')\n"
        "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        "print(' '.join(sorted(m for m in sys.modules if '.' not in m)))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "AIRFLOW_HOME": str(tmp_path), "PYTHONPATH": str(REPO / "plugins")}
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    loaded = set(r.stdout.split())
    assert "fleet_doctor" in loaded and "airflow" in loaded
    assert not loaded & {"pyspark", "pyarrow", "kazoo", "paramiko", "fleet_lab", "harness"}


@pytest.mark.parametrize("script", sorted(p.stem for p in (REPO / "bench").glob("*.py")))
def test_bench_scripts_import(script: str) -> None:
    """The benchmarks run rarely: a module they use that moved or was renamed must fail here, not in the next bench."""
    import subprocess
    import sys

    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(str(REPO / d) for d in ("plugins", "lab", "tests"))}
    r = subprocess.run(
        [sys.executable, "-c", f"import {script}"], cwd=REPO / "bench", env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-2000:]
