"""One repair per cluster, written once: the cluster's repair lock taken, the act, the lock released or kept for a
human, the result written. The repair's broker chain, its ZooKeeper write and the restore all run under
``cluster_lock`` (``repair.tasks``, ``repair.restore_tasks``).

Where the lock lives is the metadata mode's (``ZooKeeperLock``, ``DirectoryLock``: one interface, ``RepairLock``): in
a ZooKeeper cluster's own ZooKeeper (``zookeeper.lock``), in a session of it; on KRaft, which has no ZooKeeper, as
files in the shared repairs dir (``repair.dir_lock``), with the same rules. Either way it is keyed by the Kafka
cluster's own id, read live (``/cluster/id``; the voters' ``meta.properties``), and the health gates are the metadata
mode's (``zookeeper.cluster.Cluster``; ``repair.kraft_cluster.KraftCluster``).

The lock (``zookeeper.lock``) is kept, and only the worker's liveness node released, when the act leaves something a
human must look at first: a halt after a file changed or with a broker left down, a partial ZooKeeper write
(``LockedCluster.keep_when``). A restore that took the lock over from the halted attempt it puts back hands it back
when that attempt still needs a human (``hand_back_when``). A worker whose fence fell touches neither the lock nor
the liveness node: they may be another worker's now (docs/repair.md, "After a halt").
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_doctor import inventory, lock_state
from fleet_doctor.cluster_health import ClusterHealth
from fleet_doctor.layout import PLAN, PLAN_TEXT, RepairsDir, attempt_name
from fleet_doctor.remote import airflow_ssh_client
from fleet_doctor.repair import dir_lock
from fleet_doctor.repair.dir_lock import DirLock, DirLockError
from fleet_doctor.repair.errors import FenceLost, RepairError
from fleet_doctor.repair.gates import static_min_isr
from fleet_doctor.repair.kraft_cluster import KraftCluster
from fleet_doctor.settings import Settings, SettingsError
from fleet_doctor.store import write_atomic
from fleet_doctor.zookeeper import cluster_session, credentials
from fleet_doctor.zookeeper import lock as zk_lock
from fleet_doctor.zookeeper.cluster import Cluster
from fleet_doctor.zookeeper.lock import ACTIVE_ROOT, LockHeld

LOG = logging.getLogger(__name__)
SESSION_TIMEOUT_S = 10.0  # the lock's liveness node outlives a crashed worker by about this long
CONNECT_TIMEOUT_S = 15.0


# ---- what a repair task opens
def repairs_dir(settings: Settings) -> RepairsDir:
    """The repairs dir (``FLEET_DOCTOR_REPAIR_DIR``), RepairError when the settings give none."""
    try:
        return RepairsDir(settings.repairs)
    except SettingsError as e:  # a remote data root without FLEET_DOCTOR_REPAIR_DIR
        raise RepairError(str(e)) from e


def save_for_approval(where: Path, plan: Any, asked: Any) -> dict[str, Any]:
    """A restore's or a purge's plan saved in ``where`` (``plan.json``, and ``plan.md``: what people read), and what
    its approval shows (``asked``: an ``approval_text.Request``), as the plan task's XCom."""
    where.mkdir(parents=True, exist_ok=True)
    write_atomic(where / PLAN, plan.to_json().encode())
    write_atomic(where / PLAN_TEXT, asked.body.encode())
    return {"hash": plan.hash, "subject": asked.subject, "markdown": asked.body, "approve_option": asked.option}


def lock_mirror(settings: Settings) -> Any:
    """The cluster's store, where the repair lock's state is shown to the fleet page (``lock_state``); None (logged)
    when it cannot be reached: the fleet page then shows an older state, the repair goes on."""
    try:
        return settings.store
    except Exception as e:
        LOG.warning("the data store cannot be reached: the fleet page will not show this repair's lock: %s", e)
        return None


def ssh_connect(inv: inventory.Inventory) -> Callable[[int], Any]:
    """broker id -> a connected ``paramiko.SSHClient`` through the broker's Airflow SSH connection."""

    def connect(broker_id: int) -> Any:
        return airflow_ssh_client(inv.ssh_connection_id(broker_id))

    return connect


