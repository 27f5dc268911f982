"""Who Fleet Doctor is to ZooKeeper: the credentials of the Airflow connection ``kafka_zk_<cluster>`` and the ACL
of the znodes it creates (the repair lock).

The connection's ``login`` / ``password`` and its extra ``auth_scheme`` (docs/inventory.md):

- ``digest`` (the default when a login is set): ZooKeeper's built-in ``DigestAuthenticationProvider``, the scheme
  Kafka's own ``zookeeper.set.acl`` ACLs are usually granted to; the znodes Fleet Doctor creates get
  ``digest:<login>:<hash>`` ALL and ``world:anyone`` READ (an operator can always see who holds the lock).
- ``sasl``: kazoo's SASL (needs the ``pure-sasl`` package): ``sasl_mechanism`` (``DIGEST-MD5``, or ``GSSAPI`` with
  the process's Kerberos ticket), ``sasl_service``, ``sasl_principal``; created znodes get ``sasl:<id>`` ALL, the
  id being ``sasl_acl_id`` or else the login (or principal) as ZooKeeper's SASL provider names it.
- ``none``, or no login: no authentication (as before): created znodes are open (``world:anyone`` ALL).

Airflow is imported only inside ``credentials`` (DAG parsing and the tests without Airflow import this package).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SCHEMES = ("digest", "sasl")
SASL_MECHANISMS = ("DIGEST-MD5", "GSSAPI", "PLAIN")


class ZkAuthError(ValueError):
    """The ZooKeeper connection's credentials are incomplete or name an unknown scheme (the message says which)."""


@dataclass(frozen=True)
class ZkAuth:
    """One identity: ``scheme`` and ``credential`` as kazoo's ``add_auth`` takes them (digest: ``user:password``);
    for SASL the kazoo ``sasl_options`` and the id ZooKeeper's SASL provider gives the session."""

    scheme: str
    credential: str = field(repr=False)
    sasl_options: Mapping[str, str] = field(default_factory=dict, repr=False)
    sasl_id: str | None = None

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ZkAuthError(f"ZooKeeper auth scheme {self.scheme!r}: use one of {', '.join(SCHEMES)}")
        if self.scheme == "digest" and (":" not in self.credential or not self.credential.split(":", 1)[0]):
            raise ZkAuthError("ZooKeeper digest auth needs 'user:password' (a login without ':' and a password)")
        if self.scheme == "sasl" and not self.sasl_id:
            raise ZkAuthError("ZooKeeper SASL auth needs the id its ACL names (a login, principal or sasl_acl_id)")

    @property
    def user(self) -> str:
        return self.credential.split(":", 1)[0] if self.scheme == "digest" else str(self.sasl_id)

    @property
    def identity(self) -> str:
        """``scheme:user``: how the identity appears in ZooKeeper's ACLs (without the password's hash)."""
        return f"{self.scheme}:{self.user}"

    def kazoo_options(self) -> dict[str, Any]:
        """KazooClient keyword arguments that authenticate the session."""
        if self.scheme == "digest":
            return {"auth_data": [("digest", self.credential)]}
        try:
            import puresasl  # noqa: F401  (kazoo's SASL needs it, and only says so once connecting)
        except ImportError:
            raise ZkAuthError("ZooKeeper SASL auth needs the pure-sasl package (pip install pure-sasl)") from None
        return {"sasl_options": dict(self.sasl_options)}

    def acl(self) -> list[Any]:
        """The ACL of a znode Fleet Doctor creates: this identity may do anything, everyone else only read it."""
        from kazoo.security import make_acl, make_digest_acl

        if self.scheme == "digest":
            user, password = self.credential.split(":", 1)
            own = make_digest_acl(user, password, all=True)
        else:
            own = make_acl("sasl", str(self.sasl_id), all=True)
        return [own, make_acl("world", "anyone", read=True)]


def as_auth(auth: ZkAuth | tuple[str, str] | None) -> ZkAuth | None:
    """A ``ZkAuth`` from a ``(scheme, credential)`` pair (kazoo's ``auth_data`` form) or a ZkAuth."""
    if auth is None or isinstance(auth, ZkAuth):
        return auth
    scheme, credential = auth
    if scheme == "sasl":  # kazoo's legacy form: user:password with DIGEST-MD5
        user, _, password = credential.partition(":")
        opts = {"mechanism": "DIGEST-MD5", "username": user, "password": password}
        return ZkAuth("sasl", credential, opts, sasl_id=user)
    return ZkAuth(scheme, credential)


