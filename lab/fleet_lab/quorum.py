"""The KRaft quorum stand-in: what a combined lab node (``process.roles=broker,controller``) does with the metadata
log while it runs, at every point where the product can see it (the files).

Every lab broker of a KRaft lab is a voter and runs one ``QuorumNode`` in a thread beside its broker role. The
nodes share one machine, so the Raft RPCs are stood in for by files of the lab (never by files in the log dirs,
which only ever hold what Kafka writes):

- liveness: a node holds an ``flock`` on ``<run dir>/kraft.lock`` while its process runs; the others test it
  (the kernel releases it when the process dies, however it dies);
- ``<run dir>/kraft-node.json`` is the node's view, rewritten when it changes: its incarnation, its broker state
  (``starting``, ``registering``, ``running``, ``shutting-down``: BrokerRegistration and BrokerHeartbeat), the
  leader and epoch it follows (BeginQuorumEpoch), its metadata log end (what a Fetch tells the leader) and the
  partitions it cannot serve (what the partition leaders' AlterPartition would report);
- elections: when no running node leads, the running voters elect if they are a majority: the candidate with the
  most up-to-date log (last epoch, then end offset; Raft's vote rule), the lowest node id among equals, bumps the
  epoch past every epoch it has seen, persists ``quorum-state`` and appends a LEADER_CHANGE control batch (under a
  lab-wide lock, so that two candidates never win the same epoch). A follower persists ``quorum-state`` when it
  learns of a new leader or epoch, as Kafka does on every durable transition, and never re-reads it;
- replication: a follower fetches by reading the leader's segments and appending the leader's batches byte for byte
  from its own log end; a log that diverged (an uncommitted tail of an old epoch) is truncated to the last batch it
  shares with the leader first; a follower behind the leader's log start takes the leader's newest snapshot
  (FetchSnapshot) and truncates fully;
- the active controller (``fleet_lab.kraft.Controller``): registers each broker incarnation (fenced, broker epoch =
  the record's offset), unfences it once its metadata log holds its registration and its logs are loaded, moves
  leaders and ISRs off a broker in controlled shutdown or whose session expired (``broker.session.timeout.ms``
  after its process went without a controlled shutdown), adds a caught-up broker back to the ISRs, writes a
  NoOpRecord when it has written nothing for ``metadata.max.idle.interval.ms`` (3.3+, KIP-835), and writes a
  snapshot every ``metadata.log.max.record.bytes.between.snapshots``. Followers take the leader's snapshot files
  as FetchSnapshot would hand them over (a real node writes its own, with the same records).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fleet_doctor import cluster_metadata as cm
from fleet_doctor.probe import V2_CRC_START, crc32c
from fleet_lab.admin import controller_answers
from fleet_lab.kafka_files import KafkaFeatures, segment_bases, write_atomic
from fleet_lab.kraft import (
    METADATA_DIR,
    BatchHeader,
    BrokerInfo,
    Controller,
    MetadataLog,
    MetadataRecord,
    after_no_ops,
    control_batch,
    data_batch,
    encode_snapshot,
    leader_change,
    now_ms,
    read_batch,
    read_batch_refs,
    read_image,
    snapshot_file_name,
    snapshot_ids,
    write_quorum_state,
    write_snapshot,
)
from fleet_lab.zk_server import pid_alive

RAFT = logging.getLogger("org.apache.kafka.raft.KafkaRaftClient")
QUORUM = logging.getLogger("org.apache.kafka.raft.QuorumState")
CONTROLLER = logging.getLogger("org.apache.kafka.controller.QuorumController")
NODE_FILE = "kraft-node.json"
LOCK_NAME = "kraft.lock"
POLL_S = 0.05
# quorum.election.timeout.ms stand-in: with a voter not running, a candidate waits this long after it found no leader
# (so that the nodes of a lab started together elect the lowest id, and a restarting node gets to stand)
ELECTION_WAIT_S = 0.5
STATES = ("starting", "registering", "running", "shutting-down")


def lock_held(path: Path) -> bool:
    """Whether some process holds an flock on ``path`` (a shared lock taken and dropped at once; a node that takes
    its own lock meanwhile retries)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the shared lock if we got it
    return False