def lock_fence(zk: Any, cluster: str) -> Callable[[], None]:
    """Before every step: this worker still holds the lock's liveness node in the ZooKeeper session it took it
    with. A session that expired (a long GC pause, a partition) lost the ephemeral node, and another worker may have
    taken over: stop and report rather than act beside it."""
    session_id = zk.client_id[0] if zk.client_id else None
    active = f"{ACTIVE_ROOT}/{cluster}"

    def fence() -> None:
        now = zk.client_id[0] if zk.client_id else None
        if not zk.connected or now != session_id:
            raise FenceLost(f"the ZooKeeper session this repair locked {cluster} with was lost: halting")
        held = zk.exists(active)
        if held is None or held.ephemeralOwner != session_id:
            raise FenceLost(f"this worker no longer holds {active} (its session expired?): halting")

    return fence


def session_lost(e: BaseException) -> bool:
    """kazoo's word that the session the lock was taken in is gone or unusable: expired, or the connection lost."""
    from kazoo.exceptions import ConnectionClosedError, ConnectionLoss, SessionExpiredError

    return isinstance(e, (SessionExpiredError, ConnectionLoss, ConnectionClosedError))


def lock_key(cluster: Any, inv: inventory.Inventory, planned_id: str | None = None) -> str:
    """The repair lock's key: the Kafka cluster's own id (ZooKeeper's ``/cluster/id``; on KRaft the cluster.id the
    voters were formatted with), so that two inventories naming one cluster differently still take one lock.
    Refused (RepairError) when the cluster holds no id, or one other than the inventory's ``cluster_id`` or than
    ``planned_id`` (the id of the cluster the plan was made on, as its audit read it): the inventory points at
    another cluster (a wrong ensemble, chroot or controller), or the cluster was rebuilt since."""
    if inv.kraft:
        where = f"the controllers' metadata ({len(inv.controllers)} voter(s))"
        none = "holds no cluster.id (kafka-storage format writes it in every meta.properties)"
    else:
        where = f"ZooKeeper ({inv.zookeeper})"
        none = "holds no /cluster/id, which Kafka 0.10.1+ writes at its first start"
    try:
        live = cluster.cluster_id()
    except (ValueError, RepairError) as e:
        raise RepairError(f"cluster {inv.cluster}: {e}; nothing was changed") from None
    if live is None:
        raise RepairError(
            f"cluster {inv.cluster}: {where} {none}: the repair lock is keyed by it (a wrong chroot or controller?); "
            "nothing was changed"
        )
    if inv.cluster_id is not None and inv.cluster_id != live:
        raise RepairError(
            f"cluster {inv.cluster}: the inventory names cluster id {inv.cluster_id}, {where} holds {live}: not the "
            "same Kafka cluster (a wrong ensemble, chroot or controller?); nothing was changed"
        )
    if planned_id is not None and planned_id != live:
        raise RepairError(
            f"cluster {inv.cluster}: the plan was made on cluster id {planned_id} (its audit), {where} now holds "
            f"{live}: not the cluster that was audited; nothing was changed"
        )
    return live


# ---- where the lock lives
class RepairLock:
    """The repair lock of one cluster (its ``key``), wherever it lives: what the skeleton asks of it."""

    key: str
    zk: Any = None  # the ZooKeeper session (ZooKeeper clusters only)

    def holder(self) -> dict[str, Any] | None:
        raise NotImplementedError

    def worker_alive(self) -> bool:
        """A worker of the holder is executing now (its liveness node or file)."""
        raise NotImplementedError

    def acquire(self, owner: dict[str, Any], wait_s: float, live_wait_s: float) -> None:
        raise NotImplementedError

    def fence(self) -> Callable[[], None]:
        raise NotImplementedError

    def release(self, owner: dict[str, Any]) -> None:
        raise NotImplementedError

    def release_active(self) -> None:
        raise NotImplementedError

    def hand_over(self, held: dict[str, Any], owner: dict[str, Any]) -> None:
        raise NotImplementedError

    def hand_back(self, owner: dict[str, Any]) -> None:
        raise NotImplementedError

    def seen(self, seen_by: str, kept: str | None) -> lock_state.LockState:
        raise NotImplementedError

    def lost(self, e: BaseException) -> bool:
        """Whether ``e`` is the loss of what the lock lives by (a ZooKeeper session)."""
        return False

    def gates(self, inv: inventory.Inventory, params: dict[str, Any]) -> ClusterHealth:
        """The health gates' view of the cluster, with the brokers' static min ISR (``gates.static_min_isr``)."""
        raise NotImplementedError


