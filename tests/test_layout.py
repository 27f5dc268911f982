"""The three houses stay apart: the product (plugins/fleet_doctor, dags/, spark_apps/) imports nothing from the fleet
lab (lab/fleet_lab) or the test harness (tests/harness), and the lab imports nothing from the harness. Checked on
the source (every import statement, at any depth), so a lazy import inside a function counts too."""

from __future__ import annotations

import ast

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
    ]
