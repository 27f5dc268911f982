"""Spark's own authentication for a standalone cluster (``spark.authenticate``): one shared secret, kept in a file.

Without it any local process can submit an application to the master (running as the containers' user, with the
store writable) or kill one. Spark standalone takes the secret from its configuration only (a file is for
Kubernetes: ``SecurityManager.initializeAuth``), so it never goes on a command line (``/proc/<pid>/cmdline`` is
readable by every local user):

- a daemon (master, worker) reads it from its environment, Spark's ``_SPARK_AUTH_SECRET``
  (``SecurityManager.getSecretKey``), which ``python -m fleet_doctor.spark_auth <spark-class arguments>`` fills
  from ``FLEET_DOCTOR_SPARK_SECRET_FILE`` before it becomes ``spark-class`` (``/proc/<pid>/environ`` is the owner's
  alone); a worker hands it on to its executors the same way;
- a driver (the detect task's spark-submit) reads it from a properties file (``--properties-file``) written from
  the same file into the private Spark cache dir, mode 0600; ``spark.authenticate`` itself is an ordinary setting.

docker/README.md ("Secrets") says how to make the file; the daemons also turn off the web UI's kill links.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

SECRET_FILE_ENV = "FLEET_DOCTOR_SPARK_SECRET_FILE"
DAEMON_SECRET_ENV = "_SPARK_AUTH_SECRET"  # Spark's SecurityManager.ENV_AUTH_SECRET
AUTH_CONF = {"spark.authenticate": "true"}
MIN_LENGTH = 32
_ALLOWED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~+/=")


class SparkAuthError(ValueError):
    """The secret file is missing, unreadable or unfit (the message names the file, never the secret)."""


def read_secret(path: str | os.PathLike[str]) -> str:
    """The secret in ``path`` (one line; a trailing newline dropped): at least 32 characters of base64 / URL-safe
    text (``secrets.token_urlsafe(32)``), nothing a properties file would read differently."""
    try:
        text = Path(path).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as e:
        raise SparkAuthError(f"the Spark secret file {path} cannot be read: {e}") from e
    secret = text[:-1] if text.endswith("\n") else text
    if len(secret) < MIN_LENGTH or not set(secret) <= _ALLOWED:
        raise SparkAuthError(
            f"the Spark secret file {path} must hold one line of at least {MIN_LENGTH} characters of "
            "[A-Za-z0-9-_.~+/=] (python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return secret


ROTATED_KEEP_S = 600.0  # another secret's properties file unused this long is removed


def properties_file(secret_file: str | os.PathLike[str], directory: Path) -> Path:
    """A Spark properties file (``--properties-file``) with ``spark.authenticate`` and its secret, in ``directory``
    (a private one: ``spark.cache_dir()``), mode 0600, named by a digest of the secret (written once per secret)."""
    secret = read_secret(secret_file)
    path = directory / f"spark-auth-{hashlib.sha256(secret.encode()).hexdigest()[:16]}.properties"
    if not path.is_file():
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(f"spark.authenticate=true\nspark.authenticate.secret={secret}\n")
        os.replace(tmp, path)
    else:
        os.utime(path)  # in use: another secret's writer leaves it
    # a rotated secret is not kept, once no submit can still be about to read it (another process of this user may
    # submit with another secret right now: another cluster, or the old secret during a rotation)
    now = time.time()
    for old in directory.glob("spark-auth-*.properties"):
        with contextlib.suppress(OSError):
            if old != path and now - old.stat().st_mtime > ROTATED_KEEP_S:
                old.unlink()
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fleet_doctor.spark_auth <spark-class arguments>``: spark-class (a master or a worker) with the
    secret of ``$FLEET_DOCTOR_SPARK_SECRET_FILE`` in its environment; exit 2 naming the file when it is unfit."""
    args = list(sys.argv[1:] if argv is None else argv)
    secret_file = os.environ.get(SECRET_FILE_ENV)
    spark_class = shutil.which("spark-class")
    if not args or not secret_file or spark_class is None:
        print(
            f"usage: {SECRET_FILE_ENV}=FILE python -m fleet_doctor.spark_auth CLASS [ARGS...] (spark-class on PATH)",
            file=sys.stderr,
        )
        return 2
    try:
        secret = read_secret(secret_file)
    except SparkAuthError as e:
        print(f"fleet_doctor.spark_auth: {e}", file=sys.stderr)
        return 2
    os.execve(spark_class, [spark_class, *args], {**os.environ, DAEMON_SECRET_ENV: secret})
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