class ZooKeeperLock(RepairLock):
    """The lock in the cluster's own ZooKeeper (``zookeeper.lock``), in the kazoo session ``zk``."""

    def __init__(self, zk: Any, key: str) -> None:
        self.zk, self.key = zk, key

    def holder(self) -> dict[str, Any] | None:
        return zk_lock.lock_holder(self.zk, self.key)

    def worker_alive(self) -> bool:
        return self.zk.exists(f"{ACTIVE_ROOT}/{self.key}") is not None

    def acquire(self, owner: dict[str, Any], wait_s: float, live_wait_s: float) -> None:
        zk_lock.acquire_lock(self.zk, self.key, owner, wait_s=wait_s, live_wait_s=live_wait_s)

    def fence(self) -> Callable[[], None]:
        return lock_fence(self.zk, self.key)

    def release(self, owner: dict[str, Any]) -> None:
        zk_lock.release_lock(self.zk, self.key, owner)

    def release_active(self) -> None:
        zk_lock.release_active(self.zk, self.key)

    def hand_over(self, held: dict[str, Any], owner: dict[str, Any]) -> None:
        zk_lock.hand_over(self.zk, self.key, held, owner)

    def hand_back(self, owner: dict[str, Any]) -> None:
        zk_lock.hand_back(self.zk, self.key, owner)

    def seen(self, seen_by: str, kept: str | None) -> lock_state.LockState:
        return lock_state.seen_in_zookeeper(self.zk, self.key, seen_by, kept)

    def lost(self, e: BaseException) -> bool:
        return session_lost(e)

    def gates(self, inv: inventory.Inventory, params: dict[str, Any]) -> ClusterHealth:
        """A topic without its own ``min.insync.replicas`` takes ZooKeeper's cluster-wide default
        (``/config/brokers/<default>``), else the form's or the inventory's static one, else Kafka's 1."""
        return Cluster(self.zk, default_min_isr=static_min_isr(params, inv.min_insync_replicas))


class DirectoryLock(RepairLock):
    """The lock of a cluster without ZooKeeper: files in the shared repairs dir (``repair.dir_lock.DirLock``); the
    gates read the committed metadata of its quorum (``KraftCluster``, reaching the controllers with ``connect``)."""

    def __init__(self, lock: DirLock, connect: Any = None, live: KraftCluster | None = None) -> None:
        self.lock, self.key, self.connect, self.live = lock, lock.key, connect, live

    def close(self) -> None:
        """The connections to the voters the gates kept open (``gates`` shares them with ``live``)."""
        if self.live is not None:
            self.live.close()

    def _checked(self, what: Callable[[], Any]) -> Any:
        try:
            return what()
        except DirLockError as e:
            raise RepairError(f"the repair lock of cluster {self.key}: {e}") from e

    def holder(self) -> dict[str, Any] | None:
        return self._checked(self.lock.holder)  # type: ignore[no-any-return]

    def worker_alive(self) -> bool:
        return self._checked(self.lock.worker_alive)  # type: ignore[no-any-return]

    def acquire(self, owner: dict[str, Any], wait_s: float, live_wait_s: float) -> None:
        self._checked(lambda: self.lock.acquire(owner, wait_s=wait_s, live_wait_s=live_wait_s))

    def fence(self) -> Callable[[], None]:
        return self.lock.fence()

    def release(self, owner: dict[str, Any]) -> None:
        self._checked(lambda: self.lock.release(owner))

    def release_active(self) -> None:
        self._checked(self.lock.release_active)

    def hand_over(self, held: dict[str, Any], owner: dict[str, Any]) -> None:
        self._checked(lambda: self.lock.hand_over(held, owner))

    def hand_back(self, owner: dict[str, Any]) -> None:
        self._checked(lambda: self.lock.hand_back(owner))

    def seen(self, seen_by: str, kept: str | None) -> lock_state.LockState:
        return lock_state.seen_in_dir(self.lock.root, self.key, seen_by, kept)

    def gates(self, inv: inventory.Inventory, params: dict[str, Any]) -> ClusterHealth:
        """Min ISR from the metadata's ConfigRecords, else the static default; a voter of a quorum of fewer than 3
        is restarted only when the approved plan allows losing the quorum meanwhile. The view the lock's key was read
        with, when there is one: its image is followed from there, not read whole again."""
        gates = KraftCluster(
            inv,
            self.connect,
            static_min_isr(params, inv.min_insync_replicas),
            allow_quorum_loss=bool(params.get("allow_quorum_loss")),
        )
        if self.live is not None:
            gates.follower, gates.view = self.live.follower, self.live.view
        return gates


