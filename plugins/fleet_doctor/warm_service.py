"""The host's warm detection driver (``FLEET_DOCTOR_WARM_DRIVER_IDLE_S``): one ``spark.WarmDriver`` kept by a small
process of its own, which this machine's processes of the same user send their small local detections to
(``spark.shared_detect``: a CLI ``scan``, a repair's re-verify and post-verifies, each in a process of its own),
so that only the first pays the driver's start. One per user and settings (``spark.shared_driver_key``); it
serves one detection at a time, in the order they come, and exits once it has had none for the idle time (its
driver with it).

Run by ``spark.shared_detect`` as ``python -m fleet_doctor.warm_service``, its settings as JSON on stdin (the
environment they hold, e.g. the store's credentials, never on a command line or on disk). It listens on
``<dir>/socket`` in a private directory (0700: only its user can connect), writes its pid to ``<dir>/pid``, and
logs to ``<dir>/service.log``. Each connection is one request line (``{"args": [...]}``) and one reply line
(``{"ok": true, "summary": ...}`` or ``{"ok": false, "error": ...}``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from fleet_doctor.spark import SparkError, WarmDriver

LOG = logging.getLogger("fleet_doctor.warm_service")
ACCEPT_POLL_S = 0.5


class WarmService:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.socket_path = Path(spec["socket"])
        self.idle_s = float(spec["idle_s"])
        self.driver = WarmDriver(spec["master"], spec["conf"], spec.get("jars", ""), spec.get("env") or {})
        self.serving = threading.Lock()  # one detection at a time
        self.last = time.monotonic()
        self.stopping = threading.Event()

    def handle(self, conn: socket.socket) -> None:
        with conn:
            line = conn.makefile("r", encoding="utf-8").readline()
            if not line.strip():
                return
            with self.serving:
                started = time.monotonic()
                try:
                    reply: dict[str, Any] = {"ok": True, "summary": self.driver.detect(json.loads(line)["args"])}
                except (SparkError, ValueError, KeyError, TypeError) as e:
                    reply = {"ok": False, "error": str(e)}
                self.last = time.monotonic()
                LOG.info(
                    "detection %d: %s in %.1f s",
                    self.driver.runs,
                    "ok" if reply["ok"] else "failed",
                    self.last - started,
                )
            with contextlib.suppress(OSError):
                conn.sendall((json.dumps(reply) + "\n").encode())

    def idle(self) -> bool:
        return not self.serving.locked() and time.monotonic() - self.last > self.idle_s

    def run(self) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(str(self.socket_path))
            own = self.socket_path.stat().st_ino  # a successor's socket at the same path is left alone
            listener.listen(16)
            listener.settimeout(ACCEPT_POLL_S)
            (self.socket_path.parent / "pid").write_text(f"{os.getpid()}\n")
            LOG.info("warm detection driver service on %s, idle time %.0f s", self.socket_path, self.idle_s)
            try:
                while not self.stopping.is_set() and not self.idle():
                    try:
                        conn = listener.accept()[0]
                    except TimeoutError:
                        continue
                    conn.settimeout(None)
                    threading.Thread(target=self.handle, args=(conn,), daemon=True).start()
            finally:
                with contextlib.suppress(OSError):
                    if self.socket_path.stat().st_ino == own:
                        self.socket_path.unlink()
                with self.serving:  # a detection under way ends first
                    self.driver.close()
                LOG.info("warm detection driver service stopped")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    service = WarmService(json.loads(sys.stdin.read()))
    signal.signal(signal.SIGTERM, lambda *_: service.stopping.set())
    service.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
