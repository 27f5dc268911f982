"""One repair per cluster: the repair lock, kept in the cluster's own ZooKeeper under Kafka's chroot, in
``/fleet-doctor/`` (a path Kafka never uses).

A persistent znode names the holder (plan hash, step, Airflow run): it survives a crashed worker, so a second repair
stays blocked until the first is resumed or the lock is released by hand (docs/repair.md). An ephemeral znode beside
it lives exactly as long as the holder's ZooKeeper session, so a resume waits until the crashed worker is gone.

With an authenticated session (``fleet_doctor.zookeeper.cluster_session``: digest or SASL credentials) the lock
znodes and their parents get an ACL: the product's identity ALL, everyone else READ (an operator sees the holder
but cannot delete or overwrite it; ZooKeeper checks a delete against the parent's ACL, hence the parents). Parents
left open by an earlier unauthenticated run are closed the same way. Without authentication nothing changes: the
znodes are open, as ZooKeeper's default ACL makes them.
"""

from __future__ import annotations

import json
import time
from typing import Any


class LockHeld(RuntimeError):
    """Another repair (or another live worker of this one) holds the cluster's repair lock."""


LOCK_PARENT = "/fleet-doctor"
LOCK_ROOT = f"{LOCK_PARENT}/repair-lock"
ACTIVE_ROOT = f"{LOCK_PARENT}/repair-active"


def lock_acl(zk: Any) -> list[Any] | None:
    """The ACL of the lock znodes for this client: the session's default ACL (``session(auth=...)`` sets it), else
    one made from its digest credentials (a client authenticated by ``add_auth``), else None (open znodes)."""
    if getattr(zk, "default_acl", None):
        return list(zk.default_acl)
    digests = sorted(cred for scheme, cred in getattr(zk, "auth_data", ()) if scheme == "digest")
    if not digests:
        return None
    from fleet_doctor.zookeeper.auth import ZkAuth

    acl = [ZkAuth("digest", cred).acl()[0] for cred in digests]
    return [*acl, ZkAuth("digest", digests[0]).acl()[1]]


def _ensure_root(zk: Any, root: str, acl: list[Any] | None) -> None:
    """``root`` and its parent exist, with ``acl`` when there is one (an open one left by an unauthenticated run is
    replaced: ZooKeeper lets anyone delete a child of an open znode). kazoo's NoAuthError when they belong to
    another identity."""
    from kazoo.exceptions import NoAuthError

    try:
        zk.ensure_path(root, acl=acl)
    except NoAuthError:
        raise NoAuthError(
            f"ZooKeeper refuses to create {root} (relative to Kafka's chroot) for this session: the chroot's ACL "
            f"(Kafka's zookeeper.set.acl) lets only Kafka's identity create in it; create {LOCK_PARENT} there with "
            "an ACL for Fleet Doctor's identity, or give Fleet Doctor that identity (docs/inventory.md)"
        ) from None
    if not acl:
        return
    for path in (LOCK_PARENT, root):
        current, stat = zk.get_acls(path)
        if {(a.perms, a.id.scheme, a.id.id) for a in current} != {(a.perms, a.id.scheme, a.id.id) for a in acl}:
            try:
                zk.set_acls(path, acl, version=stat.aversion)
            except NoAuthError:
                owners = ", ".join(f"{a.id.scheme}:{a.id.id.split(':')[0]}" for a in current)
                raise NoAuthError(
                    f"ZooKeeper {path} is owned by {owners}, not by this session's identity: fix its ACL as "
                    "that identity or ZooKeeper's super user (docs/repair.md)"
                ) from None


