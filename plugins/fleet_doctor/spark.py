"""Submitting the detection app (spark_apps/detect.py) to Spark: the command, its environment, the library it ships.

Two named profiles of Spark settings, picked by the master: ``local`` (``local``, ``local[N]``: the CLI's ``scan``,
the demo, the tests; the driver on 127.0.0.1) and ``cluster`` (``spark://``, ``yarn``, ``k8s://``: nothing pinned to
one host). The audit DAG's master comes from its ``spark_default`` connection, so a cluster submit needs no override.
The library (``fleet_doctor``) goes to the driver and the executors as a ``--py-files`` archive built from this
package.

On a small input (``scan`` of a few log dirs, the lab, a repair's verify: staged facts of a few MB) Spark's fixed
costs are the whole run, so the settings are also chosen from the staged input's size (``input_conf``): the C1 JIT
alone, expressions interpreted instead of compiled, no adaptive re-planning, one shuffle partition. A driver JVM on
this machine (the ``local`` profile) also maps a class-data sharing archive of Spark's classes (``class_archive``),
dumped by the first run. What each of these saves, measured: bench/README.md, "Detection in seconds".
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import itertools
import json
import logging
import os
import queue
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet_doctor import spark_auth
from fleet_doctor.store import Store, StoreError, atomic_file, temporary_name

PACKAGE = Path(__file__).resolve().parent
# the detection app: in a checkout spark_apps/detect.py, in an installed wheel its package data (pyproject.toml)
DETECT_APP = next(
    (p for p in (PACKAGE / "spark_apps" / "detect.py", PACKAGE.parents[1] / "spark_apps" / "detect.py") if p.is_file()),
    PACKAGE.parents[1] / "spark_apps" / "detect.py",
)
LOG = logging.getLogger(__name__)

PROFILES: dict[str, dict[str, str]] = {
    "local": {
        # one small machine: few shuffle partitions, no UI, loopback only
        "spark.sql.shuffle.partitions": "4",
        "spark.sql.adaptive.enabled": "true",
        "spark.ui.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.log.level": "WARN",
        # no per-call Python call-site capture (several JVM round trips per DataFrame/Column call)
        "spark.python.sql.dataFrameDebugging.enabled": "false",
    },
    "cluster": {
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.adaptive.coalescePartitions.enabled": "true",
        "spark.log.level": "WARN",
        "spark.python.sql.dataFrameDebugging.enabled": "false",
    },
}
# a driver JVM that lives seconds: the C1 compiler alone warms up much faster than tiered C2 (which pays off on big
# inputs: bench/README.md, detection benchmark)
JAVA_OPTIONS = "spark.driver.extraJavaOptions"
# The code cache is sized as tiered compilation sizes it (240 MB), not as C1 alone would (48 MB): a JVM that compiles
# many generated classes (a long test session, a bigger input with codegen on) fills 48 MB, and a full code cache
# stops the JIT and then fails tasks with "Out of space in CodeCache for adapters".
SHORT_RUN_CONF = {JAVA_OPTIONS: "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"}
LOCAL_SPARK_CONF = {**PROFILES["local"], **SHORT_RUN_CONF}  # a short local run's settings
# staged facts up to this size are a small input (the 16 corpus samples: 0.1-1.5 MB; the 3-broker lab: ~0.3 MB;
# 100 000 segments: ~3 MB)
SMALL_INPUT_BYTES = 16 << 20
# a small input's plan runs once over a few thousand rows: compiling it costs more than it saves (Janino per stage
# and expression), as do adaptive re-planning (a job per exchange) and partitions beyond one (the union of the rules
# runs a task per partition of every branch, each deserializing its part of the plan)
SMALL_INPUT_CONF = {
    **SHORT_RUN_CONF,
    "spark.sql.codegen.wholeStage": "false",
    # an internal setting of Spark's (for its tests): expressions interpreted; check it on a Spark upgrade
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.shuffle.partitions": "1",
    "spark.default.parallelism": "1",
}
CLASS_ARCHIVE_ENV = "FLEET_DOCTOR_SPARK_CLASS_ARCHIVE"  # "off": no class-data sharing archive


class SparkError(RuntimeError):
    """Spark cannot be run from this interpreter, or the detection app failed (the message says why)."""


def profile_for(master: str) -> str:
    """The profile of a Spark master URL: ``local`` for ``local``/``local[N]``/``local[*]``, else ``cluster``."""
    return "local" if master == "local" or master.startswith("local[") else "cluster"


def conf_for(master: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The master's profile, with ``extra`` (the store's and the configured settings) on top."""
    return {**PROFILES[profile_for(master)], **(extra or {})}


