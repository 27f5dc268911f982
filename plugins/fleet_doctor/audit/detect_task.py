"""The audit DAG's ``detect`` task: Airflow's ``SparkSubmitOperator`` submitting spark_apps/detect.py, with what only
the worker that runs it knows filled in when it runs:

- the Spark profile of the master its connection (``spark_default``) names (``fleet_doctor.spark``: ``local`` for
  ``local[N]``, ``cluster`` for ``spark://``, YARN or Kubernetes), under the configured settings;
- the settings the staged input's size calls for (``spark.input_conf``), and for a ``local`` master the driver's
  class-data sharing archive (``spark.class_archive``): a lab or a handful of brokers is detected in seconds;
- the library, shipped as a ``--py-files`` archive built from the worker's own copy;
- for a ``local`` master, the worker's detection service where it has one that runs these settings
  (``FLEET_DOCTOR_DETECT_SERVICE``: one warm driver for the worker's detections, no spark-submit), else
  spark-submit's environment: this interpreter's Spark and Python, a loopback driver. A
  cluster master gets none of it (the provider would hand it on to YARN's application master or refuse it in
  standalone cluster mode, and a loopback driver address is unreachable from executors elsewhere). The store's
  ``AWS_*`` credentials are never set here: spark-submit inherits them from the worker's environment (never in the
  DAG, whose arguments Airflow stores and shows).

This module imports Airflow: only the DAG file imports it.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from fleet_doctor import spark


class DetectOperator(SparkSubmitOperator):
    def __init__(self, *, secret_file: str = "", **kwargs: Any) -> None:
        kwargs.setdefault("application", str(spark.DETECT_APP))
        kwargs.setdefault("name", "fleet-doctor-detect")
        super().__init__(**kwargs)
        self.secret_file = secret_file  # a standalone cluster's authentication secret, read on the worker
        self._spark_connection: dict[str, Any] | None = None

    def connection(self) -> dict[str, Any]:
        """The connection (``spark_default``) resolved as the Spark provider resolves it (once a task)."""
        if self._spark_connection is None:
            self._spark_connection = dict(SparkSubmitHook(conn_id=self._conn_id)._connection)
        return self._spark_connection

    def master(self) -> str:
        """The master the connection names."""
        return str(self.connection()["master"])

    def submits_more(self) -> list[str]:
        """What this task's spark-submit would be given beyond the service's (the DAG's or the connection's own
        files, packages, resources, identity, binary, deploy mode): such a run is not sent to the service."""
        given = {
            name: getattr(self, attr, None)
            for name, attr in (
                ("files", "files"),
                ("archives", "_archives"),
                ("driver class path", "driver_class_path"),
                ("java class", "_java_class"),
                ("packages", "packages"),
                ("excluded packages", "exclude_packages"),
                ("repositories", "_repositories"),
                ("executor cores", "_executor_cores"),
                ("total executor cores", "_total_executor_cores"),
                ("executor memory", "_executor_memory"),
                ("driver memory", "_driver_memory"),
                ("executors", "_num_executors"),
                ("keytab", "keytab"),
                ("principal", "principal"),
                ("proxy user", "proxy_user"),
                ("properties file", "properties_file"),
            )
        }
        more = [name for name, value in given.items() if value]
        if self.py_files != str(spark.library_archive()):
            more.append("py files")
        conn = self.connection()
        if conn.get("spark_binary") not in (None, "spark-submit") or conn.get("deploy_mode") == "cluster":
            more.append("the connection's binary or deploy mode")
        if conn.get("keytab") or conn.get("principal"):
            more.append("the connection's identity")
        return more

    def prepare(self) -> str:
        """Fill in the profile, the settings the staged input's size calls for (``spark.input_conf``: a small input's
        for a lab or a few brokers, none for a big fleet), the library archive and (local master only) the
        environment; returns the master. The configured settings stay on top."""
        master = self.master()
        sized = spark.input_conf(list(self.application_args or []))
        self.conf = {**spark.conf_for(master, sized), **(self.conf or {})}
        self.py_files = self.py_files or str(spark.library_archive())
        if self.secret_file:  # written here, on the worker: the secret is neither in the DAG nor on a command line
            self.properties_file = spark.auth_properties(self.secret_file)
        if spark.profile_for(master) == "local":
            local = {k: v for k, v in spark.spark_env().items() if k.startswith(("SPARK", "PYSPARK", "PATH"))}
            self.env_vars = {**local, **(self.env_vars or {})}
        return master

    def served(self, master: str) -> bool:
        """Whether the worker's detection service (``FLEET_DOCTOR_DETECT_SERVICE``: ``spark.DetectService``) ran this
        detection: only a local master's, without an authentication secret, and where it runs these settings."""
        service = os.environ.get(spark.DETECT_SERVICE_ENV, "")
        if not service or spark.profile_for(master) != "local" or self.secret_file:
            return False
        more = self.submits_more()
        if more:
            self.log.info("not sent to the detection service %s: its spark-submit gets %s", service, ", ".join(more))
            return False
        settings = spark.service_settings(master, self.conf, self.jars or "", self.env_vars)
        if not spark.served(service, settings, list(self.application_args or [])):
            return False
        self.log.info("Spark master %s: detected by the detection service %s, settings %s", master, service, self.conf)
        return True

    def execute(self, context: Any) -> None:
        master = self.prepare()
        if self.served(master):
            return
        archive = spark.class_archive(master)
        self.conf = archive.conf(self.conf)
        self.log.info("Spark master %s: profile %s, settings %s", master, spark.profile_for(master), self.conf)
        succeeded = False
        try:
            super().execute(context)
            succeeded = True
        finally:
            archive.finish(succeeded)