def read_node_file(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / NODE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def alive_view(run_dir: Path) -> dict[str, Any] | None:
    """A node's published view if its process runs (lock held, the file written by a live process)."""
    if not lock_held(run_dir / LOCK_NAME):
        return None
    view = read_node_file(run_dir)
    if view is None or not pid_alive(int(view.get("pid") or 0)):
        return None
    return view


class QuorumNode:
    """One node's raft and controller roles (see the module docstring). Thread-safe where the broker touches it:
    ``set_state``, ``set_offline``, ``leader``, ``caught_up``."""

    def __init__(self, kraft: dict[str, Any], features: KafkaFeatures, run_dir: Path, listener_port: int) -> None:
        self.k = kraft
        self.f = features
        self.node_id: int = kraft["node_id"]
        self.run_dir = run_dir
        self.port = listener_port
        self.voters: dict[int, dict[str, Any]] = {int(v["id"]): v for v in kraft["voters"]}
        self.mdir = Path(self.voters[self.node_id]["metadata_log_dir"]) / METADATA_DIR
        self.incarnation_id = cm.uuid_text(uuid.uuid4().bytes)
        self.log_dir_ids: list[str] = list(kraft["directory_ids"].values())
        self.session_timeout_s = kraft["session_timeout_ms"] / 1000.0
        self.snapshot_bytes = kraft["snapshot_bytes"]
        # KIP-835 (3.3+): the active controller writes a NoOpRecord when it has written nothing for
        # metadata.max.idle.interval.ms, so that every voter's log end keeps moving (what tells a voter that stopped
        # fetching from one that is caught up on an idle cluster)
        idle_ms = int(kraft.get("idle_interval_ms") or 0) if features.at_least("3.3") else 0
        self.idle_interval_s = idle_ms / 1000.0
        self.last_write = 0.0
        self.state = "starting"
        self.rack: str | None = None  # broker.rack, sent with the registration
        self.offline: list[list[Any]] = []
        self.leader_id = -1
        self.epoch = 0
        self.controller: Controller | None = None
        self.log: MetadataLog | None = None
        self.lock_fd: int | None = None
        self.dead_since: dict[int, float] = {}
        self.bytes_since_snapshot = 0
        self.no_leader_since: float | None = None
        self._fetched: tuple[Any, ...] | None = None  # what the leader's log looked like at the last fetch
        self._fetch_error: int | None = None  # the corrupt leader batch last reported
        self.snapshot_end = 0  # the end offset of the newest snapshot this node has taken (written or fetched)
        self.on_change: Callable[[], None] = lambda: None
        self._mutex = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._published: str | None = None

    # ---- lifecycle
    def take_liveness(self, timeout: float = 5.0) -> bool:
        """Hold this node's flock (a tester's momentary shared lock is waited out); False if another process of this
        node holds it."""
        fd = os.open(self.run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    return False
                time.sleep(0.01)
        self.lock_fd = fd
        self.publish(force=True)
        return True

    def open_log(self) -> None:
        """KafkaRaftManager: the metadata log loaded (recovered) and the persisted election state read."""
        self.log = MetadataLog(self.mdir, self.f, self.k["segment_bytes"], running=True).open()
        for line in self.log.recovery:
            RAFT.warning("[RaftManager id=%d] %s", self.node_id, line)
        try:
            qs = cm.read_quorum_state(str(self.mdir / "quorum-state"))
        except ValueError as e:
            RAFT.error("[RaftManager id=%d] %s", self.node_id, e)
            qs = None
        if qs is not None:
            self.epoch = qs["leader_epoch"]
        snaps = snapshot_ids(self.mdir)
        self.snapshot_end = max([end for end, _ in snaps] + [self.log.log_start_offset])
        if self.log.log_start_offset > 0 and not any(end >= self.log.log_start_offset for end, _ in snaps):
            RAFT.error(
                "[RaftManager id=%d] The log starts at offset %d but no snapshot covers the records before it",
                self.node_id,
                self.log.log_start_offset,
            )
        self.state = "registering"
        self.publish()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"kraft-{self.node_id}")
        self._thread.start()

    def stop(self) -> None:
        """The raft client stops (after the broker's controlled shutdown); the metadata log is closed cleanly."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._mutex:
            if self.log is not None:
                self.log.close()

    def release(self) -> None:
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None

    # ---- the broker's side
    def set_state(self, state: str) -> None:
        assert state in STATES, state
        with self._mutex:
            self.state = state
            self.publish()

    def set_offline(self, partitions: list[tuple[str, int]]) -> None:
        with self._mutex:
            self.offline = [[t, p] for t, p in sorted(partitions)]
            self.publish()

    def end_offset(self) -> int:
        with self._mutex:
            return self.log.next_offset if self.log else 0

    def log_end(self) -> tuple[int, BatchHeader | None]:
        """(the log end, the header of its last batch: None for an empty log or one that starts at a snapshot's end),
        as the log holds them now."""
        with self._mutex:
            return (self.log.next_offset, self.log.last) if self.log else (0, None)

    def passed_no_ops(self, last: BatchHeader) -> tuple[int, BatchHeader] | None:
        """(the log end, the header of its last batch) when this node's log still holds ``last`` where it was and
        nothing after it but the active controller's NoOpRecord batches (``fleet_lab.kraft.after_no_ops``): an image
        read up to ``last`` stands. Read under the node's mutex, so that no append or truncation moves the batches
        between the walk and the reads. None otherwise."""
        with self._mutex:
            if self.log is None:
                return None
            end = self.log.next_offset
            reached = after_no_ops(self.mdir, last, end)
            return None if reached is None else (end, reached)

    def caught_up(self) -> bool:
        """A leader is known and this node's log reaches the leader's end (or this node leads)."""
        with self._mutex:
            if self.controller is not None:
                return True
            if self.leader_id < 0 or self.log is None:
                return False
            view = alive_view(Path(self.voters[self.leader_id]["run_dir"]))
            return view is not None and self.log.next_offset >= int(view.get("end_offset") or 0)

    def committed(self, offset: int) -> bool:
        """Whether a majority of the voters' logs reach ``offset`` (the high watermark is past it)."""
        have = sum(
            1 for v in self.voters if (view := self._view(v)) is not None and int(view.get("end_offset") or 0) >= offset
        )
        return have * 2 > len(self.voters)

    def has_quorum(self) -> bool:
        alive = {self.node_id} | {v for v in self.voters if v != self.node_id and self._view(v) is not None}
        return len(alive) * 2 > len(self.voters)

    # ---- publishing
    def publish(self, force: bool = False) -> None:
        log = self.log
        view = {
            "node_id": self.node_id,
            "pid": os.getpid(),
            "incarnation_id": self.incarnation_id,
            "state": self.state,
            "port": self.port,
            "log_dirs": self.log_dir_ids,
            "leader_id": self.leader_id,
            "leader_epoch": self.epoch,
            "end_offset": log.next_offset if log else None,
            "last_epoch": log.last.epoch if log and log.last else -1,
            "offline": self.offline,
            "rack": self.rack,
        }
        text = json.dumps(view, sort_keys=True)
        if force or text != self._published:
            write_atomic(self.run_dir / NODE_FILE, text.encode())
            self._published = text

    def _view(self, node_id: int) -> dict[str, Any] | None:
        if node_id == self.node_id:
            return json.loads(self._published) if self._published else None
        view = alive_view(Path(self.voters[node_id]["run_dir"]))
        if view is not None and int(view.get("node_id", -1)) != node_id:
            return None
        return view

    # ---- the loop
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._mutex:
                    before = self.log.next_offset if self.log else 0
                    self._pass()
                    changed = self.log is not None and self.log.next_offset != before
                    self.publish()
                if changed:
                    self.on_change()
            except Exception:  # a lab defect: keep the traceback in server.log, keep going
                RAFT.exception("[RaftManager id=%d] quorum pass failed", self.node_id)
            self._stop.wait(POLL_S)

    def _pass(self) -> None:
        if self.controller is None and self.leader_id not in (-1, self.node_id):
            # a follower whose leader still leads at its epoch only fetches (one view read, not every voter's)
            view = self._view(self.leader_id)
            if view is not None and (view.get("leader_id"), view.get("leader_epoch")) == (self.leader_id, self.epoch):
                self._fetch(self.leader_id)
                return
        views = {v: self._view(v) for v in self.voters}
        alive = {v: view for v, view in views.items() if view is not None}
        leader = self._find_leader(alive)
        if self.controller is not None:
            if leader is not None and leader[0] != self.node_id and leader[1] > self.epoch:
                self._resign()
            elif max(int(v.get("leader_epoch", 0)) for v in alive.values()) > self.epoch:
                # a node has seen a higher epoch (it restarted with one): Raft moves every voter past it, so the
                # leader stands again, in an epoch above all
                with self._quorum_lock():
                    self._become_leader(max(int(v.get("leader_epoch", 0)) for v in alive.values()) + 1, sorted(alive))
                return
            else:
                self._lead(alive)
                return
        if leader is not None and leader[0] != self.node_id and leader[1] >= self.epoch:
            self.no_leader_since = None
            if (self.leader_id, self.epoch) != leader:
                self._follow(*leader)
            self._fetch(leader[0])
            return
        self._maybe_elect(alive)

    def _find_leader(self, alive: dict[int, dict[str, Any]]) -> tuple[int, int] | None:
        """The self-declared leader with the highest epoch among the running nodes."""
        leaders = [(int(v["leader_epoch"]), n) for n, v in alive.items() if int(v.get("leader_id", -1)) == n]
        if self.controller is not None:
            leaders.append((self.epoch, self.node_id))
        if not leaders:
            return None
        epoch, node = max(leaders)
        return node, epoch

    # ---- elections
    def _maybe_elect(self, alive: dict[int, dict[str, Any]]) -> None:
        if len(alive) * 2 <= len(self.voters) or self.log is None:
            return
        now = time.monotonic()
        if self.no_leader_since is None:
            self.no_leader_since = now
        if len(alive) < len(self.voters) and now - self.no_leader_since < ELECTION_WAIT_S:
            return
        # a node shutting down stands only if no other can; a node still loading its log stands by its id alone (its
        # log is taken as up to date until it tells), so that the nodes of a lab started together elect the lowest id
        candidates = [
            (
                v.get("state") == "shutting-down",
                -int(v.get("last_epoch", -1)) if v.get("end_offset") is not None else -(1 << 31),
                -int(v.get("end_offset") or 0) if v.get("end_offset") is not None else -(1 << 62),
                n,
            )
            for n, v in alive.items()
        ]
        if not candidates or min(candidates)[3] != self.node_id:
            return
        with self._quorum_lock():
            views = {v: self._view(v) for v in self.voters}
            alive = {v: view for v, view in views.items() if view is not None}
            found = self._find_leader(alive)
            if found is not None and found[1] >= self.epoch:
                return
            seen = [self.epoch, self.log.last.epoch if self.log.last else 0]
            seen += [int(v.get("leader_epoch", 0)) for v in alive.values()]
            self._become_leader(max(seen) + 1, sorted(alive))

    @contextlib.contextmanager
    def _quorum_lock(self) -> Iterator[None]:
        """The lab-wide election lock: one election at a time, so two candidates never win the same epoch."""
        fd = os.open(Path(self.k["quorum_lock"]), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _become_leader(self, epoch: int, granting: list[int]) -> None:
        assert self.log is not None
        _head, image = read_image(self.mdir)  # what a reader of this node's log sees: the product's decoder
        self.epoch, self.leader_id = epoch, self.node_id
        write_quorum_state(self.mdir, self.node_id, epoch, -1, self.voters)
        QUORUM.info(
            "[RaftManager id=%d] Completed transition to Leader(localId=%d, epoch=%d, epochStartOffset=%d)",
            self.node_id,
            self.node_id,
            epoch,
            self.log.next_offset,
        )
        self.controller = Controller(image)
        change = leader_change(self.node_id, self.voters, granting)
        self.log.append(control_batch(self.log.next_offset, epoch, "LEADER_CHANGE", change, now_ms()))
        self.dead_since = {}
        self.no_leader_since = None
        snaps = snapshot_ids(self.mdir)
        latest_end = snaps[-1][0] if snaps else 0
        self.bytes_since_snapshot = sum(r.header.size for r in self.log.batch_refs(latest_end))
        self.publish()
        CONTROLLER.info("[QuorumController id=%d] Becoming the active controller at epoch %d", self.node_id, epoch)

    def _resign(self) -> None:
        CONTROLLER.info("[QuorumController id=%d] Renouncing the leadership at epoch %d", self.node_id, self.epoch)
        self.controller = None

    def _follow(self, leader_id: int, epoch: int) -> None:
        self.leader_id, self.epoch = leader_id, epoch
        write_quorum_state(self.mdir, leader_id, epoch, -1, self.voters)
        QUORUM.info(
            "[RaftManager id=%d] Completed transition to FollowerState(fetchTimeoutMs=2000, epoch=%d, leaderId=%d, "
            "voters=%s)",
            self.node_id,
            epoch,
            leader_id,
            sorted(self.voters),
        )

    # ---- replication
    def _fetch(self, leader_id: int) -> None:
        assert self.log is not None
        lmdir = Path(self.voters[leader_id]["metadata_log_dir"]) / METADATA_DIR
        try:  # nothing new since the last fetch: the leader's dir and its newest segment as they were
            names = sorted(os.listdir(lmdir))
            newest = max((n for n in names if n.endswith(".log")), default="")
            sig = (leader_id, self.log.next_offset, tuple(names), os.stat(lmdir / newest).st_size if newest else 0)
        except OSError:
            sig = None
        if sig is not None and sig == self._fetched:
            return
        self._fetched = sig
        last = self.log.last
        refs = read_batch_refs(lmdir, last.base_offset if last else self.log.next_offset)
        if last is not None and not (refs and refs[0].header == last):
            self._reconcile(lmdir)
            refs = read_batch_refs(lmdir, self.log.next_offset)
        if not refs and self.log.next_offset < _log_start(lmdir):
            self._fetch_snapshot(lmdir)
            refs = read_batch_refs(lmdir, self.log.next_offset)
        for ref in refs:
            if ref.header.base_offset < self.log.next_offset:
                continue
            if ref.header.base_offset != self.log.next_offset:
                break
            data = read_batch(ref)
            if len(data) != ref.header.size:
                break
            if crc32c(data[V2_CRC_START:]) != ref.header.crc:
                # the follower validates what it appends (DefaultRecordBatch.ensureValid): a corrupt batch of the
                # leader's log stops the fetch there
                if self._fetch_error != ref.header.base_offset:
                    RAFT.error(
                        "[RaftManager id=%d] Fetched batch at offset %d of leader %d is corrupt (CRC mismatch)",
                        self.node_id,
                        ref.header.base_offset,
                        leader_id,
                    )
                    self._fetch_error = ref.header.base_offset
                break
            self.log.append(data)
        self._copy_snapshots(lmdir)

    def _reconcile(self, lmdir: Path) -> None:
        """The follower's log diverged from the leader's: truncate to the last batch both hold."""
        assert self.log is not None
        theirs = {r.header.base_offset: r.header for r in read_batch_refs(lmdir, 0)}
        # below the leader's log start there is nothing to compare (its snapshot holds those records, committed):
        # Raft finds the divergence in the range both logs hold, never by a missing head of the leader's log
        first = min(theirs, default=None)
        keep = self.log.log_start_offset
        for r in self.log.batch_refs(0):
            if first is not None and r.header.last_offset < first:
                keep = r.header.last_offset + 1
                continue
            if theirs.get(r.header.base_offset) != r.header:
                break
            keep = r.header.last_offset + 1
        if keep < self.log.next_offset:
            RAFT.info(
                "[RaftManager id=%d] Truncating the metadata log to offset %d: it diverges from leader %d's",
                self.node_id,
                keep,
                self.leader_id,
            )
            self.log.truncate_to(keep)

    def _fetch_snapshot(self, lmdir: Path) -> None:
        assert self.log is not None
        snaps = snapshot_ids(lmdir)
        if not snaps:
            return
        end, epoch = snaps[-1]
        self._copy_snapshot(lmdir, end, epoch)
        RAFT.info("[RaftManager id=%d] Fetched snapshot %s; the log starts over at %d", self.node_id, end, end)
        self.log.truncate_fully(end)

    def _copy_snapshots(self, lmdir: Path) -> None:
        """The leader's snapshots newer than this node's newest, once this node's log reaches them (what this node's
        own snapshot generator would have written at the same offsets); an older one is never taken again."""
        assert self.log is not None
        for end, epoch in snapshot_ids(lmdir):
            if self.snapshot_end < end <= self.log.next_offset:
                self._copy_snapshot(lmdir, end, epoch)

    def _copy_snapshot(self, lmdir: Path, end: int, epoch: int) -> None:
        name = snapshot_file_name(end, epoch)
        part = self.mdir / (name + ".part")
        with contextlib.suppress(FileNotFoundError):
            shutil.copyfile(lmdir / name, part)
            with open(part, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(part, self.mdir / name)
            self.snapshot_end = max(self.snapshot_end, end)

    # ---- the active controller
    def _append(self, records: list[MetadataRecord]) -> None:
        if not records:
            return
        assert self.log is not None
        h = self.log.append(data_batch(self.log.next_offset, self.epoch, [r.encode() for r in records], now_ms()))
        self.bytes_since_snapshot += h.size
        self.last_write = time.monotonic()

    def _lead(self, alive: dict[int, dict[str, Any]]) -> None:
        ctl = self.controller
        assert ctl is not None and self.log is not None
        if len(alive) * 2 <= len(self.voters):
            return  # no majority: nothing can be committed
        now = time.monotonic()
        for b in sorted(self.voters):
            view = alive.get(b)
            reg = ctl.broker(b)
            if view is not None and view.get("state") in ("registering", "running"):
                if reg is None or reg["IncarnationId"] != view["incarnation_id"]:
                    info = BrokerInfo(
                        b, view["incarnation_id"], int(view["port"]), list(view["log_dirs"]), rack=view.get("rack")
                    )
                    self._append(ctl.register_broker(info, self.log.next_offset))
                    CONTROLLER.info(
                        "[QuorumController id=%d] Registered broker %d with incarnation %s at epoch %d",
                        self.node_id,
                        b,
                        view["incarnation_id"],
                        self.log.next_offset - 1,
                    )
                    continue
            if reg is None:
                continue
            current = view is not None and reg["IncarnationId"] == view.get("incarnation_id")
            if current:
                self.dead_since.pop(b, None)
                assert view is not None
                if reg["Fenced"]:
                    if view["state"] == "running" and int(view.get("end_offset") or 0) > reg["BrokerEpoch"]:
                        self._append(ctl.unfence(b))
                        CONTROLLER.info("[QuorumController id=%d] Unfenced broker %d", self.node_id, b)
                elif view["state"] == "shutting-down":
                    if not reg["InControlledShutdown"]:
                        self._append(ctl.controlled_shutdown(b))
                        CONTROLLER.info("[QuorumController id=%d] Broker %d in controlled shutdown", self.node_id, b)
                elif view["state"] == "running" and not reg["InControlledShutdown"]:
                    offline = [tuple(x) for x in view.get("offline") or []]
                    self._append(ctl.shrink_isr(b, offline) + ctl.expand_isr(b, offline))
            elif not reg["Fenced"]:
                since = self.dead_since.setdefault(b, now)
                if reg["InControlledShutdown"] or now - since >= self.session_timeout_s:
                    self._append(ctl.fence(b))
                    self.dead_since.pop(b, None)
                    CONTROLLER.info(
                        "[QuorumController id=%d] Fenced broker %d (%s)",
                        self.node_id,
                        b,
                        "controlled shutdown" if reg["InControlledShutdown"] else "session expired",
                    )
        self._answer_elections()
        if self.idle_interval_s and time.monotonic() - self.last_write >= self.idle_interval_s:
            self._append([MetadataRecord("NoOpRecord", 0)])
        if self.bytes_since_snapshot >= self.snapshot_bytes:
            self._snapshot()

    def _answer_elections(self) -> None:
        """ElectLeaders requests of the voters' election tools (``fleet_lab.admin``), answered once each."""
        ctl = self.controller
        assert ctl is not None

        def elect(wanted: list[tuple[str, int]] | None) -> dict[str, str | None]:
            records, results = ctl.elect_preferred(wanted)
            if records:
                self._append(records)
                CONTROLLER.info(
                    "[QuorumController id=%d] Elected the preferred leader of %d partition(s)",
                    self.node_id,
                    len(records),
                )
            return results

        controller_answers([Path(v["run_dir"]) for v in self.voters.values() if v.get("run_dir")], elect)

    def _snapshot(self) -> None:
        """SnapshotGenerator: the image at the log end, named after it and the epoch of its last batch."""
        assert self.controller is not None and self.log is not None and self.log.last is not None
        end, epoch = self.log.next_offset, self.log.last.epoch
        data = encode_snapshot(
            [r.encode() for r in self.controller.snapshot_records()], epoch, self.log.last.max_timestamp
        )
        write_snapshot(self.mdir, end, epoch, data)
        self.bytes_since_snapshot = 0
        self.snapshot_end = end
        CONTROLLER.info("[SnapshotGenerator id=%d] Wrote snapshot %s", self.node_id, snapshot_file_name(end, epoch))


def _log_start(mdir: Path) -> int:
    bases = segment_bases(mdir)
    return bases[0] if bases else 0
