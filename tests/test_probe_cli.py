"""bin/fleet-doctor probe as outside checks use it, and the probe as it is shipped to brokers."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.corpus import REPO

PROBE = REPO / "plugins" / "fleet_doctor" / "probe.py"
CLI = REPO / "bin" / "fleet-doctor"
SAMPLE = "zk-3.1-single-aryan/kafka-logs"


def jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_cli_probe_required_fields_metadata_mode(corpus: Path) -> None:
    res = subprocess.run([str(CLI), "probe", str(corpus / SAMPLE)], capture_output=True, text=True, check=True)
    recs = jsonl(res.stdout)
    assert all("kind" in r for r in recs)
    kinds = {r["kind"] for r in recs}
    assert {"logdir", "partition", "segment", "file"} <= kinds
    for p in (r for r in recs if r["kind"] == "partition"):
        assert {"topic", "partition", "topic_id"} <= p.keys()
        assert isinstance(p["partition"], int)
    for s in (r for r in recs if r["kind"] == "segment"):
        for f in ("topic", "partition", "base_offset", "log_bytes", "index_bytes", "index_entries"):
            assert f in s, f
        assert "index_zero_tail_entries" in s


def test_cli_probe_deep_fields(corpus: Path) -> None:
    res = subprocess.run(
        [str(CLI), "probe", "--deep", str(corpus / SAMPLE)], capture_output=True, text=True, check=True
    )
    parts = [r for r in jsonl(res.stdout) if r["kind"] == "partition"]
    assert parts
    for p in parts:
        assert {"log_end_offset", "batch_count", "record_count"} <= p.keys()
    design0 = next(p for p in parts if p["dir"] == "design-0")
    assert (design0["log_end_offset"], design0["batch_count"], design0["record_count"]) == (436, 436, 436)


def test_probe_streams_over_stdin_like_ssh(corpus: Path) -> None:
    """The audit ships the probe as `ssh broker python3 - ARGS < probe.py`: same output as the CLI."""
    with PROBE.open("rb") as src:
        res = subprocess.run(
            ["python3", "-", "--deep", str(corpus / SAMPLE)], stdin=src, capture_output=True, check=True
        )
    via_stdin = [r for r in jsonl(res.stdout.decode()) if r["kind"] in ("partition", "segment")]
    cli = subprocess.run(
        [str(CLI), "probe", "--deep", str(corpus / SAMPLE)], capture_output=True, text=True, check=True
    )
    via_cli = [r for r in jsonl(cli.stdout) if r["kind"] in ("partition", "segment")]
    assert via_stdin == via_cli and len(via_cli) > 60


def test_probe_runs_with_isolated_interpreter(corpus: Path) -> None:
    """No site-packages, no PYTHONPATH: the probe needs nothing but the standard library."""
    res = subprocess.run(
        [sys.executable, "-I", "-S", str(PROBE), str(corpus / SAMPLE)], capture_output=True, text=True, check=True
    )
    assert jsonl(res.stdout)[-1]["kind"] == "probe_end"


def test_probe_imports_only_the_standard_library() -> None:
    tree = ast.parse(PROBE.read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import in the probe"
            modules.add(node.module.split(".")[0])
    assert modules and modules <= set(sys.stdlib_module_names), modules - set(sys.stdlib_module_names)


def test_probe_source_is_python36_compatible() -> None:
    vermin = shutil.which("vermin") or str(Path(sys.executable).parent / "vermin")
    res = subprocess.run(
        [vermin, "--no-tips", "--violations", "-t=3.6-", "--eval-annotations", str(PROBE)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize(
    "args",
    [["probe"], ["probe", "--bogus", "/tmp"]],
)
def test_cli_usage_errors_exit_2(args: list[str]) -> None:
    res = subprocess.run([str(CLI), *args], capture_output=True, text=True)
    assert res.returncode == 2
    assert "usage" in res.stderr.lower()


def test_cli_discover_table(corpus: Path) -> None:
    res = subprocess.run(
        [str(CLI), "probe", "--discover", "--format", "table", str(corpus / "zk-2.5-multinode-sagarrao")],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = res.stdout.splitlines()
    assert lines[0].split()[:2] == ["log", "dir"]
    assert sum(1 for ln in lines if "kafka-logs-" in ln) == 3


def test_discover_finds_nothing_exits_2(tmp_path: Path) -> None:
    res = subprocess.run([str(CLI), "probe", "--discover", str(tmp_path)], capture_output=True, text=True)
    assert res.returncode == 2 and "no Kafka log dir" in res.stderr
