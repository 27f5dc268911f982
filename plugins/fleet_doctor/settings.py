"""Fleet Doctor's settings: every ``FLEET_DOCTOR_*`` environment variable, read in one place.

A task resolves its ``Settings`` once (``Settings.from_env()``) and hands it down; the DAG files read it at parse
time only for what shapes the DAG (schedule, pool, Spark jars). Operator reference: docs/audit.md ("Settings").
The S3 settings of an ``s3a://`` data root (``AWS_*``, ``FLEET_DOCTOR_S3_ENDPOINT``) are read by ``fleet_doctor.store``
from the same environment (``Settings.environ``). A container deployment's set-up variables (``FLEET_DOCTOR_SSH_KEY``,
``FLEET_DOCTOR_SPARK_MASTER``, ``FLEET_DOCTOR_AIRFLOW_PASSWORDS``, ``FLEET_DOCTOR_HOSTNAME``) are not a task's settings:
``fleet_doctor.deploy`` reads them, once, when ``airflow-init`` prepares Airflow (docker/README.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from fleet_doctor import inventory, layout, spark_auth
from fleet_doctor.inventory import Inventory, InventoryError
from fleet_doctor.store import Store, s3_endpoint

REPO = Path(__file__).resolve().parents[2]
# the default data root: the checkout's .fleet-doctor/, or for an installed wheel $AIRFLOW_HOME/fleet-doctor
IN_CHECKOUT = (REPO / "plugins" / "fleet_doctor").is_dir()
DEFAULT_INVENTORY = "/etc/kafka-fleet-doctor/inventory.json"
SECRET_SETTING_WORDS = ("access.key", "secret", "session.token", "password")


class SettingsError(ValueError):
    """A FLEET_DOCTOR_* variable holds something unusable (the message names it)."""


def asset_uri(url: str) -> str:
    """An Airflow Asset URI for a store URL: ``file://`` for a local path, ``s3://`` for S3A (Airflow's S3 scheme)."""
    if "://" not in url:
        return f"file://{url}"
    return "s3://" + url.split("://", 1)[1] if url.startswith(("s3a://", "s3://")) else url