# ---- the lock skeleton
Why = Callable[[], str | None]


@dataclass
class LockedCluster:
    """The cluster while this worker holds its repair lock: what the act needs (the session, the fence, the health
    gates) and how it says whether the lock may go at the end."""

    lock: RepairLock
    inventory: inventory.Inventory
    owner: dict[str, Any]
    report: dict[str, Any]
    key: str  # the lock's key: the cluster's id (``lock_key``)
    taken_over: dict[str, Any] | None = None  # the halted attempt's holder a restore took the lock over from
    mirror: Any = None  # the cluster's store, where the lock's state is mirrored for the fleet page (``lock_state``)
    fenced: bool = False
    _keep: list[Why] = field(default_factory=list)
    _hand_back: Why | None = None

    @property
    def name(self) -> str:
        return self.inventory.cluster

    @property
    def zk(self) -> Any:
        """The ZooKeeper session the lock was taken in (None on KRaft)."""
        return self.lock.zk

    def fence(self) -> Callable[[], None]:
        return self.lock.fence()

    def cluster(self, params: dict[str, Any]) -> ClusterHealth:
        """The health gates' view of the cluster for the approved ``params`` (their static min ISR)."""
        return self.lock.gates(self.inventory, params)

    def show(self, kept: str | None = None) -> lock_state.LockState | None:
        """The lock as it is held now, mirrored in the cluster's store when there is one (best effort: None, logged,
        when it cannot be read)."""
        try:
            step = str(self.owner["step"])
            state = self.lock.seen(step if step in ("restore", "roll", "purge") else "repair", kept)
        except Exception as e:
            LOG.warning("repair %s: the lock could not be read back: %s", self.owner["plan_hash"][:12], e)
            return None
        if self.mirror is not None:
            lock_state.record(self.mirror, state)
        return state

    def keep_when(self, why: Why) -> None:
        """At the end, whatever happened: when ``why()`` says something, the lock stays (that is why)."""
        self._keep.append(why)

    def hand_back_when(self, why: Why) -> None:
        """At the end of a restore that took the lock over: when ``why()`` says something, it goes back to the halted
        attempt (which still needs a human), else it is released."""
        self._hand_back = why

    def release(self) -> None:
        """Release the lock, keep it, or hand it back, as the act said; the report says which. Only through the
        session that took it: when the fence has fallen by now (kazoo reconnected with a new session after an
        expiry), this worker leaves the lock alone."""
        report, who = self.report, self.owner["plan_hash"][:12]
        if not self.fenced:
            try:
                self.fence()()
            except FenceLost:
                self.fenced = True
            except Exception as e:  # ZooKeeper unreachable: nothing can be released, nor safely decided
                self.fenced = True
                LOG.error("repair %s: the fence could not be checked before the release: %s", who, e)
        if self.fenced:
            lost = "its ZooKeeper session" if self.zk is not None else "the lock (its token or its liveness)"
            report["lock_kept"] = f"this worker lost {lost}: it left the lock and the journal alone"
            report["lock_released"] = False
            LOG.error("repair %s: %s", who, report["lock_kept"])
            self.show()  # read only: the page must not go on saying "executing" (a dead session just fails, logged)
            return
        back = self._hand_back() if self.taken_over is not None and self._hand_back else None
        if back:
            self.lock.hand_back(self.owner)
            report["lock_kept"] = f"handed back to {self.taken_over.get('run_id')}: {back}"  # type: ignore[union-attr]
            report["lock_released"] = False
            self.show(kept=back)
            return
        why = next((w for w in (keep() for keep in self._keep) if w), None)
        if why:
            report["lock_kept"] = why
            LOG.error("repair %s: %s", who, why)
            with contextlib.suppress(Exception):  # this worker is done: only its own liveness node goes
                self.lock.release_active()
        else:
            self.lock.release(self.owner)
        state = self.show(kept=why)  # one read of the lock: the report's and the fleet page's
        if state is not None:
            report["lock_released"] = not state.held


