"""Detection on lab brokers after a kill -9: the versions' real consequences, not just the files' shapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_doctor.cli.scan import scan
from fleet_lab import fleet
from fleet_lab.incidents import inject, run_scenario

pytestmark = pytest.mark.timeout(600)


def test_kill9_untrimmed_active_indexes_are_rebuilt_at_start_so_warning(tmp_path: Path) -> None:
    d = tmp_path / "lab"
    state = fleet.up(d, brokers=1, kafka_version="3.6.2")
    try:
        done = inject(state, "kill9-untrimmed-index", broker=1)
        b = state.broker(1)
        res = scan(b.log_dirs, kafka_version="3.6.2", broker_id=1, zookeeper=state.zookeeper)
    finally:
        fleet.down(d)
    untrimmed = [f for f in res.findings if f["rule"] == "index-untrimmed"]
    assert {f["path"] for f in untrimmed} == set(done.paths)  # exactly the preallocated active indexes
    assert all(f["severity"] == "warning" and "rebuilds it" in f["message"] for f in untrimmed)
    # the zero tail's other symptoms are not reported twice for segments recovery rebuilds
    assert not [f for f in res.findings if f["rule"] in ("timeindex-last-timestamp", "index-last-offset")]
    assert [f["rule"] for f in res.findings if f["rule"] == "unclean-shutdown"] == ["unclean-shutdown"]


def test_seed_000_untrimmed_index_behind_a_clean_marker_is_critical_on_08(tmp_path: Path) -> None:
    d = tmp_path / "lab"
    state = fleet.up(d, brokers=2, kafka_version="0.8.2.2")
    try:
        steps = run_scenario(state, "seed-000", broker=1)
        assert all(s.ok for s in steps)
        fatal_path = steps[-1].details["kafka_error"].split("index file (")[1].split(")")[0]
        res = scan(state.broker(1).log_dirs, kafka_version="0.8.2.2", broker_id=1)
    finally:
        fleet.down(d)
    hits = [f for f in res.findings if f["path"] == fatal_path]
    assert {f["rule"] for f in hits} >= {"index-untrimmed", "index-last-offset"}
    assert all(f["severity"] == "critical" for f in hits)