def same_owner(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The same plan, step and (when both name one) Airflow run: another run of the same plan is another holder (a
    halted attempt keeps the lock for a human; a second run must not slip in behind it)."""
    same_run = a.get("run_id") is None or b.get("run_id") is None or a.get("run_id") == b.get("run_id")
    return (
        a.get("plan_hash") == b.get("plan_hash") and a.get("step", "brokers") == b.get("step", "brokers") and same_run
    )


def acquire_lock(zk: Any, cluster: str, owner: dict[str, Any], wait_s: float = 0.0, live_wait_s: float = 60.0) -> None:
    """One repair per cluster: a persistent znode (it survives a crashed worker, so a second repair stays blocked
    until this one is resumed or the lock is released by hand). The same plan and step re-acquire it: that is a
    resume. With ``wait_s`` a holder that is another step of the same plan is waited for (the ZooKeeper action
    waits for the broker chain of its plan), never another plan.

    A resume is only allowed once the previous worker is gone: the holder also keeps an **ephemeral** znode
    (``/fleet-doctor/repair-active/<cluster id>``) that lives as long as its ZooKeeper session. A crashed worker's
    session expires within its session timeout; a worker that still runs (Airflow started a second attempt while
    the first is alive) keeps it, and the second one stops after ``live_wait_s`` instead of running alongside."""
    from kazoo.exceptions import NodeExistsError, NoNodeError

    path = f"{LOCK_ROOT}/{cluster}"
    acl = lock_acl(zk)
    _ensure_root(zk, LOCK_ROOT, acl)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            zk.create(path, json.dumps(owner).encode(), acl=acl)
            break
        except NodeExistsError:
            try:
                held = json.loads(zk.get(path)[0])
            except NoNodeError:
                continue  # released in between
            if same_owner(held, owner):
                break
            if held.get("plan_hash") != owner.get("plan_hash") or time.monotonic() > deadline:
                raise LockHeld(f"cluster {cluster} is locked by another repair: {held}") from None
            time.sleep(2)
    active = f"{ACTIVE_ROOT}/{cluster}"
    _ensure_root(zk, ACTIVE_ROOT, acl)
    live_deadline = time.monotonic() + live_wait_s
    while True:
        try:
            zk.create(active, json.dumps(owner).encode(), acl=acl, ephemeral=True)
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
        if same_owner(json.loads(zk.get(path)[0]), owner):
            zk.delete(path)
    except NoNodeError:
        pass
    release_active(zk, cluster)


def release_active(zk: Any, cluster: str) -> None:
    """Delete the liveness node, only when this very session holds it (a worker whose session expired must not
    remove a newer worker's)."""
    from kazoo.exceptions import NoNodeError

    active = f"{ACTIVE_ROOT}/{cluster}"
    stat = zk.exists(active)
    if stat is not None and zk.client_id and stat.ephemeralOwner == zk.client_id[0]:
        try:
            zk.delete(active, version=stat.version)
        except NoNodeError:
            pass


def hand_over(zk: Any, cluster: str, held: dict[str, Any], owner: dict[str, Any]) -> None:
    """Rewrite the lock from ``held`` to ``owner`` (version-checked: it must still be ``held``), keeping ``held`` in
    it so that ``hand_back`` can put it back."""
    path = f"{LOCK_ROOT}/{cluster}"
    raw, stat = zk.get(path)
    if json.loads(raw) != held:
        raise LockHeld(f"cluster {cluster}: the lock changed while it was being taken over: {raw!r}")
    zk.set(path, json.dumps({**owner, "taken_over_from": held}).encode(), version=stat.version)


def hand_back(zk: Any, cluster: str, owner: dict[str, Any]) -> None:
    """Give the lock back to the holder ``hand_over`` took it from (the halted repair still needs a human)."""
    path = f"{LOCK_ROOT}/{cluster}"
    raw, stat = zk.get(path)
    current = json.loads(raw)
    if same_owner(current, owner) and current.get("taken_over_from"):
        zk.set(path, json.dumps(current["taken_over_from"]).encode(), version=stat.version)
    release_active(zk, cluster)


def lock_holder(zk: Any, cluster: str) -> dict[str, Any] | None:
    from kazoo.exceptions import NoNodeError

    try:
        return dict(json.loads(zk.get(f"{LOCK_ROOT}/{cluster}")[0]))
    except NoNodeError:
        return None
