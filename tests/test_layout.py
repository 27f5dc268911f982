"""Architecture rules that run. The three houses stay apart: the product (plugins/fleet_doctor, dags/, spark_apps/)
imports nothing from the fleet lab (lab/fleet_lab) or the test harness (tests/harness), and the lab imports nothing
from the harness. Inside the product: no import circle between files, one-way package layers (audit never imports the
console or the repair; the console never imports the repair), the repair package's layers (DAG -> task modules ->
plan / approval text / executor / session -> errors), modules of a readable size, and every module named in
docs/architecture.md. Checked on the source (every import statement, at any depth), so a lazy import inside a
function counts too."""

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


def product_imports() -> dict[str, set[str]]:
    """Product module (``fleet_doctor.x.y``, or ``dags.<file>``, ``spark_apps.<file>``) -> the product modules it
    imports, at any depth (``from fleet_doctor.a import b`` counts as ``fleet_doctor.a.b`` when that is a module)."""
    files = {_module_name(p): p for root in PRODUCT for p in (REPO / root).rglob("*.py")}
    out: dict[str, set[str]] = {}
    for name, path in files.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fleet_doctor"):
                for a in node.names:
                    deps.add(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("fleet_doctor")}
        out[name] = {d for d in deps if d != name and d in files}
    return out


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO / "plugins") if path.is_relative_to(REPO / "plugins") else path.relative_to(REPO)
    parts = list(rel.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


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
    from harness import inventories

    fleet = inventories.fleet_dir(
        tmp_path / "fleet", inventories.inventory("prod"), inventories.inventory("k", kraft=True)
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "AIRFLOW_HOME": str(tmp_path),
        "PYTHONPATH": str(REPO / "plugins"),
        "FLEET_DOCTOR_INVENTORY": str(fleet),
    }
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


def test_no_import_circle_between_product_files() -> None:
    assert circles(product_imports()) == []


def test_the_circle_check_finds_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# package layers: a package never imports the packages on its right
ONE_WAY = {
    "fleet_doctor.audit": ("fleet_doctor.console", "fleet_doctor.repair"),
    "fleet_doctor.console": ("fleet_doctor.repair",),
    "fleet_doctor.detect": ("fleet_doctor.audit", "fleet_doctor.console", "fleet_doctor.repair"),
}
# the repair package in layers: a module imports repair modules of lower layers only (DAG -> task modules -> plan /
# approval text / executor / session -> errors)
REPAIR_LAYERS = (
    ("errors", "on_broker"),  # on_broker runs on a broker: it imports nothing of the product
    ("plan", "progress", "backups", "dir_lock", "quorum"),
    (
        "gates",
        "journal",
        "approval_text",
        "broker",
        "verify",
        "topic_ids",
        "kraft_refusals",
        "kraft_cluster",
        "roll_plan",
    ),
    ("approval", "params", "executor", "session", "planner"),
    ("hitl", "restore", "roll"),
    ("purge",),
    ("tasks", "restore_tasks", "purge_tasks", "roll_tasks"),  # a DAG's task modules: only the DAGs import them
)
TASK_MODULES = {f"fleet_doctor.repair.{m}" for m in REPAIR_LAYERS[-1]}
DAG_MODULES = ("dags.", "fleet_doctor.dags.")  # the DAG files, and the DAGs they make (the wheel's too)


def test_package_layers_are_one_way() -> None:
    graph = product_imports()
    found = [
        f"{m} imports {d}"
        for m, deps in graph.items()
        for pkg, never in ONE_WAY.items()
        if m == pkg or m.startswith(pkg + ".")
        for d in deps
        if any(d == n or d.startswith(n + ".") for n in never)
    ]
    assert found == []


def test_the_repair_package_is_layered() -> None:
    graph = product_imports()
    layer = {f"fleet_doctor.repair.{m}": i for i, ms in enumerate(REPAIR_LAYERS) for m in ms}
    package = {m for m in graph if m.startswith("fleet_doctor.repair.")}
    assert package == set(layer), f"repair modules not in REPAIR_LAYERS: {package ^ set(layer)}"
    upward = [
        f"{m} (layer {layer[m]}) imports {d} (layer {layer[d]})"
        for m in package
        for d in graph[m]
        if d in layer and layer[d] >= layer[m]
    ]
    assert upward == []
    by_others = sorted(
        f"{m} imports {d}" for m, deps in graph.items() for d in deps & TASK_MODULES if not m.startswith(DAG_MODULES)
    )
    assert by_others == [], "only a DAG imports a DAG's task module"


MAX_LINES = 1000
ONE_LONG_FILE = {  # shipped or read as one file; each says why in its docstring ("Why one long file")
    "plugins/fleet_doctor/probe.py",
    "plugins/fleet_doctor/cluster_metadata.py",
    "plugins/fleet_doctor/zookeeper/snapshot.py",
}


def test_product_modules_stay_readable() -> None:
    sizes = {
        str(p.relative_to(REPO)): len(p.read_text(encoding="utf-8").splitlines())
        for root in PRODUCT
        for p in (REPO / root).rglob("*.py")
    }
    assert {p: n for p, n in sizes.items() if n > MAX_LINES and p not in ONE_LONG_FILE} == {}
    assert sizes["plugins/fleet_doctor/repair/plan.py"] < 600
    for path in ONE_LONG_FILE:
        doc = ast.get_docstring(ast.parse((REPO / path).read_text(encoding="utf-8"))) or ""
        assert "Why one long file" in doc, f"{path}: say in its docstring why it is one long file"


def test_every_product_module_is_in_the_architecture_doc() -> None:
    """docs/architecture.md names every module of the product (in its picture or its table)."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = []
    for path in sorted((REPO / "plugins" / "fleet_doctor").rglob("*.py")):
        rel = path.relative_to(REPO / "plugins" / "fleet_doctor")
        if rel.name in ("__init__.py", "__main__.py"):
            continue
        name = rel.as_posix()
        if name not in text and (rel.parent.as_posix() == "." or f"`{rel.name}`" not in text):
            missing.append(name)
    assert missing == []
