"""The audit's data store: a local directory or a remote filesystem (``s3a://``/``s3://``, ``hdfs://``).

Everything the audit keeps (staged probe output, the ZooKeeper snapshot, findings, history, reports) lives under
one root, ``FLEET_DOCTOR_DATA``. The Python side (the Airflow tasks) reaches it through ``pyarrow.fs``; Spark reaches
the same objects through Hadoop's filesystems (``url`` gives the URL Spark reads, ``spark_conf`` the S3A settings).
Keys are ``/``-separated paths relative to the root.

Writes are atomic on every kind of store: an object is written under a temporary sibling name that starts with
``.`` (Spark and the readers here ignore such names) and moved into place only when it is complete; on S3 the
move is a server-side copy, so the final key never shows a partial object.

S3 settings come from the environment: the standard ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
``AWS_SESSION_TOKEN`` / ``AWS_REGION`` (unset: the SDK's default credential chain, e.g. an instance profile), and
``FLEET_DOCTOR_S3_ENDPOINT`` (or ``AWS_ENDPOINT_URL``) for an S3-compatible endpoint such as MinIO or Ceph RGW,
which also switches to path-style requests.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

S3_SCHEMES = ("s3a", "s3")
REMOTE_SCHEMES = (*S3_SCHEMES, "hdfs")


class StoreError(RuntimeError):
    """The store could not be reached or an object in it could not be read or written (the message names it)."""


def s3_endpoint(environ: Mapping[str, str]) -> str | None:
    return environ.get("FLEET_DOCTOR_S3_ENDPOINT") or environ.get("AWS_ENDPOINT_URL") or None


def s3_region(environ: Mapping[str, str]) -> str:
    return environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or "us-east-1"


class Store:
    """One data root. ``Store("/var/lib/fleet-doctor")``, ``Store("s3a://bucket/fleet-doctor")``."""

    def __init__(self, root: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        text = os.fspath(root)
        parts = urlsplit(text)
        self.scheme = parts.scheme.lower() if "://" in text else ""
        if self.scheme and self.scheme not in REMOTE_SCHEMES:
            raise StoreError(f"{text}: unsupported store (use a local path, s3a://, s3:// or hdfs://)")
        self._env = dict(env)
        if not self.scheme:
            from pyarrow import fs

            self.fs: Any = fs.LocalFileSystem()
            self.base = str(Path(text).resolve())
            self.root = self.base
        elif self.scheme in S3_SCHEMES:
            from pyarrow import fs

            bucket, prefix = parts.netloc, parts.path.strip("/")
            if not bucket:
                raise StoreError(f"{text}: no bucket in the store URL")
            endpoint = s3_endpoint(env)
            opts: dict[str, Any] = {"region": s3_region(env), "connect_timeout": 10, "request_timeout": 120}
            if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
                opts.update(access_key=env["AWS_ACCESS_KEY_ID"], secret_key=env["AWS_SECRET_ACCESS_KEY"])
                if env.get("AWS_SESSION_TOKEN"):
                    opts["session_token"] = env["AWS_SESSION_TOKEN"]
            if endpoint:
                ep = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
                opts.update(endpoint_override=ep.netloc, scheme=ep.scheme, force_virtual_addressing=False)
            self.fs = fs.S3FileSystem(**opts)
            self.base = f"{bucket}/{prefix}".rstrip("/")
            self.root = f"s3a://{self.base}"  # Hadoop's S3 filesystem: what Spark reads
        else:  # hdfs: pyarrow's client needs libhdfs (the Hadoop native library) and a JVM on this host
            from pyarrow import fs

            try:
                self.fs = fs.HadoopFileSystem.from_uri(f"{parts.scheme}://{parts.netloc}")
            except Exception as e:
                raise StoreError(f"{text}: cannot open HDFS from Python ({type(e).__name__}: {e})") from e
            self.base = "/" + parts.path.strip("/")
            self.root = f"hdfs://{parts.netloc}{self.base}".rstrip("/")

    def __repr__(self) -> str:
        return f"Store({self.root!r})"

    @property
    def is_local(self) -> bool:
        return not self.scheme

    def _path(self, key: str) -> str:
        key = key.strip("/")
        if ".." in key.split("/"):
            raise StoreError(f"{key}: '..' is not allowed in a store key")
        return f"{self.base}/{key}" if key else self.base

    def url(self, key: str = "") -> str:
        """The object's URL for Spark and for people (a plain path for a local store)."""
        key = key.strip("/")
        return f"{self.root}/{key}" if key else self.root

    def _call(self, what: str, key: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except (OSError, ValueError) as e:  # pyarrow raises OSError subclasses; ArrowInvalid is a ValueError
            raise StoreError(f"{self.url(key)}: {what} failed: {e}") from e

    # ---- reading
    def is_file(self, key: str) -> bool:
        from pyarrow import fs

        info = self._call("stat", key, self.fs.get_file_info, self._path(key))
        return info.type == fs.FileType.File

    def list(self, key: str = "") -> list[str]:
        """Names of the entries directly under ``key`` ([] when there is none), temporary objects left out."""
        from pyarrow import fs

        selector = fs.FileSelector(self._path(key), recursive=False, allow_not_found=True)
        infos = self._call("list", key, self.fs.get_file_info, selector)
        return sorted(i.base_name for i in infos if not i.base_name.startswith("."))

    def read_bytes(self, key: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        if not self.is_file(key):
            return None
        with self._call("open", key, self.fs.open_input_stream, self._path(key), None) as f:
            return self._call("read", key, f.read)

    def read_text(self, key: str) -> str | None:
        data = self.read_bytes(key)
        return None if data is None else data.decode("utf-8")

    def read_jsonl(self, key: str) -> list[dict[str, Any]]:
        """Every record of a JSON Lines object, gzip'd (``.gz``) or not; [] when it does not exist."""
        data = self.read_bytes(key)
        if data is None:
            return []
        try:
            if key.endswith(".gz"):
                data = gzip.decompress(data)
            return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
        except (OSError, EOFError, ValueError) as e:
            raise StoreError(f"{self.url(key)}: not JSON Lines: {e}") from e

    # ---- writing (atomic)
    @contextmanager
    def writer(self, key: str) -> Iterator[BinaryIO]:
        """A binary stream whose bytes appear at ``key`` only if the block exits without an exception."""
        final = self._path(key)
        parent, _, name = final.rpartition("/")
        tmp = f"{parent}/.{name}.{os.getpid()}.tmp"
        if self.is_local:
            self._call("mkdir", key, lambda: self.fs.create_dir(parent, recursive=True))
        stream = self._call("open for writing", key, self.fs.open_output_stream, tmp, None)
        committed = False
        try:
            yield stream
            stream.close()
            if self.is_local:
                os.replace(tmp, final)  # atomic and overwrites, with the file's data flushed by close
            else:
                self._call("move into place", key, self.fs.move, tmp, final)
            committed = True
        finally:
            if not committed:
                if not stream.closed:
                    stream.close()
                try:
                    self.fs.delete_file(tmp)
                except OSError:
                    pass

    def write_bytes(self, key: str, data: bytes) -> None:
        with self.writer(key) as out:
            out.write(data)

    def write_text(self, key: str, text: str) -> None:
        self.write_bytes(key, text.encode("utf-8"))

    def write_jsonl(self, key: str, records: Iterable[dict[str, Any]]) -> None:
        buf = io.StringIO()
        for r in records:
            buf.write(json.dumps(r) + "\n")
        self.write_text(key, buf.getvalue())

    # ---- Spark
    def spark_conf(self) -> dict[str, str]:
        """Spark settings that point Hadoop's S3A filesystem at this store's endpoint (nothing for other stores).
        Credentials are not put on the command line: Spark copies AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
        AWS_SESSION_TOKEN from spark-submit's environment into the S3A settings itself."""
        if self.scheme not in S3_SCHEMES:
            return {}
        conf = {"spark.hadoop.fs.s3a.endpoint.region": s3_region(self._env)}
        endpoint = s3_endpoint(self._env)
        if endpoint:
            ep = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
            conf.update(
                {
                    "spark.hadoop.fs.s3a.endpoint": f"{ep.scheme}://{ep.netloc}",
                    "spark.hadoop.fs.s3a.path.style.access": "true",
                    "spark.hadoop.fs.s3a.connection.ssl.enabled": str(ep.scheme == "https").lower(),
                }
            )
        return conf
