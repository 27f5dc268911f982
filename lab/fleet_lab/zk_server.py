"""A private ZooKeeper server (Debian's ``zookeeper`` 3.8 package) run as a child process.

For the tests and the fleet lab: standalone, bound to 127.0.0.1 on a free port, with its own data dir,
config and log4j log; no admin server (it would take port 8080) and only the ``ruok``/``srvr`` four-letter
words. ``start()`` returns once the server answers ``ruok`` and ``srvr`` says it is serving; ``stop()``
ends that one PID (SIGTERM, then SIGKILL) and reaps it. ``restart()`` makes ZooKeeper write a fresh
``version-2/snapshot.<zxid>`` of its whole database (it snapshots the loaded database at every start:
ZooKeeperServer.loadData), which is how tests get a snapshot file to compare with a live read.

    with ZooKeeperServer(tmp_path / "zk") as zk:
        KazooClient(hosts=zk.connect) ...

ACLs are always enforced (ZooKeeper's digest provider is built in: a client authenticates with
``add_auth("digest", "user:password")`` and a znode with a digest ACL refuses everyone else). ``digest_auth``
names the provider in the config, ``super_user`` sets ZooKeeper's superDigest (that identity passes every ACL:
the lab's administrator), ``enforce_auth`` refuses every client that has not authenticated with digest
(``enforce.auth.enabled``, ZooKeeper 3.7+).
"""

from __future__ import annotations

import atexit
import base64
import hashlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType

from fleet_doctor.zookeeper.snapshot import zxid_from_name

MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
# zookeeper.jar's manifest Class-Path names its other dependencies (jute, netty, ...); logging is ours to add.
_JAR_DIRS = ("/usr/share/java", "/usr/share/zookeeper", "/usr/share/zookeeper/lib")
_JARS = ("zookeeper.jar", "slf4j-log4j12.jar", "log4j-1.2.jar")
DIGEST_PROVIDER = "org.apache.zookeeper.server.auth.DigestAuthenticationProvider"
_LOG4J = """\
log4j.rootLogger=INFO, FILE
log4j.appender.FILE=org.apache.log4j.FileAppender
log4j.appender.FILE.File={log}
log4j.appender.FILE.Append=true
log4j.appender.FILE.layout=org.apache.log4j.PatternLayout
log4j.appender.FILE.layout.ConversionPattern=%d{{ISO8601}} %-5p [%t:%C{{1}}@%L] - %m%n
"""


class ZooKeeperServerError(RuntimeError):
    """The server could not be started (the message carries the tail of its log)."""


def find_classpath(conf_dir: Path) -> str:
    """``conf_dir`` (for log4j.properties) followed by the ZooKeeper and log4j jars found on disk."""
    found = [str(conf_dir)]
    for jar in _JARS:
        paths = [Path(d) / jar for d in _JAR_DIRS if (Path(d) / jar).is_file()]
        if not paths:
            raise ZooKeeperServerError(
                f"{jar} not found in {', '.join(_JAR_DIRS)}: install Debian's zookeeper package "
                "(apt-get install zookeeper)"
            )
        found.append(str(paths[0]))
    return ":".join(found)


