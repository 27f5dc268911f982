"""Fleet Doctor installed into an Airflow of one's own (docs/install.md): the wheel built from pyproject.toml
(``pip wheel``), installed by pip into a fresh venv whose dependencies are the pinned ones (constraints.txt) of the
test's own venv, a fresh DAG folder holding only the one documented line, a fleet of two clusters (ZooKeeper and
KRaft). Airflow's DagBag, run by the fresh venv, loads every cluster's DAGs from the installed package with no import
error; its api-server, with an empty plugins folder, registers the Kafka fleet view through the wheel's
``airflow.plugins`` entry point and serves ``/kafka-fleet/`` and ``/kafka-fleet/metrics``. Nothing of the repository's
sources is on the fresh venv's path.

The dependencies are not unpacked again: pip in a fresh venv spends ~35 s of CPU unpacking Airflow and Spark, the
same pinned versions bin/dev installed into the test's venv. The fresh venv reaches that venv's site-packages through
a ``.pth`` line after its own; pip finds every requirement of the wheel met there (``pip check`` agrees), so the wheel
is all it installs. The docker/ image installs the wheel with its dependencies from nothing (docker/Dockerfile)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import urllib.request
import zipfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from fleet_lab.airflow_stack import LiveAirflow
from harness import inventories

pytestmark = [pytest.mark.live, pytest.mark.slow, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parents[1]
ONE_LINE = "from fleet_doctor.dags import *  # noqa: F403  Kafka Fleet Doctor: every cluster's Airflow DAGs\n"
FLEET = (inventories.inventory("prod-eu", brokers=3), inventories.inventory("prod-kraft", brokers=3, kraft=True))


def run(args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 600) -> str:
    r = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{args}: {r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def build_wheel(out: Path, work: Path) -> Path:
    """``pip wheel`` of a copy of what pyproject.toml packs (a build leaves an egg-info beside its sources)."""
    work.mkdir(parents=True)
    for part in ("pyproject.toml", "plugins", "spark_apps"):
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, work / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        else:
            shutil.copy2(src, work / part)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(work)])
    (wheel,) = out.glob("kafka_fleet_doctor-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(root / "dist", root / "src")
    venv = root / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip())
    (site / "pinned_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # after site's own
    # --no-compile, as bin/dev installs: a module is byte-compiled when first imported
    out = run(
        [python, "-m", "pip", "install", "--no-compile", str(wheel), "-c", str(REPO / "constraints.txt")], timeout=900
    )
    done = [line for line in out.splitlines() if line.startswith("Successfully installed")]
    assert done and done[-1].split()[2:] == [f"kafka-fleet-doctor-{wheel.name.split('-')[1]}"], out
    run([python, "-m", "pip", "check"])  # every requirement of every package, the wheel's too, met
    # the console script pip writes for Airflow's entry point (Airflow itself was not installed here)
    (script,) = metadata.entry_points(group="console_scripts", name="airflow")
    module, func = script.value.split(":")
    airflow = venv / "bin" / "airflow"
    airflow.write_text(f"#!{python}\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n")
    airflow.chmod(0o755)
    dags, plugins, home = root / "dags", root / "plugins", root / "airflow"
    for d in (dags, plugins, home):
        d.mkdir()
    (dags / "kafka_fleet_doctor.py").write_text(ONE_LINE)
    fleet = inventories.fleet_dir(root / "fleet", *FLEET)
    env = {  # nothing of this process's environment: no PYTHONPATH into the repository
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(root),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "FLEET_DOCTOR_INVENTORY": str(fleet),
        "FLEET_DOCTOR_DATA": str(root / "data"),
    }
    yield {"root": root, "wheel": wheel, "venv": venv, "env": env, "dags": dags}


def test_the_wheel_holds_the_package_the_spark_app_and_the_plugin_entry_point(installed: dict[str, Any]) -> None:
    with zipfile.ZipFile(installed["wheel"]) as zf:
        names = set(zf.namelist())
        entry_points = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
        metadata = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    package = REPO / "plugins" / "fleet_doctor"
    modules = {f"fleet_doctor/{p.relative_to(package).as_posix()}" for p in package.rglob("*.py")}
    assert modules <= names, sorted(modules - names)  # every module (a package left out of pyproject.toml fails)
    assert "fleet_doctor/spark_apps/detect.py" in names
    assert not [n for n in names if n.startswith(("fleet_lab/", "harness/", "tests/", "dags/"))]
    assert "[airflow.plugins]\nkafka_fleet = fleet_doctor.console.plugin:KafkaFleetPlugin" in entry_points
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert any(r.startswith("apache-airflow<4,>=3.3.2") for r in requires), requires
    assert not [r for r in requires if r.startswith(("pytest", "playwright", "ruff", "hypothesis", "moto"))]


def test_a_dag_folder_of_one_line_loads_every_clusters_dags(installed: dict[str, Any]) -> None:
    code = (
        "import json, fleet_doctor\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        "bags = [DagBag(dag_folder=__import__('os').environ['AIRFLOW__CORE__DAGS_FOLDER']) for _ in range(2)]\n"
        "d = bags[0].dags['kafka_fleet_audit__prod-eu']\n"
        "print(json.dumps({'errors': bags[0].import_errors, 'dags': sorted(bags[0].dags),\n"
        "  'again': sorted(bags[1].dags), 'package': fleet_doctor.__file__, 'fileloc': d.fileloc,\n"
        "  'app': d.get_task('detect').application, 'tags': sorted(d.tags)}))\n"
    )
    out = json.loads(run([str(installed["venv"] / "bin" / "python"), "-c", code], installed["env"]).splitlines()[-1])
    assert out["errors"] == {}
    expected = sorted(
        f"kafka_fleet_{k}__{c['cluster']}" for k in ("audit", "repair", "restore", "purge", "roll") for c in FLEET
    )
    assert out["dags"] == out["again"] == expected  # parsed again in one process: the DAGs again
    assert out["package"].startswith(str(installed["venv"]))  # the installed package, not the repository's
    assert out["fileloc"] == str(installed["dags"] / "kafka_fleet_doctor.py")
    assert out["app"].startswith(str(installed["venv"])) and out["app"].endswith("fleet_doctor/spark_apps/detect.py")
    assert {"audit", "cluster:prod-eu", "zookeeper"} <= set(out["tags"])


def test_the_api_server_serves_the_kafka_fleet_view_from_the_entry_point(installed: dict[str, Any]) -> None:
    env = dict(installed["env"])
    airflow = str(installed["venv"] / "bin" / "airflow")
    run([airflow, "db", "migrate"], env, timeout=300)
    run([airflow, "dags", "reserialize"], env, timeout=300)  # the DAGs in the database, as a dag-processor puts them
    af = LiveAirflow(env, components=("api-server",), bin_dir=installed["venv"] / "bin")
    try:
        af.start()
        plugins = {p["name"]: p for p in af.api("GET", "/api/v2/plugins")["plugins"]}
        assert [a["url_prefix"] for a in plugins["kafka_fleet"]["fastapi_apps"]] == ["/kafka-fleet"]
        req = urllib.request.Request(f"{af.base}/kafka-fleet/", headers={"Authorization": f"Bearer {af.token()}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            page = r.read().decode()
        for c in FLEET:  # the overview: both clusters (the user may read their audit DAGs), none audited yet
            assert f"data-testid='cluster-row' data-cluster='{c['cluster']}' data-state='stale'" in page
        req = urllib.request.Request(
            f"{af.base}/kafka-fleet/metrics", headers={"Authorization": f"Bearer {af.token()}"}
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            metrics = r.read().decode()
        assert 'kafka_fleet_cluster_info{cluster="prod-kraft",metadata_mode="kraft"' in metrics
    finally:
        af.stop()