@contextlib.contextmanager
def holding(
    zk: Any,
    inv: inventory.Inventory,
    owner: dict[str, Any],
    report: dict[str, Any],
    *,
    cluster_id: str | None = None,
    **hold: Any,
) -> Iterator[LockedCluster]:
    """Hold the cluster's repair lock in the session ``zk`` as ``owner`` ({plan_hash, step, run_id, since}) around
    the block, then release it, keep it or hand it back (``LockedCluster.release``; the report says which).
    ``cluster_id``: the id of the cluster the plan was made on (``lock_key``); ``hold``: ``held_lock``'s keywords."""
    backend = ZooKeeperLock(zk, lock_key(Cluster(zk), inv, cluster_id))
    with held_lock(backend, inv, owner, report, **hold) as lock:
        yield lock


def directory_lock(
    lock_dir: Path,
    inv: inventory.Inventory,
    connect: Any = None,
    cluster_id: str | None = None,
    lease_s: float | None = None,
) -> DirectoryLock:
    """The repair lock of a KRaft cluster in ``lock_dir`` (``Settings.lock_dir``), keyed by the cluster.id its voters
    hold (``lock_key``: read live, checked against the inventory's and the plan's); ``lease_s``: how long a dead
    worker's liveness is waited out (default ``dir_lock.LEASE_S``)."""
    live = KraftCluster(inv, connect)
    try:
        key = lock_key(live, inv, cluster_id)  # a quorum that cannot be read: refused there
    except BaseException:
        live.close()
        raise
    return DirectoryLock(DirLock(lock_dir, key, lease_s if lease_s is not None else dir_lock.LEASE_S), connect, live)


@contextlib.contextmanager
def held_lock(
    backend: RepairLock,
    inv: inventory.Inventory,
    owner: dict[str, Any],
    report: dict[str, Any],
    *,
    wait_s: float = 0.0,
    live_wait_s: float = 60.0,
    check_holder: Callable[[dict[str, Any] | None], None] | None = None,
    take_over: tuple[str, str] | None = None,
    mirror: Any = None,
) -> Iterator[LockedCluster]:
    """Hold the repair lock ``backend`` (wherever it lives: ``RepairLock``) as ``owner`` around the block, then
    release it, keep it or hand it back (``LockedCluster.release``; the report says which). ``wait_s``: how long to
    wait for another step of the same plan; ``live_wait_s``: for a previous worker of the same attempt to be gone;
    ``check_holder``: called with the current holder before the lock is taken (raises to refuse); ``take_over``:
    (plan hash, attempt) of a halted repair attempt a restore puts back, whose lock it takes over; ``mirror``: the
    cluster's store, where the lock's state is shown to the fleet page once taken and again at the end
    (``lock_state``)."""
    key = backend.key
    owner = {**owner, "cluster": inv.cluster}  # the inventory's name, for whoever reads the lock
    lock = LockedCluster(backend, inv, owner, report, key, mirror=mirror)
    report["lock"] = key
    if check_holder is not None:
        check_holder(backend.holder())
    if take_over is not None:
        lock.taken_over = _take_over(backend, *take_over, owner)
    backend.acquire(owner, wait_s=wait_s, live_wait_s=live_wait_s)
    lock.show()
    try:
        yield lock
    except FenceLost:
        lock.fenced = True
        raise
    except BaseException as e:
        if backend.lost(e):  # the act met the loss itself: the same as a fallen fence
            lock.fenced = True
            raise FenceLost(f"the ZooKeeper session this repair locked {inv.cluster} with was lost: {e!r}") from e
        raise
    finally:
        lock.release()


