"""Commands on a broker over SSH: the one runner every step uses (the audit's probe, the repair's stop / backup /
change / start, the restore, the topic-ID checks).

``Remote`` wraps a connected ``paramiko.SSHClient`` (``airflow_ssh_client``: the SSH provider's hook, host key pinned);
nothing else here imports Airflow or paramiko. Every command is logged with its exit status, to the task log and, when
a list is given, to that list (the repair's journal keeps it). Paths in commands are the caller's to quote
(``shlex.quote``): nothing here builds a command from data.
"""

from __future__ import annotations

import logging
import select
import shlex
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet_doctor.store import atomic_file

LOG = logging.getLogger(__name__)
STDERR_KEPT = 2000  # characters of a command's stderr kept in the log entry and in errors


class RemoteError(RuntimeError):
    """A remote command failed, timed out or could not be run (the message names the broker and the command)."""


@dataclass(frozen=True)
class Completed:
    exit_status: int
    stdout: str
    stderr: str


class Remote:
    """One broker's SSH connection; logs and errors name the broker."""

    def __init__(self, client: Any, broker_id: int, log: list[dict[str, Any]] | None = None) -> None:
        self.client = client
        self.broker_id = broker_id
        self.who = f"broker {broker_id}"
        self.log = log

    def _logged(self, command: str, status: int, stderr: str) -> None:
        LOG.info("%s: %s -> exit %s", self.who, command, status)
        if self.log is not None:
            entry = {"ts": time.time(), "broker_id": self.broker_id, "command": command, "exit_status": status}
            self.log.append({**entry, "stderr": stderr[-500:]})

    @contextmanager
    def _attempt(self, command: str) -> Iterator[None]:
        """Whatever goes wrong running ``command`` (a dropped session, a timeout, an SFTP error: paramiko's errors
        are not all OSErrors) is logged with exit status -1 and raised as RemoteError naming the broker."""
        try:
            yield
        except RemoteError:
            raise
        except Exception as e:
            self._logged(command, -1, f"{type(e).__name__}: {e}")
            raise RemoteError(f"{self.who}: `{command[:300]}` could not run: {type(e).__name__}: {e}") from e

    def run(self, command: str, timeout: float = 600.0, check: bool = True) -> Completed:
        """Run ``command``; RemoteError when it exits non-zero and ``check`` is set."""
        with self._attempt(command):
            _, stdout, stderr = self.client.exec_command(command, timeout=timeout)
            out = stdout.read().decode("utf-8", errors="surrogateescape")  # .encode(same) gives the bytes back
            err = stderr.read().decode(errors="replace")
            status = stdout.channel.recv_exit_status()
        self._logged(command, status, err)
        if check and status != 0:
            raise RemoteError(f"{self.who}: `{command}` exited {status}: {err.strip()[-300:]}")
        return Completed(status, out, err)

    def stream(
        self, command: str, stdin: bytes | Iterable[bytes], sink: Callable[[bytes], None], timeout: float
    ) -> Completed:
        """Run ``command`` with ``stdin`` (bytes, or chunks of them: a file read as it is sent) sent to it, handing
        its stdout to ``sink`` as it arrives (nothing of it is kept: ``Completed.stdout`` is empty). RemoteError when
        it does not finish within ``timeout`` seconds of the end of ``stdin`` (sending it has the channel's timeout per
        chunk: a large backup's upload is not counted against the command). A command that exits before reading all
        of ``stdin`` (it refused, or could not start) ends the sending: its exit status and stderr say why."""
        err = bytearray()
        with self._attempt(command):
            chan = self.client.get_transport().open_session(timeout=30)
            chan.settimeout(timeout)
            try:
                chan.exec_command(command)
                try:
                    for chunk in [stdin] if isinstance(stdin, bytes) else stdin:
                        chan.sendall(chunk)
                    chan.shutdown_write()
                except Exception:
                    if not (chan.exit_status_ready() or chan.closed):
                        raise
                deadline = time.monotonic() + timeout
                while True:
                    if time.monotonic() > deadline:
                        self._logged(command, -1, "timed out")
                        raise RemoteError(f"{self.who}: `{command[:200]}` did not finish within {timeout:.0f} s")
                    select.select([chan], [], [], 1.0)
                    progressed = False
                    while chan.recv_ready():
                        data = chan.recv(1 << 16)
                        if not data:
                            break
                        sink(data)
                        progressed = True
                    while chan.recv_stderr_ready():
                        err += chan.recv_stderr(1 << 16)
                        progressed = True
                    # done once the exit status and the end of the output are both in (the status may come first)
                    drained = not chan.recv_ready() and not chan.recv_stderr_ready()
                    if chan.exit_status_ready() and chan.eof_received and drained:
                        break
                    if not progressed and chan.closed:
                        break
                status = chan.recv_exit_status()
            finally:
                chan.close()
        stderr = err.decode(errors="replace")[-STDERR_KEPT:]
        self._logged(command, status, stderr)
        return Completed(status, "", stderr)

    def fetch(self, remote_path: str, local: Path) -> None:
        """Copy a file from the broker (SFTP) to ``local`` (mode 0600: backups hold broker data), which appears only
        when complete."""
        command = f"sftp get {remote_path}"
        with self._attempt(command):
            sftp = self.client.open_sftp()
            try:
                with atomic_file(local, mode=0o600) as out:
                    sftp.getfo(remote_path, out)
            finally:
                sftp.close()
        self._logged(command, 0, "")

    def close(self) -> None:
        self.client.close()


def as_user(user: str, command: str, *, shell: bool = False) -> str:
    """``command`` run as ``user`` through ``sudo -n -u`` (never a password prompt: it fails at once without a
    sudoers rule); ``shell``: ``command`` is shell syntax, run by ``sh -c``. As it is when ``user`` is empty (the SSH
    user acts itself). The one place a command is wrapped so: the inventory's ``kafka_user`` (docs/inventory.md)."""
    if not user:
        return command
    return f"sudo -n -u {user} -- " + (f"sh -c {shlex.quote(command)}" if shell else command)


def lowest_priority(command: str) -> str:
    """``command`` run at the lowest CPU and I/O priority the host offers: nice 19, and ionice's idle class where
    ionice exists (the probe and the metadata decoder on a broker or controller)."""
    return f"if command -v ionice >/dev/null 2>&1; then IO='ionice -c 3'; else IO=''; fi; exec nice -n 19 $IO {command}"


def airflow_ssh_client(conn_id: str, timeout: float = 10.0) -> Any:
    """A connected ``paramiko.SSHClient`` for the Airflow SSH connection ``conn_id`` (its extras pin the broker's host
    key: ``fleet_doctor.inventory.Inventory.airflow_connections``). The SSH provider is imported here only."""
    from airflow.providers.ssh.hooks.ssh import SSHHook

    return SSHHook(ssh_conn_id=conn_id, conn_timeout=timeout).get_conn()
