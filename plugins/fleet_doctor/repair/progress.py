"""What a repair is doing during its long waits, in the task's log: one line every few seconds, then a final line.

A wait (a broker's stop, its registration after the start, its partitions coming back in ISR, the pause between
brokers) polls in a loop and reports each poll's state to a ``Progress``; the line is written at the first report and
then at most every ``every`` seconds, with the time spent and the wait's timeout::

    broker 2: waiting for ISR, 4/6 partitions back, 1/3 healthy polls, 35 s of 900 s

and at the end one line that it is over (``done``), or, when the wait fails or times out, that it failed (the error
itself is raised by the caller, as before). A blocking call that cannot report (a fresh audit of the fleet, a Spark
run) runs under ``heartbeat``: a thread writes its line every ``every`` seconds until it returns.

The clock is an argument (``time.monotonic`` by default), and so is the sleep of ``pause``: tests drive them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType

LOG = logging.getLogger(__name__)

EVERY_S = 5.0  # at most one progress line per wait this often


def _seconds(s: float) -> str:
    return f"{max(s, 0.0):.0f} s"


class Progress:
    """One wait's progress lines. ``what`` says what is awaited ("broker 2: waiting for ISR"), ``timeout`` its limit
    (None: no limit is shown). Used as a context manager, it writes the final line when the block ends: ``done``
    unless already written, a warning that it failed when the block raised."""

    def __init__(
        self,
        what: str,
        timeout: float | None = None,
        every: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        log: logging.Logger = LOG,
    ) -> None:
        self.what = what
        self.timeout = timeout
        self.every = every
        self.clock = clock
        self.log = log
        self.started = clock()
        self.logged: float | None = None  # when the last progress line was written
        self.detail = ""  # the latest state reported
        self.finished = False

    def elapsed(self) -> float:
        return self.clock() - self.started

    def spent(self) -> str:
        """``35 s of 900 s`` (``35 s`` without a timeout)."""
        return _seconds(self.elapsed()) + (f" of {_seconds(self.timeout)}" if self.timeout is not None else "")

    def line(self, detail: str | None = None) -> str:
        """``<what>, <detail>, <elapsed> of <timeout>``."""
        detail = self.detail if detail is None else detail
        return ", ".join(x for x in (self.what, detail, self.spent()) if x)

    def update(self, detail: str = "") -> bool:
        """Report the wait's state now; written when it is the first report or ``every`` seconds have passed since
        the last line. Returns whether a line was written."""
        self.detail = detail
        now = self.clock()
        if self.logged is not None and now - self.logged < self.every:
            return False
        self.logged = now
        self.log.info("%s", self.line(detail))
        return True

    def done(self, detail: str = "") -> None:
        """The final line: ``<what>: done, <detail>, after <elapsed>``."""
        self.finished = True
        self.detail = detail or self.detail
        parts = (f"{self.what}: done", detail, f"after {_seconds(self.elapsed())}")
        self.log.info("%s", ", ".join(x for x in parts if x))

    def failed(self, why: str = "") -> None:
        """The final line of a wait that failed or timed out (the caller raises the error)."""
        self.finished = True
        last = f" (last: {self.detail})" if self.detail else ""
        self.log.warning("%s: failed after %s%s%s", self.what, self.spent(), last, f": {why}" if why else "")

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self.finished:
            return
        if e is None:
            self.done()
        else:
            self.failed(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)


def pause(
    what: str,
    seconds: float,
    every: float = EVERY_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    log: logging.Logger = LOG,
) -> None:
    """Sleep ``seconds`` in all (as one ``sleep(seconds)`` would), writing ``<what>, 20 s of 60 s`` on the way."""
    with Progress(what, seconds, every, clock, log) as p:
        end = p.started + seconds
        while (left := end - clock()) > 0:
            p.update()
            sleep(min(left, every) if every > 0 else left)


@contextmanager
def heartbeat(
    what: str, every: float = EVERY_S, clock: Callable[[], float] = time.monotonic, log: logging.Logger = LOG
) -> Iterator[Progress]:
    """Around a blocking call: ``<what>: started``, then ``<what>, running, 35 s`` every ``every`` seconds from a
    daemon thread while it runs, then ``<what>: done, after 72 s`` (or that it failed, when it raised). The block
    may set the yielded Progress's ``detail`` to say which stage it is in."""
    p = Progress(what, None, every, clock, log)
    stop = threading.Event()
    log.info("%s: started", what)

    def beat() -> None:
        while not stop.wait(every):
            log.info("%s", p.line(p.detail or "running"))

    thread = threading.Thread(target=beat, name=f"progress: {what[:40]}", daemon=True)
    if every > 0:
        thread.start()
    try:
        with p:
            yield p
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