def from_connection(login: str | None, password: str | None, extra: Mapping[str, Any], conn_id: str) -> ZkAuth | None:
    """The identity an Airflow connection describes (module docstring), None for no authentication."""
    scheme = str(extra.get("auth_scheme") or ("digest" if login else "none")).lower()
    where = f"Airflow connection {conn_id}"
    if scheme == "none":
        return None
    if scheme == "digest":
        if not login or not password or ":" in login:
            raise ZkAuthError(f"{where}: digest auth needs a login (without ':') and a password")
        return ZkAuth("digest", f"{login}:{password}")
    if scheme == "sasl":
        mechanism = str(extra.get("sasl_mechanism") or "DIGEST-MD5").upper()
        if mechanism not in SASL_MECHANISMS:
            raise ZkAuthError(f"{where}: sasl_mechanism {mechanism!r}: use one of {', '.join(SASL_MECHANISMS)}")
        opts = {"mechanism": mechanism}
        if mechanism != "GSSAPI":
            if not login or not password:
                raise ZkAuthError(f"{where}: SASL {mechanism} needs a login and a password")
            opts.update(username=login, password=password)
        for key in ("service", "principal"):
            if extra.get(f"sasl_{key}"):
                opts[key] = str(extra[f"sasl_{key}"])
        sasl_id = extra.get("sasl_acl_id") or login or opts.get("principal")
        if not sasl_id:
            raise ZkAuthError(f"{where}: SASL GSSAPI needs sasl_principal or sasl_acl_id (the id the lock's ACL names)")
        return ZkAuth("sasl", f"{login or ''}:{password or ''}", opts, sasl_id=str(sasl_id))
    raise ZkAuthError(f"{where}: auth_scheme {scheme!r}: use digest, sasl or none")


TLS_FIELDS = ("ca", "certfile", "keyfile", "keyfile_password")


def tls_from_extra(extra: Mapping[str, Any], conn_id: str) -> dict[str, Any]:
    """kazoo's TLS keyword arguments from a connection's extras (``use_ssl``, ``ca``, ``certfile``, ``keyfile``,
    ``keyfile_password``, ``verify_certs``: ZooKeeper 3.5+'s secure client port); {} without ``use_ssl``."""
    if not extra.get("use_ssl"):
        if any(extra.get(k) for k in TLS_FIELDS):
            raise ZkAuthError(f"Airflow connection {conn_id}: TLS files are set but use_ssl is not: set use_ssl true")
        return {}
    opts: dict[str, Any] = {"use_ssl": True, "verify_certs": extra.get("verify_certs", True) is not False}
    opts.update({k: str(extra[k]) for k in TLS_FIELDS if extra.get(k)})
    if opts["verify_certs"] and "ca" not in opts:
        raise ZkAuthError(f"Airflow connection {conn_id}: use_ssl needs the ca that signed ZooKeeper's certificate")
    return opts


def tls(inv: Any) -> dict[str, Any]:
    """kazoo's TLS options for cluster ``inv`` from its connection ``kafka_zk_<cluster>`` (``tls_from_extra``); {}
    without Airflow or the connection."""
    conn = _connection(inv)
    return tls_from_extra(conn.extra_dejson or {}, conn.conn_id) if conn is not None else {}


def _connection(inv: Any) -> Any:
    conn_id = inv.zookeeper_connection_id if hasattr(inv, "zookeeper_connection_id") else f"kafka_zk_{inv}"
    try:
        from airflow.sdk import BaseHook
        from airflow.sdk.exceptions import AirflowNotFoundException
    except ImportError:
        return None
    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None


def credentials(inv: Any) -> ZkAuth | None:
    """The ZooKeeper identity of cluster ``inv`` (an Inventory, or a cluster name) from its Airflow connection
    ``kafka_zk_<cluster>``; None when Airflow is not installed or the connection does not exist (no
    authentication). Any other failure to read the connection (a secrets backend down) is raised: a repair must
    not fall back to creating open znodes."""
    conn = _connection(inv)
    if conn is None:
        return None
    return from_connection(conn.login, conn.password, conn.extra_dejson or {}, conn.conn_id)
