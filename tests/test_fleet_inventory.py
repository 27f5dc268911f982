"""A fleet's inventories (``fleet_doctor.inventory.load_fleet``): ``FLEET_DOCTOR_INVENTORY`` naming one file or a
directory of them, one cluster per file. A broken file (not JSON, a missing field, unreadable, a dangling symlink)
or two files naming one cluster never hides the other clusters: each is a problem that names its file."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor import inventory
from fleet_doctor.inventory import InventoryError, load_fleet
from harness import inventories

CLUSTER_ID = "MkU3OEVBNTcwNTJENDM2Qg"  # Kafka's example cluster id (22 base64url characters)


def _inv(cluster: str, **extra: Any) -> dict[str, Any]:
    return inventories.inventory(cluster, **extra)


_write = inventories.write


def test_a_single_file_is_a_fleet_of_one(tmp_path: Path) -> None:
    f = _write(tmp_path / "prod-eu.json", _inv("prod-eu"))
    fleet = load_fleet(f)
    assert list(fleet.clusters) == ["prod-eu"] and fleet.sources == {"prod-eu": f} and fleet.problems == []
    assert fleet.clusters["prod-eu"] == inventory.load(f)


def test_a_directory_gives_one_cluster_per_file_whatever_the_file_is_called(tmp_path: Path) -> None:
    _write(tmp_path / "b.json", _inv("staging"))
    _write(tmp_path / "a file with spaces.json", _inv("prod-eu", metadata_mode="zookeeper"))
    _write(tmp_path / "prod-ü.json", _inv("prod-us"))
    _write(tmp_path / "README.md", "not an inventory")
    _write(tmp_path / ".prod-eu.json.swp", "an editor's swap file")
    _write(tmp_path / ".#b.json", "an editor's lock file")
    (tmp_path / "old").mkdir()
    _write(tmp_path / "old" / "retired.json", _inv("retired"))  # a subdirectory's files are not the fleet's
    fleet = load_fleet(tmp_path)
    assert list(fleet.clusters) == ["prod-eu", "prod-us", "staging"] and fleet.problems == []
    assert fleet.sources["prod-us"] == tmp_path / "prod-ü.json"


def test_broken_inventories_are_problems_naming_their_file_and_never_hide_the_others(tmp_path: Path) -> None:
    good = _write(tmp_path / "good.json", _inv("good"))
    not_json = _write(tmp_path / "not-json.json", "{ cluster: oops")
    missing = _inv("missing")
    del missing["brokers"][0]["host_key"]
    missing_field = _write(tmp_path / "missing-field.json", missing)
    wrong_type = _write(tmp_path / "array.json", [1, 2, 3])
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere.json")
    (tmp_path / "a-dir.json").mkdir()
    unreadable = _write(tmp_path / "unreadable.json", _inv("unreadable"))
    unreadable.chmod(0)
    fleet = load_fleet(tmp_path)
    root = os.geteuid() == 0  # root reads a file whatever its mode
    assert list(fleet.clusters) == ["good", *(["unreadable"] if root else [])] and fleet.sources["good"] == good
    by_file = {Path(p.path).name: p.message for p in fleet.problems}
    assert by_file[not_json.name].startswith(f"{not_json}: not JSON")
    assert by_file[missing_field.name] == f"{missing_field}: brokers[0]: missing field 'host_key'"
    assert by_file[wrong_type.name] == f"{wrong_type}: the inventory must be a JSON object"
    assert by_file["dangling.json"].startswith(f"{dangling}: cannot read inventory")
    assert by_file["a-dir.json"].startswith(f"{tmp_path / 'a-dir.json'}: cannot read inventory")
    if not root:
        assert by_file[unreadable.name].startswith(f"{unreadable}: cannot read inventory")


def test_two_files_naming_one_cluster_are_both_refused(tmp_path: Path) -> None:
    first = _write(tmp_path / "prod.json", _inv("prod"))
    second = _write(tmp_path / "prod-copy.json", _inv("prod"))
    _write(tmp_path / "staging.json", _inv("staging"))
    fleet = load_fleet(tmp_path)
    assert list(fleet.clusters) == ["staging"]
    messages = {p.path: p.message for p in fleet.problems}
    assert set(messages) == {str(first), str(second)}
    assert messages[str(first)] == (
        f"{first}: cluster 'prod' is also in {second}: which inventory is meant cannot be told, so none of them is "
        "used (remove or rename all but one)"
    )


def test_two_inventories_of_one_kafka_cluster_are_both_refused(tmp_path: Path) -> None:
    """Two names, one Kafka cluster (its cluster_id): two audits and two repair DAGs of one cluster."""
    a = _write(tmp_path / "a.json", _inv("eu-1", cluster_id=CLUSTER_ID))
    b = _write(tmp_path / "b.json", _inv("eu-one", cluster_id=CLUSTER_ID))
    _write(tmp_path / "c.json", _inv("us-1", cluster_id="AAAAAAAAAAAAAAAAAAAAAA"))
    fleet = load_fleet(tmp_path)
    assert list(fleet.clusters) == ["us-1"]
    assert [(p.path, p.message.split(":")[1].strip()) for p in fleet.problems] == [
        (str(a), f"cluster_id '{CLUSTER_ID}' is also in {b}"),
        (str(b), f"cluster_id '{CLUSTER_ID}' is also in {a}"),
    ]


def test_an_empty_directory_is_a_problem_and_a_missing_path_an_error(tmp_path: Path) -> None:
    fleet = load_fleet(tmp_path)
    assert fleet.clusters == {} and [p.message for p in fleet.problems] == [
        f"{tmp_path}: no inventory (*.json) in the directory"
    ]
    with pytest.raises(InventoryError, match="no such inventory file or directory"):
        load_fleet(tmp_path / "absent")


@pytest.mark.skipif(os.geteuid() == 0, reason="root lists a directory whatever its mode")
def test_an_unlistable_directory_is_an_error(tmp_path: Path) -> None:
    d = tmp_path / "fleet"
    d.mkdir()
    d.chmod(0o300)
    try:
        with pytest.raises(InventoryError, match="cannot list the inventory directory"):
            load_fleet(d)
    finally:
        d.chmod(0o700)


def test_a_symlinked_inventory_counts_as_its_file(tmp_path: Path) -> None:
    """Configuration management often links the files it manages into place."""
    real = _write(tmp_path / "managed-prod.conf", _inv("prod"))
    fleet_dir = tmp_path / "fleet"
    fleet_dir.mkdir()
    (fleet_dir / "prod.json").symlink_to(real)
    assert list(load_fleet(fleet_dir).clusters) == ["prod"]


# ---- bin/fleet-doctor inventory PATH
REPO = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REPO / "bin" / "fleet-doctor"), "inventory", *args], capture_output=True, text=True)


def test_the_inventory_command_lists_the_clusters_and_names_each_problem(tmp_path: Path) -> None:
    _write(tmp_path / "prod-eu.json", _inv("prod-eu"))
    kraft = _inv("kraft-1", metadata_mode="kraft", controllers=[{"id": 1}])
    del kraft["zookeeper"]
    _write(tmp_path / "kraft-1.json", kraft)
    broken = _write(tmp_path / "broken.json", "{")
    r = _cli(str(tmp_path), "--format", "json")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert out["clusters"] == [
        {
            "cluster": "kraft-1",
            "file": str(tmp_path / "kraft-1.json"),
            "metadata_mode": "kraft",
            "brokers": [1],
            "kafka_versions": ["3.9.0"],
            "controllers": [1],
        },
        {
            "cluster": "prod-eu",
            "file": str(tmp_path / "prod-eu.json"),
            "metadata_mode": "zookeeper",
            "brokers": [1],
            "kafka_versions": ["3.9.0"],
        },
    ]
    assert [p["file"] for p in out["problems"]] == [str(broken)]
    assert out["problems"][0]["problem"].startswith(f"{broken}: not JSON")
    text = _cli(str(tmp_path))
    assert text.returncode == 1
    assert text.stdout.splitlines()[-2:] == [
        f"not used: {out['problems'][0]['problem']}",
        "2 cluster(s), 1 file(s) with a problem",
    ]
    broken.unlink()
    assert _cli(str(tmp_path)).returncode == 0


def test_the_inventory_command_on_a_path_that_is_not_there_exits_2(tmp_path: Path) -> None:
    r = _cli(str(tmp_path / "absent"))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == f"fleet-doctor inventory: error: {tmp_path / 'absent'}: no such inventory file or directory\n"