def _spark_home() -> str:
    spec = importlib.util.find_spec("pyspark")  # found, not imported: cheap enough for DAG parsing
    if spec is None or not spec.submodule_search_locations:
        raise SparkError("pyspark is not installed in this interpreter's environment")
    return next(iter(spec.submodule_search_locations))


# what a spark-submit inherits from the worker's environment: Spark's, Java's, Hadoop's and the store's settings, the
# product's own (not its notifiers: webhook URLs carry tokens) and the process basics. Never Airflow's (its JWT
# secret, Fernet key and database URL are in every Airflow container's environment) nor anything else unlisted
SPARK_ENV_PREFIXES = ("SPARK_", "PYSPARK_", "HADOOP_", "JAVA_", "AWS_", "FLEET_DOCTOR_", "LC_")
SPARK_ENV_NAMES = frozenset(
    {"PATH", "HOME", "LANG", "TZ", "TMPDIR", "USER", "LOGNAME", "PYTHONPATH", "VIRTUAL_ENV", "HOSTNAME"}
)
SPARK_ENV_WITHHELD = frozenset({"FLEET_DOCTOR_NOTIFIERS"})


def spark_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a spark-submit on this machine, from this interpreter's pyspark (the pip package ships Spark):
    its Spark, this Python for driver and executors, this venv's bin first, and a loopback driver address; of
    ``base`` (the process's environment) only the allow-listed variables (``SPARK_ENV_PREFIXES``,
    ``SPARK_ENV_NAMES``)."""
    given = os.environ if base is None else base
    env = {
        k: v
        for k, v in given.items()
        if (k in SPARK_ENV_NAMES or k.startswith(SPARK_ENV_PREFIXES)) and k not in SPARK_ENV_WITHHELD
    }
    env["SPARK_HOME"] = _spark_home()
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


_CACHE_DIR: Path | None = None
_TEMP_DIR: tempfile.TemporaryDirectory | None = None


def cache_dir() -> Path | None:
    """``$TMPDIR/fleet-doctor-spark-<uid>``, made private (0700). What it holds runs as code (the library archive, the
    class archive), so a directory someone else owns or could write to is not used: None (found once a process)."""
    global _CACHE_DIR
    directory = Path(tempfile.gettempdir()) / f"fleet-doctor-spark-{os.getuid()}"
    if _CACHE_DIR == directory:
        return directory
    if not private_dir(directory):
        return None
    _CACHE_DIR = directory
    return directory


def mine_and_closed(st: os.stat_result) -> bool:
    """Whether the file of ``st`` is this user's and no one else can write to it."""
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def private_dir(directory: Path, parents: bool = False) -> bool:
    """``directory`` made (0700) where it is not there, and made 0700 where it is this user's and only readable by
    others; False when it cannot be made or is not a directory of this user's that no one else can write to."""
    try:
        directory.mkdir(mode=0o700, parents=parents, exist_ok=True)
        st = directory.lstat()
        if not stat.S_ISDIR(st.st_mode) or not mine_and_closed(st):
            return False
        if st.st_mode & 0o777 != 0o700:
            directory.chmod(0o700)
    except OSError:
        return False
    return True


def _private_temp_dir() -> Path:
    """Where this process keeps what it cannot cache (``cache_dir()`` refused): removed when the process exits."""
    global _TEMP_DIR
    if _TEMP_DIR is None:
        _TEMP_DIR = tempfile.TemporaryDirectory(prefix="fleet-doctor-spark-")
    return Path(_TEMP_DIR.name)


def library_archive(cache: str | os.PathLike[str] | None = None) -> Path:
    """``fleet_doctor`` as a zip for ``--py-files``, named by its content (built once per version of the library,
    atomically; concurrent builders write the same bytes). Default cache: ``cache_dir()``, else a directory of this
    process's own."""
    sources = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
    digest = hashlib.sha256()
    for p in sources:
        digest.update(str(p.relative_to(PACKAGE)).encode() + b"\0" + p.read_bytes() + b"\0")
    directory = Path(cache) if cache else (cache_dir() or _private_temp_dir())
    archive = directory / f"fleet_doctor-{digest.hexdigest()[:16]}.zip"
    if archive.is_file():
        return archive
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_file(archive) as out, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sources:
            info = zipfile.ZipInfo(f"fleet_doctor/{p.relative_to(PACKAGE)}", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, p.read_bytes())
    return archive


# the detection app's inputs (--zk-snapshot: the older name of --cluster-metadata)
INPUT_FLAGS = ("--probe-dir", "--brokers", "--cluster-metadata", "--zk-snapshot", "--controllers")