@contextlib.contextmanager
def cluster_lock(
    inv: inventory.Inventory,
    owner: dict[str, Any],
    report: dict[str, Any],
    result: Path,
    *,
    before_result: Callable[[dict[str, Any]], None] | None = None,
    session_timeout: float = SESSION_TIMEOUT_S,
    lock_dir: Path | None = None,
    connect: Any = None,
    **hold: Any,
) -> Iterator[LockedCluster]:
    """``holding`` the lock in a session of the cluster's ZooKeeper (``session_timeout``: how long the lock's liveness
    node outlives a worker that died), or on KRaft in ``lock_dir`` (``directory_lock``; ``connect``: how the
    controllers are reached, default their Airflow connections), then ``report`` written to ``result`` whatever
    happened (``before_result`` adds to it first). ``hold``: ``holding``'s keywords."""
    try:
        if inv.kraft:
            if lock_dir is None:
                raise RepairError(f"cluster {inv.cluster} is a KRaft cluster: its repair lock needs a lock dir")
            backend = directory_lock(lock_dir, inv, connect, hold.pop("cluster_id", None), hold.pop("lease_s", None))
            try:
                with held_lock(backend, inv, owner, report, **hold) as lock:
                    yield lock
            finally:
                backend.close()
            return
        auth = credentials(inv)
        if auth is None and not inv.allow_anonymous_zookeeper:
            raise RepairError(
                f"cluster {inv.cluster}: no ZooKeeper identity (the Airflow connection {inv.zookeeper_connection_id} "
                "sets no credentials): a repair writes its lock and Kafka's znodes only as an identity whose ACL "
                "protects them; set the connection's login and password (docs/inventory.md), or, for a ZooKeeper "
                "without authentication, say so with the inventory's allow_anonymous_zookeeper: true. Nothing was "
                "changed"
            )
        with cluster_session(inv, auth=auth, timeout=session_timeout, start_timeout=CONNECT_TIMEOUT_S) as zk:
            with holding(zk, inv, owner, report, **hold) as lock:
                yield lock
    finally:
        if before_result is not None:
            before_result(report)
        result.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(result, json.dumps(report, indent=2, default=str).encode())


def _take_over(lock: RepairLock, plan_hash: str, attempt: str, owner: dict[str, Any]) -> dict[str, Any] | None:
    """A halted attempt of a repair keeps the lock for a human; restoring that very attempt is what the human does
    about it. Taken over (the holder kept in the lock, to be handed back) only when no worker of it is alive (its
    liveness node or file is gone); returns the holder taken over from, or None."""
    cluster = lock.key
    held = lock.holder()
    if held is None or held.get("plan_hash") != plan_hash or held.get("step") != "brokers":
        return None  # free, ours (a resumed restore), or another plan's: acquire_lock decides
    if attempt_name(str(held.get("run_id"))) != attempt:
        raise LockHeld(
            f"cluster {cluster} is locked by run {held.get('run_id')} of this repair, not by attempt {attempt} that "
            "this restore puts back: restore that run's attempt (param attempt), or resume it"
        )
    if lock.worker_alive():
        raise LockHeld(f"a worker is executing a repair of {cluster} right now: {held}")
    lock.hand_over(held, owner)
    return held