@dataclass(frozen=True)
class Settings:
    inventory: Path
    data_root: str | Path  # a local directory or a store URL (s3a://, s3://, hdfs://)
    schedule: str = "0 2 * * *"
    pool: str = "kafka_fleet_audit"
    pool_slots: int = 32  # one wave for a fleet of up to 32 brokers (bench/README.md: audit staging)
    # the window the clusters' nightly audits are spread over, in minutes from the schedule (fleet_doctor.fleet_dags)
    window_min: int = 120
    stage_slots: int = 0  # stage tasks of one cluster's audit at once (0: its fair share of the pool)
    deep: bool = True
    verify_crc: bool = False
    stage_retries: int = 2
    stage_retry_delay_s: float = 30.0
    ssh_timeout_s: float = 1800.0
    spark_jars: str = ""  # comma-separated, for spark-submit --jars (e.g. hadoop-aws for an s3a:// store)
    spark_conf: tuple[tuple[str, str], ...] = ()  # extra Spark settings
    # a standalone cluster's authentication secret (spark.authenticate), a file: never in a setting (spark_auth)
    spark_auth_file: str = ""
    repair_dir: Path | None = None  # the repair DAGs' plans and journals (a local directory)
    approvers: tuple[str, ...] = ()  # Airflow user ids allowed to approve a repair (empty: any user)
    allow_self_approval: bool = False  # with approvers set, may the user who triggered a run approve it?
    airflow_api_conn: str = "fleet_doctor_airflow_api"  # the connection the acting tasks read approvals through
    # the api-server the approvals are read from, set by the deployment (the UI cannot edit it, unlike a connection's
    # host); empty: the connection's host. https unless on loopback; approvals_ca: the CA file that signed it
    approvals_url: str = ""
    approvals_ca: str = ""
    notifiers: str = ""  # JSON list of {"class": ..., "kwargs": {...}} (see notifier_specs)
    report_base_url: str = ""  # where people open the reports (the alert links there)
    # Airflow's UI as people open it (the report's links into the Kafka fleet view); empty: Airflow's [api] base_url
    airflow_url: str = ""
    # where the store's settings (S3 endpoint, credentials) are read; None: this process's environment
    environ: Mapping[str, str] | None = field(default=None, repr=False, compare=False)
    # the cluster of the fleet these settings serve (its store, repairs and inventory); None: the data root itself
    # and the one inventory FLEET_DOCTOR_INVENTORY names (a local scan, a single-cluster tool)
    cluster: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings in ``environ`` (default: this process's environment); unset or empty means the default."""
        env = os.environ if environ is None else environ

        def flag(name: str, default: bool) -> bool:
            value = env.get(name)
            return default if value is None else value.strip().lower() in ("1", "true", "yes", "on")

        try:
            extra = json.loads(env.get("FLEET_DOCTOR_SPARK_CONF") or "{}")
            if not isinstance(extra, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            raise SettingsError(f"FLEET_DOCTOR_SPARK_CONF: expected a JSON object of Spark settings ({e})") from e
        secret = [k for k in extra if any(w in k.lower() for w in SECRET_SETTING_WORDS)]
        if secret:  # the settings end up in the serialized DAG, the task log and spark-submit's command line
            raise SettingsError(
                f"FLEET_DOCTOR_SPARK_CONF: no credentials here ({', '.join(secret)}): use the AWS_* variables"
            )
        endpoint = s3_endpoint(env)
        if endpoint and (endpoint.username or endpoint.password):  # it ends up in the detect task's Spark conf
            raise SettingsError(
                f"FLEET_DOCTOR_S3_ENDPOINT / AWS_ENDPOINT_URL: no credentials in the endpoint URL "
                f"({endpoint.scheme}://{endpoint.hostname}...): use the AWS_* variables"
            )
        airflow_home = Path(env.get("AIRFLOW_HOME") or Path.home() / "airflow")
        data = env.get("FLEET_DOCTOR_DATA") or str(
            REPO / ".fleet-doctor" if IN_CHECKOUT else airflow_home / "fleet-doctor"
        )
        approvers = (env.get("FLEET_DOCTOR_APPROVERS") or "").split(",")
        return cls(
            inventory=Path(env.get("FLEET_DOCTOR_INVENTORY") or DEFAULT_INVENTORY),
            data_root=data if "://" in data else Path(data),
            schedule=env.get("FLEET_DOCTOR_AUDIT_SCHEDULE") or cls.schedule,
            pool=env.get("FLEET_DOCTOR_AUDIT_POOL") or cls.pool,
            pool_slots=int(env.get("FLEET_DOCTOR_AUDIT_POOL_SLOTS") or cls.pool_slots),
            window_min=int(env.get("FLEET_DOCTOR_AUDIT_WINDOW") or cls.window_min),
            stage_slots=int(env.get("FLEET_DOCTOR_AUDIT_CLUSTER_SLOTS") or cls.stage_slots),
            deep=flag("FLEET_DOCTOR_DEEP", cls.deep),
            verify_crc=flag("FLEET_DOCTOR_VERIFY_CRC", cls.verify_crc),
            stage_retries=int(env.get("FLEET_DOCTOR_STAGE_RETRIES") or cls.stage_retries),
            stage_retry_delay_s=float(env.get("FLEET_DOCTOR_STAGE_RETRY_DELAY") or cls.stage_retry_delay_s),
            spark_jars=env.get("FLEET_DOCTOR_SPARK_JARS") or cls.spark_jars,
            spark_conf=tuple(sorted((str(k), str(v)) for k, v in extra.items())),
            spark_auth_file=env.get("FLEET_DOCTOR_SPARK_SECRET_FILE") or "",
            repair_dir=Path(env["FLEET_DOCTOR_REPAIR_DIR"]) if env.get("FLEET_DOCTOR_REPAIR_DIR") else None,
            approvers=tuple(u.strip() for u in approvers if u.strip()),
            allow_self_approval=flag("FLEET_DOCTOR_ALLOW_SELF_APPROVAL", cls.allow_self_approval),
            airflow_api_conn=env.get("FLEET_DOCTOR_AIRFLOW_API_CONN") or cls.airflow_api_conn,
            approvals_url=(env.get("FLEET_DOCTOR_APPROVALS_URL") or "").rstrip("/"),
            approvals_ca=env.get("FLEET_DOCTOR_APPROVALS_CA") or "",
            notifiers=env.get("FLEET_DOCTOR_NOTIFIERS") or "",
            report_base_url=env.get("FLEET_DOCTOR_REPORT_BASE_URL") or "",
            airflow_url=(env.get("FLEET_DOCTOR_AIRFLOW_URL") or "").rstrip("/"),
            environ=environ,
        )

    def for_cluster(self, cluster: str) -> Settings:
        """The same settings, serving one cluster of the fleet (what every task of a cluster's DAGs resolves)."""
        return replace(self, cluster=cluster)

    @cached_property
    def data_store(self) -> Store:
        """The data root itself (every cluster's store is in it: ``layout.cluster_store``)."""
        return Store(self.data_root, self.environ)

    @cached_property
    def store(self) -> Store:
        """The cluster's store (``clusters/<cluster>/``, or the root read in place: ``layout.cluster_store``); the
        data root when these settings serve no cluster."""
        if self.cluster is None:
            return self.data_store
        return layout.cluster_store(self.data_store, self.cluster)

    @property
    def findings_url(self) -> str:
        return self.store.url(layout.FINDINGS)

    def findings_asset_uri(self) -> str:
        """The URI of the cluster's findings Asset, made without reading the store (the DAG files make it when they
        are parsed): the cluster's findings in the data root's layout."""
        root = self.data_store
        key = layout.FINDINGS if self.cluster is None else f"{layout.cluster_root(self.cluster)}/{layout.FINDINGS}"
        return asset_uri(root.url(key))

    def load_inventory(self) -> Inventory:
        """The inventory of the cluster these settings serve, from FLEET_DOCTOR_INVENTORY (a file, or a directory
        of them). Without a cluster: the one cluster it holds. InventoryError, naming the file and the field, when
        the cluster's inventory is broken or missing."""
        fleet = inventory.load_fleet(self.inventory)
        if self.cluster is None:
            if len(fleet.clusters) == 1 and not fleet.problems:
                return next(iter(fleet.clusters.values()))
            if fleet.problems:
                raise InventoryError("; ".join(p.message for p in fleet.problems))
            raise InventoryError(f"{self.inventory}: {len(fleet.clusters)} clusters: name the one meant")
        if self.cluster in fleet.clusters:
            return fleet.clusters[self.cluster]
        why = "".join(f"; {p.message}" for p in fleet.problems)
        raise InventoryError(f"{self.inventory}: no usable inventory of cluster {self.cluster!r}{why}")

    def detect_conf(self, base: Mapping[str, str]) -> dict[str, str]:
        """Spark settings of the detection app: ``base``, the store's (S3A endpoint), then the configured extras, and
        ``spark.authenticate`` with a secret file (the secret itself goes in a properties file: ``spark_auth``)."""
        auth = spark_auth.AUTH_CONF if self.spark_auth_file else {}
        return {**base, **self.data_store.spark_conf(), **dict(self.spark_conf), **auth}

    def aws_environ(self) -> dict[str, str]:
        """The ``AWS_*`` variables of the environment these settings were read from (an s3a:// store's credentials,
        for spark-submit's environment: never on its command line)."""
        return {k: v for k, v in (self.environ or os.environ).items() if k.startswith("AWS_")}

    @property
    def repairs(self) -> Path:
        """The repair DAGs' plans, journals and backups of the cluster: a local directory the plan, execute and
        restore tasks all see. ``repairs/`` in the cluster's store for a local data root, else in
        FLEET_DOCTOR_REPAIR_DIR: ``clusters/<cluster>/`` in it, or the dir itself for the data root's own cluster
        (read in place, as its store) and for settings that serve no cluster."""
        in_place = self.cluster is None or self.store.root == self.data_store.root
        if self.repair_dir is not None:
            return self.repair_dir if in_place else self.repair_dir / layout.cluster_root(str(self.cluster))
        self._local_data_root()
        return Path(self.store.base) / "repairs"

    def _local_data_root(self) -> Path:
        """The data root's directory, where the repair DAGs keep their files when FLEET_DOCTOR_REPAIR_DIR is not set;
        SettingsError when the data root is remote."""
        if not self.data_store.is_local:
            raise SettingsError(
                f"the data root {self.data_store.root} is remote: set FLEET_DOCTOR_REPAIR_DIR to a directory that "
                "every task of the repair DAGs sees (a shared volume, or one worker's disk with the DAGs on one queue)"
            )
        return Path(self.data_store.base)

    @property
    def lock_dir(self) -> Path:
        """Where the repair lock of a cluster without ZooKeeper lives (``repair.dir_lock``): ``locks/`` in
        FLEET_DOCTOR_REPAIR_DIR, or in a local data root; one dir for the whole fleet, since the lock is keyed by
        the Kafka cluster's id (two inventories of one cluster take one lock)."""
        return (self.repair_dir or self._local_data_root()) / layout.LOCKS

    def notifier_specs(self) -> list[tuple[str, dict[str, Any]]]:
        """FLEET_DOCTOR_NOTIFIERS as (dotted class path, kwargs) pairs, parsed when an alert is sent (a broken value
        fails the alert task, not the DAG's parsing)."""
        if not self.notifiers:
            return []
        try:
            specs = json.loads(self.notifiers)
        except ValueError as e:
            raise SettingsError(f"FLEET_DOCTOR_NOTIFIERS: not JSON ({e})") from e
        if not isinstance(specs, list) or not all(isinstance(s, dict) and "class" in s for s in specs):
            raise SettingsError('FLEET_DOCTOR_NOTIFIERS must be a JSON list of {"class": ..., "kwargs": {...}}')
        return [(s["class"], dict(s.get("kwargs") or {})) for s in specs]
