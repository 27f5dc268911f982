"""One repair per cluster: the repair lock, kept in the cluster's own ZooKeeper under Kafka's chroot, in
``/fleet-doctor/`` (a path Kafka never uses).

A persistent znode names the holder (plan hash, step, Airflow run): it survives a crashed worker, so a second repair
stays blocked until the first is resumed or the lock is released by hand (docs/repair.md). An ephemeral znode beside
it lives exactly as long as the holder's ZooKeeper session, so a resume waits until the crashed worker is gone.
"""

from __future__ import annotations

import json
import time
from typing import Any


class LockHeld(RuntimeError):
    """Another repair (or another live worker of this one) holds the cluster's repair lock."""


LOCK_ROOT = "/fleet-doctor/repair-lock"
ACTIVE_ROOT = "/fleet-doctor/repair-active"


def _same_owner(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.get("plan_hash") == b.get("plan_hash") and a.get("step", "brokers") == b.get("step", "brokers")


def acquire_lock(zk: Any, cluster: str, owner: dict[str, Any], wait_s: float = 0.0, live_wait_s: float = 60.0) -> None:
    """One repair per cluster: a persistent znode (it survives a crashed worker, so a second repair stays blocked
    until this one is resumed or the lock is released by hand). The same plan and step re-acquire it: that is a
    resume. With ``wait_s`` a holder that is another step of the same plan is waited for (the ZooKeeper action
    waits for the broker chain of its plan), never another plan.

    A resume is only allowed once the previous worker is gone: the holder also keeps an **ephemeral** znode
    (``/fleet-doctor/repair-active/<cluster>``) that lives as long as its ZooKeeper session. A crashed worker's
    session expires within its session timeout; a worker that still runs (Airflow started a second attempt while
    the first is alive) keeps it, and the second one stops after ``live_wait_s`` instead of running alongside."""
    from kazoo.exceptions import NodeExistsError, NoNodeError

    path = f"{LOCK_ROOT}/{cluster}"
    zk.ensure_path(LOCK_ROOT)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            zk.create(path, json.dumps(owner).encode())
            break
        except NodeExistsError:
            try:
                held = json.loads(zk.get(path)[0])
            except NoNodeError:
                continue  # released in between
            if _same_owner(held, owner):
                break
            if held.get("plan_hash") != owner.get("plan_hash") or time.monotonic() > deadline:
                raise LockHeld(f"cluster {cluster} is locked by another repair: {held}") from None
            time.sleep(2)
    active = f"{ACTIVE_ROOT}/{cluster}"
    zk.ensure_path(ACTIVE_ROOT)
    live_deadline = time.monotonic() + live_wait_s
    while True:
        try:
            zk.create(active, json.dumps(owner).encode(), ephemeral=True)
            return
        except NodeExistsError:
            if time.monotonic() > live_deadline:
                try:
                    other = zk.get(active)[0].decode(errors="replace")
                except NoNodeError:
                    continue
                raise LockHeld(f"another worker is executing a repair of {cluster} right now: {other}") from None
            time.sleep(1)


def release_lock(zk: Any, cluster: str, owner: dict[str, Any]) -> None:
    from kazoo.exceptions import NoNodeError

    path = f"{LOCK_ROOT}/{cluster}"
    try:
        if _same_owner(json.loads(zk.get(path)[0]), owner):
            zk.delete(path)
    except NoNodeError:
        pass
    try:
        if _same_owner(json.loads(zk.get(f"{ACTIVE_ROOT}/{cluster}")[0]), owner):
            zk.delete(f"{ACTIVE_ROOT}/{cluster}")
    except NoNodeError:
        pass


def lock_holder(zk: Any, cluster: str) -> dict[str, Any] | None:
    from kazoo.exceptions import NoNodeError

    try:
        return dict(json.loads(zk.get(f"{LOCK_ROOT}/{cluster}")[0]))
    except NoNodeError:
        return None
