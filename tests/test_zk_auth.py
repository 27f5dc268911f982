"""ZooKeeper authentication and ACLs on the lab's real ZooKeeper (issue 15 item 16).

Kafka's znodes are protected as ``zookeeper.set.acl=true`` protects them (CREATOR_ALL for Kafka's identity, world
READ); the product authenticates with digest credentials from the Airflow connection ``kafka_zk_<cluster>``, its
repair lock is created with an ACL only its identity can change (world READ: an operator sees the holder), and
everything works unchanged without credentials. The lock is released only through the session that took it."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.exceptions import NoAuthError
from kazoo.security import CREATOR_ALL_ACL, OPEN_ACL_UNSAFE, READ_ACL_UNSAFE, Permissions

from fleet_doctor import inventory, lock_state
from fleet_doctor.audit import steps
from fleet_doctor.repair.errors import FenceLost, RepairError
from fleet_doctor.repair.session import holding
from fleet_doctor.settings import Settings
from fleet_doctor.store import Store
from fleet_doctor.zookeeper import ZkAuth, ZkAuthError, cluster_session, credentials, session
from fleet_doctor.zookeeper.auth import from_connection
from fleet_doctor.zookeeper.lock import (
    ACTIVE_ROOT,
    LOCK_PARENT,
    LOCK_ROOT,
    LockHeld,
    acquire_lock,
    lock_holder,
    release_lock,
)
from fleet_lab.zk_server import ZooKeeperServer, digest_id
from harness import zk_session

KAFKA = ZkAuth("digest", "kafka:kafka-secret")
DOCTOR = ZkAuth("digest", "fleet-doctor:doctor-secret")
MALLORY = ZkAuth("digest", "mallory:guess")
OWNER = {"plan_hash": "a" * 64, "step": "brokers", "run_id": "r1"}


def _acl(zk: Any, path: str) -> set[tuple[int, str, str]]:
    return {(a.perms, a.id.scheme, a.id.id) for a in zk.get_acls(path)[0]}


DOCTOR_ACL = {
    (Permissions.ALL, "digest", digest_id("fleet-doctor", "doctor-secret")),
    (Permissions.READ, "world", "anyone"),
}


def _inv(server: ZooKeeperServer, chroot: str, cluster: str) -> inventory.Inventory:
    entry = inventory.BrokerEntry(1, "127.0.0.1", 22, "k", "/k", "ssh-ed25519 AAAA", ["/d"], "3.6.2", {})
    return inventory.Inventory(cluster, server.connect + chroot, [entry])


def _kafka_znodes(server: ZooKeeperServer, chroot: str) -> None:
    """Kafka's metadata under ``chroot``, created by Kafka's identity with zookeeper.set.acl's ACL."""
    acl = CREATOR_ALL_ACL + READ_ACL_UNSAFE
    with session(server.connect, auth=KAFKA) as kafka:
        kafka.create(chroot, acl=acl)
        for path, data in (
            ("/brokers/ids/1", {"version": 5, "host": "h", "port": 9092, "jmx_port": -1, "endpoints": []}),
            ("/brokers/topics/t", {"version": 2, "partitions": {"0": [1]}}),
            ("/brokers/topics/t/partitions/0/state", {"controller_epoch": 1, "leader": 1, "version": 1, "isr": [1]}),
            ("/controller", {"version": 1, "brokerid": 1, "timestamp": "1"}),
            ("/config/brokers/<default>", {"version": 1, "config": {"min.insync.replicas": "1"}}),
        ):
            kafka.create(chroot + path, json.dumps(data).encode(), acl=acl, makepath=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    with ZooKeeperServer(tmp_path_factory.mktemp("zk"), digest_auth=True, super_user=("super", "admin")) as zk:
        _kafka_znodes(zk, "/kafka")
        yield zk


def test_kafka_znodes_with_acls_refuse_an_anonymous_writer(server: ZooKeeperServer) -> None:
    """The lab's ZooKeeper enforces ACLs: what Kafka created with zookeeper.set.acl is read-only to others."""
    with session(server.connect + "/kafka") as anon:
        assert json.loads(anon.get("/brokers/topics/t")[0])["partitions"] == {"0": [1]}  # world READ
        with pytest.raises(NoAuthError):
            anon.set("/brokers/topics/t", b"{}")
        with pytest.raises(NoAuthError):
            anon.create("/brokers/topics/u", b"{}")
    with session(server.connect + "/kafka", auth=("digest", "super:admin")) as admin:
        assert admin.get_children("/brokers/topics") == ["t"]


def test_lock_created_with_the_products_acl_and_refused_to_others(server: ZooKeeperServer) -> None:
    with session(server.connect) as anon:
        anon.create("/c1")  # a chroot without ACLs (Kafka without zookeeper.set.acl)
    with session(server.connect + "/c1", auth=DOCTOR) as doctor:
        acquire_lock(doctor, "c1", OWNER)
        for path in (LOCK_PARENT, LOCK_ROOT, ACTIVE_ROOT, f"{LOCK_ROOT}/c1", f"{ACTIVE_ROOT}/c1"):
            assert _acl(doctor, path) == DOCTOR_ACL, path
        for who in (None, MALLORY, KAFKA):
            with session(server.connect + "/c1", auth=who) as other:
                assert lock_holder(other, "c1") == OWNER  # an operator sees who holds it
                for path in (f"{LOCK_ROOT}/c1", f"{ACTIVE_ROOT}/c1"):
                    with pytest.raises(NoAuthError):
                        other.delete(path)
                    with pytest.raises(NoAuthError):
                        other.set(path, json.dumps({**OWNER, "plan_hash": "b" * 64}).encode())
                with pytest.raises(NoAuthError):
                    other.create(f"{LOCK_ROOT}/c2", b"{}")  # nobody else takes a lock here either
                with pytest.raises(NoAuthError):
                    other.set_acls(LOCK_ROOT, OPEN_ACL_UNSAFE)
                with pytest.raises(NoAuthError):  # the lock functions themselves are refused too
                    release_lock(other, "c1", OWNER)
        assert lock_holder(doctor, "c1") == OWNER
    with session(server.connect + "/c1", auth=DOCTOR) as doctor:  # the worker is gone: a resume
        acquire_lock(doctor, "c1", OWNER, live_wait_s=10)
        release_lock(doctor, "c1", OWNER)
        assert lock_holder(doctor, "c1") is None and not doctor.exists(f"{ACTIVE_ROOT}/c1")
        acquire_lock(doctor, "c1", OWNER)
        release_lock(doctor, "c1", OWNER)


def test_a_chroot_owned_by_kafka_needs_the_lock_parent_made_for_the_product(server: ZooKeeperServer) -> None:
    """With zookeeper.set.acl only Kafka's identity may create in its chroot: the operator creates /fleet-doctor
    for the product's identity once (docs/inventory.md); until then the lock says so."""
    with session(server.connect + "/kafka", auth=DOCTOR) as doctor:
        with pytest.raises(NoAuthError, match="create /fleet-doctor there with an ACL for Fleet Doctor's identity"):
            acquire_lock(doctor, "kafka", OWNER)
    with session(server.connect + "/kafka", auth=("digest", "super:admin")) as admin:
        admin.create(LOCK_PARENT, acl=DOCTOR.acl())
    with session(server.connect + "/kafka", auth=DOCTOR) as doctor:
        acquire_lock(doctor, "kafka", OWNER)
        assert _acl(doctor, f"{LOCK_ROOT}/kafka") == _acl(doctor, LOCK_PARENT) == DOCTOR_ACL
        release_lock(doctor, "kafka", OWNER)
    with session(server.connect + "/kafka") as anon:
        with pytest.raises(NoAuthError):
            anon.create(f"{LOCK_ROOT}/kafka", b"{}")


def test_open_parents_left_by_an_unauthenticated_run_are_closed(server: ZooKeeperServer) -> None:
    """ZooKeeper checks a delete against the parent's ACL: an open parent would let anyone delete the lock."""
    with session(server.connect) as anon:
        anon.ensure_path("/c3" + LOCK_ROOT)
        anon.ensure_path("/c3" + ACTIVE_ROOT)
    with session(server.connect + "/c3", auth=DOCTOR) as doctor:
        acquire_lock(doctor, "c3", OWNER)
        assert _acl(doctor, LOCK_PARENT) == _acl(doctor, LOCK_ROOT) == _acl(doctor, ACTIVE_ROOT) == DOCTOR_ACL
    with session(server.connect + "/c3") as anon:
        with pytest.raises(NoAuthError):
            anon.delete(f"{LOCK_ROOT}/c3")
    with session(server.connect + "/c3", auth=MALLORY) as mallory:  # another identity cannot take them over
        with pytest.raises(NoAuthError, match="owned by digest:fleet-doctor"):
            acquire_lock(mallory, "c4", OWNER)


def test_without_auth_the_lock_is_unchanged(server: ZooKeeperServer) -> None:
    with session(server.connect) as anon:
        anon.ensure_path("/plain")
    with session(server.connect + "/plain") as first, session(server.connect + "/plain") as second:
        acquire_lock(first, "c5", OWNER)
        assert _acl(first, f"{LOCK_ROOT}/c5") == {(Permissions.ALL, "world", "anyone")}
        release_lock(second, "c5", OWNER)  # an open lock: anyone may release it, as before
        assert lock_holder(first, "c5") is None


def test_a_raw_kazoo_client_with_digest_auth_gets_the_acl_too(server: ZooKeeperServer) -> None:
    from kazoo.client import KazooClient

    with session(server.connect) as anon:
        anon.ensure_path("/raw")
    raw = KazooClient(hosts=server.connect + "/raw", auth_data=[("digest", DOCTOR.credential)])
    raw.start(timeout=15)
    try:
        acquire_lock(raw, "c6", OWNER)
        assert _acl(raw, f"{LOCK_ROOT}/c6") == DOCTOR_ACL
        release_lock(raw, "c6", OWNER)
    finally:
        raw.stop()
        raw.close()


def test_credentials_from_the_airflow_connection(server: ZooKeeperServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """``kafka_zk_<cluster>``'s login/password/extra (an AIRFLOW_CONN_* variable: Airflow's own lookup) give the
    session's identity; ``cluster_session`` uses them; a cluster without the connection gets none."""
    inv = _inv(server, "/kafka", "authlab")
    assert credentials(inv) is None
    conn = {"conn_type": "generic", "host": "127.0.0.1", "port": server.port, "login": "fleet-doctor"}
    conn |= {"password": "doctor-secret", "extra": {"connect": inv.zookeeper, "auth_scheme": "digest"}}
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_ZK_AUTHLAB", json.dumps(conn))
    auth = credentials(inv)
    assert auth == DOCTOR and credentials("authlab") == DOCTOR
    assert "doctor-secret" not in repr(auth)
    with cluster_session(inv) as zk:
        acquire_lock(zk, "authlab", OWNER)
        assert _acl(zk, f"{LOCK_ROOT}/authlab") == DOCTOR_ACL
        release_lock(zk, "authlab", OWNER)
    with cluster_session(inv, auth=None, timeout=5) as anon:  # an explicit auth replaces the connection's
        with pytest.raises(NoAuthError):
            anon.create(f"{LOCK_ROOT}/authlab", b"{}")


def test_connection_extras_and_sasl_plumbing() -> None:
    assert from_connection(None, None, {}, "c") is None
    assert from_connection("u", "p", {}, "c") == ZkAuth("digest", "u:p")
    assert from_connection("u", "p", {"auth_scheme": "none"}, "c") is None
    for login, password, extra in (("u", None, {}), ("u:x", "p", {}), (None, None, {"auth_scheme": "digest"})):
        with pytest.raises(ZkAuthError, match="Airflow connection c: digest"):
            from_connection(login, password, extra, "c")
    with pytest.raises(ZkAuthError, match="auth_scheme 'kerberos'"):
        from_connection("u", "p", {"auth_scheme": "kerberos"}, "c")
    sasl = from_connection("u", "p", {"auth_scheme": "sasl", "sasl_service": "zk"}, "c")
    assert sasl is not None and sasl.identity == "sasl:u"
    assert sasl.sasl_options == {"mechanism": "DIGEST-MD5", "username": "u", "password": "p", "service": "zk"}
    if importlib.util.find_spec("puresasl") is None:  # kazoo's SASL would fail only once connecting
        with pytest.raises(ZkAuthError, match="pure-sasl"):
            sasl.kazoo_options()
    else:
        assert sasl.kazoo_options() == {"sasl_options": dict(sasl.sasl_options)}
    assert {(a.perms, a.id.scheme, a.id.id) for a in sasl.acl()} == {
        (Permissions.ALL, "sasl", "u"),
        (Permissions.READ, "world", "anyone"),
    }
    gss = from_connection(
        None, None, {"auth_scheme": "sasl", "sasl_mechanism": "gssapi", "sasl_principal": "fd@R"}, "c"
    )
    assert gss is not None and gss.sasl_options == {"mechanism": "GSSAPI", "principal": "fd@R"}
    with pytest.raises(ZkAuthError, match="GSSAPI needs"):
        from_connection(None, None, {"auth_scheme": "sasl", "sasl_mechanism": "GSSAPI"}, "c")


@pytest.mark.live  # starts its own ZooKeeper server
def test_audit_reads_zookeeper_with_the_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ZooKeeper that refuses unauthenticated clients (enforce.auth.enabled): discover and the audit's snapshot
    get through with the cluster's credentials, and fail without them."""
    with ZooKeeperServer(tmp_path / "zk", enforce_auth=True) as server:
        _kafka_znodes(server, "/kafka")
        inv = _inv(server, "/kafka", "enforced")
        store = Settings(inventory=tmp_path / "inv.json", data_root=tmp_path / "data").store
        without = steps.discover(inv, timeout=3)
        assert without["zookeeper_error"] and without["registered"] == []
        with pytest.raises(OSError):
            steps.snapshot_zookeeper(inv.zookeeper, store, "anon/zk.jsonl", timeout=3)
        conn = {"conn_type": "generic", "login": "fleet-doctor", "password": "doctor-secret"}
        monkeypatch.setenv("AIRFLOW_CONN_KAFKA_ZK_ENFORCED", json.dumps(conn))
        found = steps.discover(inv)
        assert found["zookeeper_error"] is None and found["registered"] == [1]
        n = steps.snapshot_zookeeper(inv.zookeeper, store, "run/zk.jsonl", auth=credentials(inv))
        records = store.read_jsonl("run/zk.jsonl")
        assert n == len(records) and any(r.get("topic") == "t" for r in records)


def _open_chroot(server: ZooKeeperServer, chroot: str, cluster_id: str | None = "MkU3OEVBNTcwNTJENDM2Qg") -> str:
    """An open chroot for the product's lock, with Kafka's /cluster/id (``cluster_id`` None: none)."""
    with session(server.connect) as zk:
        zk.ensure_path(chroot)
        if cluster_id and not zk.exists(f"{chroot}/cluster/id"):
            zk.create(f"{chroot}/cluster/id", json.dumps({"version": "1", "id": cluster_id}).encode(), makepath=True)
    return chroot


def _expire(server: ZooKeeperServer, zk: Any) -> None:
    """Expire ``zk``'s session as a partition longer than its timeout does, and wait for kazoo's new session."""
    zk_session.expire(server.connect, zk)


def test_a_lock_whose_session_expired_is_not_released_through_the_new_one(
    server: ZooKeeperServer, tmp_path: Path
) -> None:
    """Issue 28 item 4: the session the lock was taken in expires while the repair waits (kazoo reconnects with a new
    one); at the end the worker leaves the lock alone instead of deleting it through the new session. The fleet
    page's mirror (``lock_state``) says so too: executing while it held the lock, left for a person after."""
    inv = _inv(server, "/fence-a", "expiring")
    report: dict[str, Any] = {}
    mirror = Store(tmp_path)
    with session(server.connect + _open_chroot(server, "/fence-a"), auth=DOCTOR) as zk:
        with holding(zk, inv, OWNER, report, mirror=mirror):
            executing = lock_state.read(mirror)
            assert executing is not None and executing.state == "held" and executing.worker_alive
            _expire(server, zk)
        assert report["lock_released"] is False and "lost its ZooKeeper session" in report["lock_kept"]
        assert lock_holder(zk, report["lock"]) is not None  # still there for a human (docs/repair.md)
        assert zk.exists(f"{ACTIVE_ROOT}/{report['lock']}") is None  # the dead session's liveness node went with it
        left = lock_state.read(mirror)
        assert left is not None and left.state == "needs-human" and left.seen_by == "repair"
        assert left.zxid is not None and executing.zxid is not None and left.zxid > executing.zxid


def test_a_session_lost_inside_the_act_is_a_fallen_fence(server: ZooKeeperServer) -> None:
    """kazoo's SessionExpiredError out of the act (a ZooKeeper read in a wait) is the fence falling: FenceLost, and
    the lock is left alone."""
    from kazoo.exceptions import SessionExpiredError

    inv = _inv(server, "/fence-b", "expired-in-act")
    report: dict[str, Any] = {}
    with session(server.connect + _open_chroot(server, "/fence-b"), auth=DOCTOR) as zk:
        with pytest.raises(FenceLost), holding(zk, inv, OWNER, report):
            _expire(server, zk)
            raise SessionExpiredError()
        assert lock_holder(zk, report["lock"]) is not None and report["lock_released"] is False


def test_the_lock_is_keyed_by_the_clusters_id_and_refuses_another_cluster(server: ZooKeeperServer) -> None:
    """Issue 28 item 7: two inventories naming one Kafka cluster differently take one lock (its /cluster/id); an
    inventory or a plan whose cluster id is not the live one is refused before anything is locked."""
    chroot = _open_chroot(server, "/keyed", cluster_id=None)
    live = "MkU3OEVBNTcwNTJENDM2Qg"
    with session(server.connect + chroot, auth=DOCTOR) as zk:
        assert zk.exists("/cluster/id") is None
        with (
            pytest.raises(RepairError, match=r"holds no /cluster/id"),
            holding(zk, _inv(server, chroot, "a"), OWNER, {}),
        ):
            pass
        zk.create("/cluster/id", json.dumps({"version": "1", "id": live}).encode(), makepath=True)
        other = dataclasses.replace(_inv(server, chroot, "b"), cluster_id="AAAAAAAAAAAAAAAAAAAAAA")
        with pytest.raises(RepairError, match=r"names cluster id AAAA.*holds MkU3"), holding(zk, other, OWNER, {}):
            pass
        with pytest.raises(RepairError, match=r"plan was made on cluster id BBBB.*now holds MkU3"):
            with holding(zk, _inv(server, chroot, "a"), OWNER, {}, cluster_id="B" * 22):
                pass
        assert lock_holder(zk, live) is None
        report: dict[str, Any] = {}
        with holding(zk, _inv(server, chroot, "prod-eu"), OWNER, report):
            assert lock_holder(zk, live)["cluster"] == "prod-eu" and report["lock"] == live
            with session(server.connect + chroot, auth=DOCTOR) as second:  # another inventory, the same cluster
                same = dataclasses.replace(_inv(server, chroot, "kafka-main"), cluster_id=live)
                with pytest.raises(LockHeld, match="locked by another repair"):
                    with holding(second, same, {**OWNER, "plan_hash": "b" * 64}, {}):
                        pass
        assert lock_holder(zk, live) is None


def test_a_repair_refuses_an_anonymous_zookeeper_session_unless_the_inventory_says_so(
    server: ZooKeeperServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 28 item 9: without credentials a repair would write its lock (and Kafka's znodes) anonymously, in open
    znodes, silently. It refuses before connecting, unless the inventory says an anonymous session is meant."""
    from fleet_doctor.repair.session import cluster_lock

    chroot = _open_chroot(server, "/anonymous")
    inv = _inv(server, chroot, "anon")
    monkeypatch.delenv("AIRFLOW_CONN_KAFKA_ZK_ANON", raising=False)
    report: dict[str, Any] = {}
    with pytest.raises(RepairError, match=r"no ZooKeeper identity .*kafka_zk_anon.*allow_anonymous_zookeeper"):
        with cluster_lock(inv, OWNER, report, tmp_path / "result.json"):
            pass
    with session(server.connect + chroot) as zk:
        assert zk.exists(LOCK_PARENT) is None  # refused before anything was written
    allowed = dataclasses.replace(inv, allow_anonymous_zookeeper=True)
    with cluster_lock(allowed, OWNER, report, tmp_path / "result.json") as lock:
        assert lock_holder(lock.zk, lock.key)["cluster"] == "anon"
    conn = {"conn_type": "generic", "host": "127.0.0.1", "port": server.port, "login": "fleet-doctor"}
    conn |= {"password": "doctor-secret", "extra": {"connect": inv.zookeeper}}
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_ZK_ANON", json.dumps(conn))
    with cluster_lock(inv, OWNER, report, tmp_path / "result.json") as lock:  # an identity: no flag needed
        assert _acl(lock.zk, f"{LOCK_ROOT}/{lock.key}") == DOCTOR_ACL
    assert json.loads((tmp_path / "result.json").read_text())["lock_released"] is True


def test_tls_options_from_the_connection() -> None:
    """Issue 28 item 9: ZooKeeper's secure client port through kazoo's TLS options, from the connection's extras."""
    from fleet_doctor.zookeeper.auth import tls_from_extra

    assert tls_from_extra({}, "c") == {}
    extra = {"use_ssl": True, "ca": "/etc/zk/ca.pem", "certfile": "/etc/zk/me.pem", "keyfile": "/etc/zk/me.key"}
    assert tls_from_extra(extra, "c") == {**extra, "verify_certs": True}
    assert tls_from_extra({"use_ssl": True, "verify_certs": False}, "c") == {"use_ssl": True, "verify_certs": False}
    with pytest.raises(ZkAuthError, match="use_ssl needs the ca"):
        tls_from_extra({"use_ssl": True}, "c")
    with pytest.raises(ZkAuthError, match="TLS files are set but use_ssl is not"):
        tls_from_extra({"ca": "/etc/zk/ca.pem"}, "c")