def staged_bytes(path: str, environ: Mapping[str, str] | None = None) -> int | None:
    """The size of a staged input (a file, or the files under a directory or prefix, hidden names such as a writer's
    temporary objects left out: ``Store.size``): a local path, a ``file://`` URL or a data store's URL (``s3a://``,
    with the store's settings from ``environ``, default this process's). None where it cannot be told from here (a
    store that cannot be reached, a path that is not there or cannot be read)."""
    try:
        return Store(path, environ).size()
    except StoreError:
        return None


def input_conf(app_args: list[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings the detection app's input calls for (``app_args``: its arguments; every input it names counts,
    the probe's staged output and the cluster facts; ``environ``: a data store's settings, as ``staged_bytes``):
    ``SMALL_INPUT_CONF`` for a small one, nothing for a big one or one whose size is unknown (the nightly run of a
    big fleet wants the full JIT and compiled plans)."""
    paths = [value for flag, value in itertools.pairwise(app_args) if flag in INPUT_FLAGS]
    sizes = [staged_bytes(p, environ) for p in paths]
    if not paths or None in sizes:
        return {}
    return dict(SMALL_INPUT_CONF) if sum(s for s in sizes if s is not None) <= SMALL_INPUT_BYTES else {}


def _java() -> str | None:
    """The java spark-submit runs (``$JAVA_HOME/bin/java``, else the one on PATH), its real path."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(java) if java and os.path.isfile(java) else None


def _class_archive_key() -> str | None:
    """What a class-data sharing archive of the driver depends on: the JVM (its binary and ``release`` file) and
    Spark's class path (every jar's name, size and time). None when there is no java to ask."""
    java = _java()
    if java is None:
        return None
    digest = hashlib.sha256()
    st = os.stat(java)
    digest.update(f"{java}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    release = Path(java).parents[1] / "release"
    if release.is_file():
        digest.update(release.read_bytes())
    # what else spark-class puts on the driver's class path
    for name in ("SPARK_DIST_CLASSPATH", "HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_CONF_DIR"):
        digest.update(f"{name}={os.environ.get(name, '')}\0".encode())
    jars = Path(_spark_home()) / "jars"
    for jar in sorted(jars.iterdir()) if jars.is_dir() else ():
        js = jar.stat()
        digest.update(f"{jar.name}\0{js.st_size}\0{js.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class ClassArchive:
    """The driver JVM's class-data sharing archive for one run (``class_archive``): ``path`` is mapped, or, where
    ``dumping``, dumped there at the JVM's exit and moved to ``archive`` by ``finish`` when the run succeeded."""

    path: Path | None = None
    archive: Path | None = None
    dumping: bool = False

    def conf(self, conf: Mapping[str, str]) -> dict[str, str]:
        """``conf`` with the archive's options first in the driver's Java options (the configured ones after them
        win); unchanged where the configured options already say how to share classes (``-Xshare``, an archive)."""
        configured = conf.get(JAVA_OPTIONS, "")
        if self.path is None or any(o in configured for o in ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit")):
            return dict(conf)
        flag = "ArchiveClassesAtExit" if self.dumping else "SharedArchiveFile"
        options = f"-XX:{flag}={self.path} -Xlog:cds=off -Xlog:cds+dynamic=off"
        return {**conf, JAVA_OPTIONS: f"{options} {configured}".strip()}

    def finish(self, succeeded: bool) -> None:
        """After the run: a dumped archive goes into place, or away if the run failed. Archives of other keys unused
        for a day go too (another JVM or Spark under the same user may still use a recent one)."""
        if not self.dumping or self.path is None or self.archive is None:
            return
        if succeeded and self.path.is_file() and self.path.stat().st_size > 0:
            os.replace(self.path, self.archive)
            _remove_older(self.archive.parent.glob("spark-driver-*.jsa"), ARCHIVE_UNUSED_S, keep=self.archive)
        else:
            self.path.unlink(missing_ok=True)


ARCHIVE_UNUSED_S = 86400  # another key's archive not used for this long is removed
ABANDONED_DUMP_S = 3600  # a dump's temporary file this old was left by a run that was killed


def _remove_older(paths: Iterable[Path], age_s: float, keep: Path | None = None) -> None:
    """Remove the files among ``paths`` (but ``keep``) last used (accessed or modified) more than ``age_s`` ago."""
    now = time.time()
    for p in paths:
        try:
            st = p.stat()
            if p != keep and now - max(st.st_atime, st.st_mtime) > age_s:
                p.unlink()
        except OSError:
            pass


def class_archive(master: str) -> ClassArchive:
    """The class-data sharing archive for a driver JVM on this machine (the ``local`` profile): it maps
    ``spark-driver-<key>.jsa`` from ``cache_dir()`` (Spark's classes load in about half the time), or, where there is
    none yet, the run dumps one at exit under a temporary name. The JVM runs on without it when the archive does not
    fit (a JVM or Spark that changed since), and its ``cds`` log lines are off. None for a cluster master, where no
    java here to ask, no private cache directory, or with ``FLEET_DOCTOR_SPARK_CLASS_ARCHIVE=off``."""
    if profile_for(master) != "local" or os.environ.get(CLASS_ARCHIVE_ENV, "on") == "off":
        return ClassArchive()
    key, directory = _class_archive_key(), cache_dir()
    if key is None or directory is None:
        return ClassArchive()
    archive = directory / f"spark-driver-{key}.jsa"
    if archive.is_file():
        return ClassArchive(archive, archive)
    _remove_older(directory.glob(".spark-driver-*"), ABANDONED_DUMP_S)
    return ClassArchive(directory / temporary_name(archive.name), archive, dumping=True)


def detect_args(
    probe_dir: str,
    brokers: str,
    output: str,
    audit_run: str,
    summary: str,
    findings_json: str,
    cluster_metadata: str | None = None,
    partial_scope: bool = False,
    controllers: str | None = None,
    metadata_mode: str | None = None,
) -> list[str]:
    """The detection app's command-line arguments (spark_apps/detect.py --help). ``cluster_metadata``: the cluster facts
    (a ZooKeeper snapshot's records, or a KRaft metadata log's); ``controllers``: KRaft, the controllers' own
    metadata log headers and problems; ``metadata_mode``: the cluster's declared mode ("zookeeper" | "kraft"), so
    that a KRaft run whose controllers could not be read says so instead of looking like a ZooKeeper one."""
    if metadata_mode not in (None, "zookeeper", "kraft"):
        raise ValueError(f"metadata_mode must be 'zookeeper' or 'kraft', not {metadata_mode!r}")
    args = ["--probe-dir", probe_dir, "--brokers", brokers, "--output", output, "--audit-run", audit_run]
    args += ["--summary", summary, "--findings-json", findings_json]
    if cluster_metadata:
        args += ["--cluster-metadata", cluster_metadata]
    if controllers:
        args += ["--controllers", controllers]
    if metadata_mode:
        args += ["--metadata-mode", metadata_mode]
    if partial_scope:
        args.append("--partial-scope")
    return args


def submit_command(
    app: Path,
    master: str,
    conf: Mapping[str, str],
    app_args: list[str],
    jars: str = "",
    py_files: str = "",
    properties_file: str = "",
) -> list[str]:
    """The spark-submit command line of ``app`` (the library archive is built and shipped unless ``py_files``
    names it; ``properties_file``: settings kept off the command line, the authentication secret's)."""
    cmd = [os.path.join(_spark_home(), "bin", "spark-submit"), "--master", master]
    if properties_file:
        cmd += ["--properties-file", properties_file]
    if jars:
        cmd += ["--jars", jars]
    cmd += ["--py-files", py_files or str(library_archive())]
    for k, v in conf.items():
        cmd += ["--conf", f"{k}={v}"]
    return [*cmd, str(app), *app_args]


def auth_properties(secret_file: str) -> str:
    """The properties file that gives a driver Spark's authentication secret (``spark_auth``), in ``cache_dir()``;
    "" without a secret file. SparkError when the file is unfit or there is no private dir to write it in."""
    if not secret_file:
        return ""
    directory = cache_dir()
    if directory is None:
        raise SparkError(f"no private directory for Spark's authentication settings ({tempfile.gettempdir()})")
    try:
        return str(spark_auth.properties_file(secret_file, directory))
    except spark_auth.SparkAuthError as e:
        raise SparkError(str(e)) from e


def run_detect(
    master: str,
    conf: Mapping[str, str],
    args: list[str],
    jars: str = "",
    env: Mapping[str, str] | None = None,
    secret_file: str = "",
) -> None:
    """The detection app through spark-submit on this machine, with ``env`` on top of ``spark_env()`` and Spark's
    authentication secret from ``secret_file`` (a standalone cluster's: ``spark_auth``); SparkError with the end of
    its stderr when it fails. A local run is served instead by the machine's detection service when
    ``FLEET_DOCTOR_DETECT_SERVICE`` names one that runs its settings (``DetectService``), else, inside
    ``warm_drivers()``, by a warm driver of this process with the same settings (``WarmDriver``: the same app, one JVM
    for many runs)."""
    local = profile_for(master) == "local" and not secret_file
    service = os.environ.get(DETECT_SERVICE_ENV, "")
    if local and service and served(service, service_settings(master, conf, jars, env), args):
        return
    pool = _WARM_POOLS[-1] if _WARM_POOLS else None
    if pool is not None and local:
        pool.driver(master, conf, jars, env).detect(args)
        return
    archive = class_archive(master)
    properties = auth_properties(secret_file)
    cmd = submit_command(DETECT_APP, master, archive.conf(conf), args, jars=jars, properties_file=properties)
    proc = None
    try:
        proc = subprocess.run(cmd, env={**spark_env(), **(env or {})}, capture_output=True, text=True)
    finally:
        archive.finish(proc is not None and proc.returncode == 0)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-25:])
        raise SparkError(f"detection app failed (exit {proc.returncode}):\n{tail}")


# ---- warm drivers: one driver JVM for many small detections
WARM_CONNECT_S = 300.0  # a warm driver's start (the JVM, the session) until it connects
UNIX_PATH_MAX = 107  # sockaddr_un's sun_path, less its terminating NUL
WARM_STOP_S = 60.0  # a warm driver's own stop (its session, its class archive) before it is killed
WARM_GROUP_GONE_S = 10.0  # after the kill, how long its group's processes may take to be gone


def running_in_group(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` still running (from /proc; a zombie waiting for its reaper, which
    ``kill(-pgid, 0)`` still counts, is not running)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                    out.append(int(entry))
    return out


class WarmDriver:
    """The detection app started once (``detect.py --serve SOCKET``, a local master) and sent one detection after
    another: Spark's fixed costs (the driver JVM, the session: about three quarters of a small detection) are paid
    once. It connects to a Unix socket this process listens on in a private directory (spark-submit does not pass
    its stdin on to the app). A run's failure is the run's (SparkError, the driver serves on); a driver that died
    is started again by the next run. Its stderr (Spark's log) goes to a private file, the tail of which a failure
    quotes. It stops when its socket closes (``close``, or the process that started it dying)."""

    def __init__(self, master: str, conf: Mapping[str, str], jars: str = "", env: Mapping[str, str] | None = None):
        self.master, self.conf, self.jars, self.env = master, dict(conf), jars, dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.conn: socket.socket | None = None
        self.archive = ClassArchive()
        self.dir: Path | None = None
        self._reader: Any = None  # the connection's replies, line by line
        self.runs = 0
        self._lock = threading.Lock()

    @property
    def log(self) -> Path | None:
        return self.dir / "driver.log" if self.dir else None

    def _start(self) -> socket.socket:
        self._stop()
        self.dir = Path(tempfile.mkdtemp(prefix="warm-driver-", dir=cache_dir() or _private_temp_dir()))  # 0700
        if len(os.fsencode(self.dir / "socket")) > UNIX_PATH_MAX:  # a long TMPDIR: a private dir of /tmp's instead
            os.rmdir(self.dir)
            self.dir = Path(tempfile.mkdtemp(prefix="fleet-doctor-warm-", dir="/tmp"))
        channel = str(self.dir / "socket")
        self.archive = class_archive(self.master)
        cmd = submit_command(DETECT_APP, self.master, self.archive.conf(self.conf), ["--serve", channel], self.jars)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(channel)
            listener.listen(1)
            listener.settimeout(0.5)
            with open(self.dir / "driver.log", "wb") as err:
                self.proc = subprocess.Popen(
                    cmd,
                    env={**spark_env(), **self.env},
                    stdin=subprocess.DEVNULL,
                    stdout=err,
                    stderr=err,
                    start_new_session=True,  # its JVM and Python driver are one group, stopped together
                )
            deadline = time.monotonic() + WARM_CONNECT_S
            while True:
                try:
                    self.conn = listener.accept()[0]
                    break
                except TimeoutError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        tail, code = self._tail, self._stop()
                        raise SparkError(f"warm detection driver did not start (exit {code}):\n{tail}") from None
        self.conn.settimeout(None)
        self._reader = self.conn.makefile("r", encoding="utf-8")
        return self.conn

    @property
    def _tail(self) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").strip().splitlines()[-25:]) if self.log else ""
        except OSError:
            return ""

    def detect(self, args: list[str]) -> dict[str, Any]:
        """One detection (the app's arguments); its summary. SparkError when it fails."""
        with self._lock:
            alive = self.proc is not None and self.proc.poll() is None
            conn = self.conn if alive and self.conn is not None else self._start()
            try:
                conn.sendall((json.dumps({"args": list(args)}) + "\n").encode())
                line = self._reader.readline()
            except OSError as e:
                LOG.warning("warm detection driver: %s", e)
                line = ""
            if not line:
                tail = self._tail
                code = self._stop()
                raise SparkError(f"warm detection driver exited (exit {code}):\n{tail}")
            reply = json.loads(line)
            self.runs += 1
            if not reply.get("ok"):
                raise SparkError(f"detection app failed (warm driver):\n{reply.get('error', '')}")
            return dict(reply["summary"])

    def _stop(self) -> int | None:
        """Its socket closed: the driver stops its session and exits (killed, with its group, if it does not)."""
        conn, proc, self.conn, self.proc = self.conn, self.proc, None, None
        if conn is not None:
            with contextlib.suppress(OSError):
                if self._reader is not None:
                    self._reader.close()
                conn.close()
            self._reader = None
        code = None
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = proc.wait(timeout=WARM_STOP_S)
            with contextlib.suppress(ProcessLookupError):  # the driver if it did not stop, and whatever of its group
                os.killpg(proc.pid, signal.SIGKILL)  # outlived it (none is left running)
            if code is None:
                code = proc.wait()
            deadline = time.monotonic() + WARM_GROUP_GONE_S
            while running_in_group(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        self.archive.finish(code == 0)
        self.archive = ClassArchive()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        return code

    def close(self) -> None:
        with self._lock:
            self._stop()


class WarmPool:
    """The warm driver of one ``warm_drivers()`` block: one at a time (a driver JVM holds ~1 GB), for the settings
    (master, settings, jars, environment) of the last run; a run with other settings stops it and starts its own.
    Stopped at the block's end."""

    def __init__(self) -> None:
        self.key: str | None = None  # the settings of ``current``
        self.current: WarmDriver | None = None
        self._lock = threading.Lock()

    def driver(self, master: str, conf: Mapping[str, str], jars: str, env: Mapping[str, str] | None) -> WarmDriver:
        # the driver's environment as it would start (``spark_env()`` under ``env``): a run that names variables the
        # process's environment already gives it (a store's AWS_* settings read from it) is served by the same driver
        key = json.dumps([master, sorted(conf.items()), jars, sorted({**spark_env(), **(env or {})}.items())])
        with self._lock:
            if self.current is None or key != self.key:
                if self.current is not None:
                    self.current.close()
                self.key, self.current = key, WarmDriver(master, conf, jars, env)
            return self.current

    def close(self) -> None:
        with self._lock:
            current, self.key, self.current = self.current, None, None
        if current is not None:
            current.close()


_WARM_POOLS: list[WarmPool] = []


@contextlib.contextmanager
def warm_drivers() -> Iterator[WarmPool]:
    """Within the block, every local detection of this process (``run_detect``) is served by a warm driver: a
    repair's post-verifies, one after each broker's restart, pay the JVM's start once (``repair.tasks.execute``).
    Inside another such block, that block's drivers serve (and it stops them)."""
    if _WARM_POOLS:
        yield _WARM_POOLS[-1]
        return
    pool = WarmPool()
    _WARM_POOLS.append(pool)
    try:
        yield pool
    finally:
        _WARM_POOLS.remove(pool)
        pool.close()


# ---- the detection service: one warm driver on this machine for the small detections of many processes
DETECT_SERVICE_ENV = "FLEET_DOCTOR_DETECT_SERVICE"  # the socket of this machine's detection service, if it has one
# the driver's environment less what a detection does not depend on: the process basics, the paths that find its code
# (what it runs is compared on its own: the java, the Python, Spark, the app and the library), what a SparkContext in
# the calling process sets from its settings (every driver sets them again from its own) and the product's variables
# (the app reads none of them)
SERVICE_ENV_IGNORED = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "HOSTNAME", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV"}
    | {"SPARK_AUTH_SOCKET_TIMEOUT", "SPARK_BUFFER_SIZE"}
)
SERVICE_QUEUE = 8  # runs waiting for the driver; one more is refused (busy) and runs its own driver
SERVICE_CONNECT_S = 5.0  # a client's connect and request; the run itself may take as long as it takes
# the detection app's flags that name a path: the service resolves them in its own working directory
PATH_FLAGS = (*INPUT_FLAGS, "--output", "--summary", "--findings-json")


def service_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver environment a detection service compares with a run's: ``spark_env()`` under ``env``, less
    ``SERVICE_ENV_IGNORED`` and ``FLEET_DOCTOR_*``."""
    return {
        k: v
        for k, v in {**spark_env(), **(env or {})}.items()
        if k not in SERVICE_ENV_IGNORED and not k.startswith("FLEET_DOCTOR_")
    }


def service_settings(
    master: str, conf: Mapping[str, str], jars: str = "", env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """What a detection service must share with a run to serve it, each part as a digest (the environment carries
    the store's credentials): the master (a local one's profile: the findings do not depend on its number of
    threads, the service's own), the Spark settings, the jars, the driver's environment (``spark_env()`` under
    ``env``, with Spark and the Python it runs, less ``SERVICE_ENV_IGNORED`` and ``FLEET_DOCTOR_*``), the JVM and
    Spark's jars (``_class_archive_key``: a JDK or Spark upgraded in place is another), the detection app and the
    library it ships."""
    driver_env = service_environment(env)
    # one installation reached by other paths (a venv's python and python3, a symlinked venv): the same code
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        if driver_env.get(name):
            python = driver_env[name]
            driver_env[name] = f"{os.path.realpath(os.path.dirname(python))}:{os.path.realpath(python)}"
    for name in ("SPARK_HOME", "JAVA_HOME"):
        if driver_env.get(name):
            driver_env[name] = os.path.realpath(driver_env[name])
    parts: dict[str, Any] = {
        "master": "local" if profile_for(master) == "local" else master,
        "settings": sorted(conf.items()),
        "jars": jars,
        "environment": sorted(driver_env.items()),
        "java": [_java() or "", _class_archive_key() or ""],
        "app": hashlib.sha256(DETECT_APP.read_bytes()).hexdigest(),
        "library": library_archive().name,
    }
    return {name: hashlib.sha256(json.dumps(v).encode()).hexdigest() for name, v in parts.items()}


def unfit_service_socket(path: str) -> str | None:
    """Why the socket at ``path`` is not one to send detections to (not a socket; not this user's; in a directory
    others could write to, where someone else could have put it), else None."""
    try:
        st, parent = os.lstat(path), os.lstat(os.path.dirname(os.path.abspath(path)))
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if not stat.S_ISSOCK(st.st_mode):
        return "is not a socket"
    if st.st_uid != os.getuid() or parent.st_uid != os.getuid():
        return "is not this user's"
    if not mine_and_closed(parent):
        return "is in a directory others can write to"
    return None


def _peer_uid(conn: socket.socket) -> int:
    """The user id of the process at the other end of a Unix socket (SO_PEERCRED: pid, uid, gid)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def served(path: str, settings: Mapping[str, str], args: list[str]) -> bool:
    """One detection (the app's arguments ``args``, its ``service_settings``) sent to the detection service at the
    socket ``path``: True when the service ran it (SparkError when it failed there, or when the service went away
    once it had started it: never run twice at once); False when it cannot serve it (no such service, not this
    user's, other settings, busy, its driver died, a relative path in ``args``: said in the log), and the caller runs
    it itself."""
    relative = [v for f, v in itertools.pairwise(args) if f in PATH_FLAGS and "://" not in v and not os.path.isabs(v)]
    problem = f"is not asked: a relative path ({relative[0]})" if relative else unfit_service_socket(path)
    replies: list[dict[str, Any]] = []
    if problem is None:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(SERVICE_CONNECT_S)
                conn.connect(path)
                if _peer_uid(conn) != os.getuid():
                    raise OSError("not served by this user")
                conn.sendall((json.dumps({"settings": dict(settings), "args": list(args)}) + "\n").encode())
                conn.settimeout(None)  # queued, then run: as long as it takes
                with conn.makefile("r", encoding="utf-8") as lines:
                    for line in lines:
                        replies.append(json.loads(line))
                        if "accepted" not in replies[-1]:
                            break
        except (OSError, ValueError) as e:
            problem = f"cannot be reached ({getattr(e, 'strerror', None) or e})"
    accepted = any("accepted" in r for r in replies)
    reply = replies[-1] if replies and "accepted" not in replies[-1] else None
    if reply is None and accepted:
        raise SparkError(f"detection service {path} went away while it ran the detection ({problem or 'no answer'})")
    if reply is None:
        LOG.warning("detection service %s %s: this process runs the detection", path, problem or "did not answer")
        return False
    if "refused" in reply:
        LOG.info("detection service %s: %s; this process runs the detection", path, reply["refused"])
        return False
    if not reply.get("ok"):
        raise SparkError(f"detection app failed (detection service {path}):\n{reply.get('error', '')}")
    return True


class DetectService:
    """A warm driver (``WarmDriver``) serving the small local detections of every process of this user on this
    machine that names its socket in ``FLEET_DOCTOR_DETECT_SERVICE`` (an Airflow worker's audit and repair tasks, a
    scan): each pays a detection, not a driver JVM's start. It serves the runs whose ``service_settings`` are its
    own (``master``'s profile with the small-input settings, this environment) and refuses the others (a big
    input, other settings), which run their own spark-submit. One run at a time, first come first served, at most
    ``SERVICE_QUEUE`` waiting (one more is refused: busy). A run is answered "accepted" as it starts: a client that
    loses the service before that runs its own, one that loses it after fails (never two runs of one detection at
    once). A run whose driver died is refused (the caller runs its own; the next run starts another driver). The
    socket is made in a private directory; a client of another user is refused (SO_PEERCRED)."""

    def __init__(self, path: Path, master: str = "local[*]") -> None:
        if profile_for(master) != "local":
            raise SparkError(f"a detection service serves a local master, not {master}")
        self.path = Path(path)
        self.conf = {**conf_for(master), **SHORT_RUN_CONF, **SMALL_INPUT_CONF}
        self.settings = service_settings(master, self.conf)
        self.driver = WarmDriver(master, self.conf)
        self.served = self.refused = 0
        self._listener: socket.socket | None = None
        self._runs: queue.Queue[tuple[socket.socket, list[str]] | None] = queue.Queue(SERVICE_QUEUE)
        self._runner = threading.Thread(target=self._run_each, daemon=True)
        self._lock = threading.Lock()

    def listen(self) -> None:
        if not private_dir(self.path.parent, parents=True):
            raise SparkError(f"{self.path.parent}: not a private directory of this user's (mode 0700) for the service")
        # a socket there is this user's, in this user's private directory: a running service's, or a stopped one's
        if self.path.is_socket():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                if probe.connect_ex(str(self.path)) == 0:
                    raise SparkError(f"{self.path}: a detection service already serves there")
            self.path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        listener.listen(SERVICE_QUEUE * 2)
        self._listener = listener

    def serve_forever(self) -> None:
        """Each client as it comes (its own thread reads its request and queues it) until ``close``."""
        if self._listener is None:
            self.listen()
        listener = self._listener
        assert listener is not None
        self._runner.start()
        while True:
            try:
                conn = listener.accept()[0]
            except OSError:  # closed
                return
            threading.Thread(target=self._take, args=(conn,), daemon=True).start()

    def _count(self, reply: dict[str, Any]) -> None:
        with self._lock:
            if reply.get("ok"):
                self.served += 1
            elif "refused" in reply:
                self.refused += 1
        LOG.info("detection service: %s", "served" if reply.get("ok") else reply.get("refused") or "failed")

    @staticmethod
    def _say(conn: socket.socket, reply: dict[str, Any]) -> bool:
        try:
            conn.sendall((json.dumps(reply) + "\n").encode())
            return True
        except OSError:  # the client is gone
            return False

    def _take(self, conn: socket.socket) -> None:
        """A client's request: refused (another user, other settings, the queue full) or queued for the runner."""
        reply: dict[str, Any] | None = None
        try:
            conn.settimeout(SERVICE_CONNECT_S)
            with conn.makefile("r", encoding="utf-8") as requests:
                line = requests.readline()
            conn.settimeout(None)
            if not line:  # a connection that asks nothing (a check that the service is up)
                conn.close()
                return
            if _peer_uid(conn) != os.getuid():
                reply = {"refused": "another user's run"}
            else:
                request = json.loads(line)
                asked = request.get("settings") or {}
                differ = sorted(k for k in self.settings.keys() | asked.keys() if asked.get(k) != self.settings.get(k))
                if differ:
                    reply = {"refused": f"runs other settings ({', '.join(differ)} differ)"}
                else:
                    self._runs.put_nowait((conn, [str(a) for a in request["args"]]))
                    return
        except queue.Full:
            reply = {"refused": f"busy ({SERVICE_QUEUE} runs waiting)"}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # a garbled request, a client gone
            reply = {"ok": False, "error": f"bad request: {e}"[-6000:]}
        self._count(reply)
        self._say(conn, reply)
        conn.close()

    def _run_each(self) -> None:
        """The runner: one queued run after another, each told "accepted" as it starts (one whose client is gone is
        not run), until ``close`` queues None."""
        while (item := self._runs.get()) is not None:
            conn, args = item
            with conn:
                if not self._say(conn, {"accepted": True}):
                    continue
                try:
                    reply: dict[str, Any] = {"ok": True, "summary": self.driver.detect(args)}
                except SparkError as e:
                    # a driver stopped by the failure (its whole group killed): the run's fault or another's, unknown;
                    # its caller runs it again on its own
                    died = self.driver.proc is None
                    reply = {"refused": f"its driver died ({e})"[:6000]} if died else {"ok": False, "error": str(e)}
                self._count(reply)
                self._say(conn, reply)

    def close(self) -> None:
        """Stops taking runs, tells the waiting ones to run their own (they were not started), stops the driver."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
            listener.close()
            self.path.unlink(missing_ok=True)
        while True:
            try:
                item = self._runs.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].close()  # not accepted yet: its client runs its own
        if self._runner.is_alive():
            self._runs.put(None)
            self._runner.join(WARM_STOP_S + WARM_GROUP_GONE_S)
        self.driver.close()