_PORT_FLOOR = 10000  # below: well-known and registered services people run by hand


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now, chosen *outside* the kernel's ephemeral range.

    A port the kernel hands out with ``bind(0)`` comes from the ephemeral range, the same range every
    outgoing connection (ssh, kazoo, the probe's uploads) takes its local port from. A listener that is
    stopped and started again later (a lab broker restart) could then find its port taken by a client
    connection and fail with "Address already in use". Ports below the range are never used that way.
    """
    low, _ = _ephemeral_range()
    candidates = list(range(_PORT_FLOOR, low)) if low - _PORT_FLOOR >= 1000 else []
    # FLEET_LAB_PORT_SLICE=i/n: this process takes only ports p with p % n == i, so that n processes choosing ports
    # at once (the test suite's workers) never choose the same one, nor one another stopped for a while (a lab
    # restored from a snapshot comes back on its own ports)
    i, _, n = os.environ.get("FLEET_LAB_PORT_SLICE", "0/1").partition("/")
    if n.isdigit() and i.isdigit() and int(n) > 1:
        candidates = [p for p in candidates if p % int(n) == int(i)]
    random.SystemRandom().shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # odd range settings: let the kernel pick
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(n: int, host: str = "127.0.0.1", taken: Iterable[int] = ()) -> list[int]:
    """``n`` distinct ports nobody listens on now (``free_port``'s, outside the ephemeral range), none of ``taken``
    (ports already given to a server that is not listening yet, or not now: a stopped broker keeps its ports)."""
    ports: list[int] = []
    taken = set(taken)
    while len(ports) < n:
        port = free_port(host)
        if port not in ports and port not in taken:
            ports.append(port)
    return ports


def four_letter_word(host: str, port: int, word: str, timeout: float = 2.0) -> str:
    """Send a four-letter word (``ruok``, ``srvr``) and return the reply ('' if the connection fails)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(word.encode("ascii"))
            chunks = []
            while chunk := s.recv(4096):
                chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    except OSError:
        return ""


def proc_stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first, then ppid, ...; starttime is [19]), None
    when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return fields or None


def pid_alive(pid: int) -> bool:
    """True while a process with this PID exists (a zombie counts as gone)."""
    fields = proc_stat(pid)
    return fields is not None and fields[0] != "Z"


def started_at(pid: int) -> int | None:
    """When the process ``pid`` started (clock ticks since boot, its starttime), None when there is no such process
    (a zombie counts as gone): with the PID, it names one process (a PID alone may have been reused since)."""
    fields = proc_stat(pid)
    if fields is None or fields[0] == "Z" or len(fields) < 20:
        return None
    return int(fields[19])


def process_mentions(pid: int | None, needle: str) -> bool:
    """True while ``pid`` is alive and its command line contains ``needle`` (a PID file is never trusted
    alone: the PID may have been reused)."""
    if not pid or not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return needle.encode() in f.read()
    except OSError:
        return False


def digest_id(user: str, password: str) -> str:
    """The id a digest ACL names (``DigestAuthenticationProvider.generateDigest``): user:base64(sha1(user:password))."""
    return f"{user}:{base64.b64encode(hashlib.sha1(f'{user}:{password}'.encode()).digest()).decode()}"


class ZooKeeperServer:
    """One standalone ZooKeeper server; every file it writes stays under ``base_dir``."""

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        tick_time_ms: int = 2000,
        snap_count: int | None = None,
        force_sync: bool = False,
        extra_config: Mapping[str, str] | None = None,
        java: str | None = None,
        digest_auth: bool = False,
        super_user: tuple[str, str] | None = None,
        enforce_auth: bool = False,
    ) -> None:
        self.base_dir = Path(base_dir).resolve()
        self.host = host
        self.port = port
        self._auto_port = port is None
        self.tick_time_ms = tick_time_ms
        self.snap_count = snap_count
        self.force_sync = force_sync
        self.extra_config = dict(extra_config or {})
        self.digest_auth = digest_auth or enforce_auth or super_user is not None
        self.super_user = super_user
        self.enforce_auth = enforce_auth
        self.java = java or shutil.which("java") or "/usr/bin/java"
        self.conf_dir = self.base_dir / "conf"
        self.data_dir = self.base_dir / "data"
        self.log_file = self.base_dir / "zookeeper.log"
        self.stdout_file = self.base_dir / "zookeeper.out"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def connect(self) -> str:
        if self.port is None:
            raise ZooKeeperServerError("server not started")
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def snapshot_dir(self) -> Path:
        return self.data_dir / "version-2"

    @property
    def super_digest(self) -> str:
        """``user:base64(sha1(user:password))`` of ``super_user``: ZooKeeper's superDigest form."""
        if self.super_user is None:
            raise ZooKeeperServerError("no super_user configured")
        return digest_id(*self.super_user)

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _write_config(self) -> Path:
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cfg = {
            "tickTime": str(self.tick_time_ms),
            "dataDir": str(self.data_dir),
            "clientPort": str(self.port),
            "clientPortAddress": self.host,
            "admin.enableServer": "false",
            "4lw.commands.whitelist": "ruok,srvr",
            "maxClientCnxns": "100",
            "autopurge.purgeInterval": "0",
            "preAllocSize": "4096",  # KiB: no 64 MiB transaction logs in a test dir
            "forceSync": "yes" if self.force_sync else "no",
        }
        if self.snap_count is not None:
            cfg["snapCount"] = str(self.snap_count)
        if self.digest_auth:
            cfg["authProvider.1"] = DIGEST_PROVIDER
        if self.enforce_auth:
            cfg["enforce.auth.enabled"] = "true"
            cfg["enforce.auth.schemes"] = "digest"
        cfg.update(self.extra_config)
        path = self.conf_dir / "zoo.cfg"
        path.write_text("".join(f"{k}={v}\n" for k, v in cfg.items()), encoding="utf-8")
        (self.conf_dir / "log4j.properties").write_text(_LOG4J.format(log=self.log_file), encoding="utf-8")
        return path

    def _command(self, cfg: Path) -> list[str]:
        return [
            self.java,
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",  # faster JVM start; a test server needs no C2
            "-Dzookeeper.admin.enableServer=false",
            "-Dzookeeper.jmx.log4j.disable=true",
            f"-Dlog4j.configuration=file:{self.conf_dir / 'log4j.properties'}",
            *([f"-Dzookeeper.DigestAuthenticationProvider.superDigest={self.super_digest}"] if self.super_user else []),
            "-cp",
            find_classpath(self.conf_dir),
            MAIN_CLASS,
            str(cfg),
        ]

    def log_tail(self, lines: int = 30) -> str:
        out = []
        for f in (self.stdout_file, self.log_file):
            if f.is_file():
                out += f.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
        return "\n".join(out)

    def serving(self) -> bool:
        if self.port is None or four_letter_word(self.host, self.port, "ruok") != "imok":
            return False
        return "Mode:" in four_letter_word(self.host, self.port, "srvr")  # not serving: no Mode line

    def start(self, timeout: float = 30.0) -> ZooKeeperServer:
        if self.running():
            return self
        for attempt in range(3):
            if self._auto_port and (attempt or self.port is None):
                self.port = free_port(self.host)
            if self._launch(timeout):
                atexit.register(self._kill_at_exit)
                return self
            if not self._auto_port or "Address already in use" not in self.log_tail():
                break
        raise ZooKeeperServerError(f"ZooKeeper on {self.connect} did not start:\n{self.log_tail()}")

    def _launch(self, timeout: float) -> bool:
        cfg = self._write_config()
        with self.stdout_file.open("ab") as out:
            self._proc = subprocess.Popen(
                self._command(cfg),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.base_dir,
                start_new_session=True,  # a terminal's Ctrl-C goes to the test runner, which stops us by PID
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._proc = None
                return False
            if self.serving():
                return True
            time.sleep(0.05)
        self.stop()
        return False

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the server's PID, SIGKILL it after ``timeout`` seconds, and reap it."""
        proc, self._proc = self._proc, None
        atexit.unregister(self._kill_at_exit)
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def detach(self) -> int:
        """Leave the running server to outlive this process (the fleet lab stops it later by PID)."""
        if self._proc is None or self._proc.poll() is not None:
            raise ZooKeeperServerError("server not running")
        atexit.unregister(self._kill_at_exit)
        pid = self._proc.pid
        self._proc.returncode = 0  # never reaped here: Popen must not warn that it is still running
        self._proc = None
        return pid

    def restart(self, timeout: float = 30.0) -> Path:
        """Stop and start on the same port; returns the snapshot ZooKeeper wrote at startup."""
        self.stop()
        self._auto_port = False  # clients reconnect to the same address
        self.start(timeout)
        snap = self.latest_snapshot()
        if snap is None:
            raise ZooKeeperServerError(f"no snapshot in {self.snapshot_dir} after a restart")
        return snap

    def snapshot_files(self) -> list[Path]:
        """``snapshot.<zxid>`` files, oldest zxid first."""
        if not self.snapshot_dir.is_dir():
            return []
        snaps = [p for p in self.snapshot_dir.iterdir() if zxid_from_name(p.name) is not None]
        return sorted(snaps, key=lambda p: zxid_from_name(p.name) or 0)

    def latest_snapshot(self) -> Path | None:
        snaps = self.snapshot_files()
        return snaps[-1] if snaps else None

    def _kill_at_exit(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
