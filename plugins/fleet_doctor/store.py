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
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import SplitResult, urlsplit

S3_SCHEMES = ("s3a", "s3")
REMOTE_SCHEMES = (*S3_SCHEMES, "hdfs")


class StoreError(RuntimeError):
    """The store could not be reached or an object in it could not be read or written (the message names it)."""


def temporary_name(name: str) -> str:
    """The name an object or file is written under before it is moved into place: hidden (readers skip names that
    start with ``.``) and unique (two writers of one key never share it)."""
    return f".{name}.{uuid.uuid4().hex}.tmp"


@contextmanager
def atomic_file(
    path: str | os.PathLike[str], temp_name: str | None = None, mode: int | None = None
) -> Iterator[BinaryIO]:
    """A local file written atomically: a temporary file in the same directory, fsync'd and renamed over ``path``
    only if the block exits without an exception (else removed). The temporary file has a unique hidden name unless
    ``temp_name`` gives one (the fleet lab writes Kafka's own ``<name>.tmp``, as a broker does). The file gets
    ``mode`` (default 0666) less the umask, as ``open`` gives it."""
    target = os.path.abspath(path)
    tmp = os.path.join(os.path.dirname(target), temp_name or temporary_name(os.path.basename(target)))
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if temp_name else os.O_EXCL)
    fd = os.open(tmp, flags, 0o666 if mode is None else mode)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_atomic(
    path: str | os.PathLike[str], data: bytes, temp_name: str | None = None, mode: int | None = None
) -> None:
    """``data`` written to the local file ``path`` through ``atomic_file``."""
    with atomic_file(path, temp_name, mode) as f:
        f.write(data)


def s3_endpoint(environ: Mapping[str, str]) -> SplitResult | None:
    """FLEET_DOCTOR_S3_ENDPOINT (or AWS_ENDPOINT_URL), https:// when it names no scheme."""
    text = environ.get("FLEET_DOCTOR_S3_ENDPOINT") or environ.get("AWS_ENDPOINT_URL")
    return urlsplit(text if "://" in text else f"https://{text}") if text else None


def s3_region(environ: Mapping[str, str]) -> str | None:
    return environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or None


class Store:
    """One data root. ``Store("/var/lib/fleet-doctor")``, ``Store("s3a://bucket/fleet-doctor")``."""

    def __init__(self, root: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        text = os.fspath(root)
        if text.startswith("file://"):
            text = text.removeprefix("file://")
        parts = urlsplit(text)
        self.scheme = parts.scheme.lower() if "://" in text else ""
        if self.scheme and self.scheme not in REMOTE_SCHEMES:
            raise StoreError(f"{text}: unsupported store (use a local path, s3a://, s3:// or hdfs://)")
        if parts.username or parts.password:
            raise StoreError(
                f"{self.scheme}://{parts.hostname}/...: no credentials in the store URL (use AWS_* variables)"
            )
        self._env = dict(env)
        self._fs: Any = None  # opened on first use: building the URLs (DAG parsing) touches no network
        self._netloc = parts.netloc
        if not self.scheme:
            self.base = str(Path(text).resolve())
            self.root = self.base
        elif self.scheme in S3_SCHEMES:
            bucket, prefix = parts.netloc, parts.path.strip("/")
            if not bucket:
                raise StoreError(f"{text}: no bucket in the store URL")
            self.bucket = bucket
            self.base = f"{bucket}/{prefix}".rstrip("/")
            self.root = f"s3a://{self.base}"  # Hadoop's S3 filesystem: what Spark reads
        else:
            self.base = "/" + parts.path.strip("/")
            self.root = f"hdfs://{parts.netloc}{self.base.rstrip('/')}"

    @property
    def fs(self) -> Any:
        """The pyarrow filesystem (S3: credentials, endpoint and region from the environment)."""
        if self._fs is not None:
            return self._fs
        from pyarrow import fs

        env = self._env
        if not self.scheme:
            self._fs = fs.LocalFileSystem()
        elif self.scheme in S3_SCHEMES:
            endpoint = s3_endpoint(env)
            region = s3_region(env)
            if region is None and endpoint is None:
                try:  # AWS itself: the bucket's own region (a wrong one fails every request with a redirect)
                    region = fs.resolve_s3_region(self.bucket)
                except (OSError, ValueError):
                    region = None
            opts: dict[str, Any] = {"region": region or "us-east-1", "connect_timeout": 10, "request_timeout": 120}
            if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
                opts.update(access_key=env["AWS_ACCESS_KEY_ID"], secret_key=env["AWS_SECRET_ACCESS_KEY"])
                if env.get("AWS_SESSION_TOKEN"):
                    opts["session_token"] = env["AWS_SESSION_TOKEN"]
            if endpoint:
                opts.update(endpoint_override=endpoint.netloc, scheme=endpoint.scheme, force_virtual_addressing=False)
            self._fs = fs.S3FileSystem(**opts)
        else:  # hdfs: pyarrow's client needs libhdfs (the Hadoop native library) and a JVM on this host
            try:
                self._fs = fs.HadoopFileSystem.from_uri(f"hdfs://{self._netloc}")
            except Exception as e:
                raise StoreError(f"{self.root}: cannot open HDFS from Python ({type(e).__name__}: {e})") from e
        return self._fs

    def __repr__(self) -> str:
        return f"Store({self.root!r})"

    def sub(self, prefix: str) -> Store:
        """The store rooted at ``prefix`` inside this one (same settings, same connection)."""
        child = Store(self._path(prefix) if self.is_local else self.url(prefix), self._env)
        child._fs = self._fs
        return child

    @property
    def is_local(self) -> bool:
        return not self.scheme

    def _path(self, key: str) -> str:
        key = key.strip("/")
        if ".." in key.split("/"):
            raise StoreError(f"{key}: '..' is not allowed in a store key")
        return f"{self.base.rstrip('/')}/{key}" if key else self.base

    def url(self, key: str = "") -> str:
        """The object's URL for Spark and for people (a plain path for a local store)."""
        key = key.strip("/")
        return f"{self.root}/{key}" if key else self.root

    def _call(self, what: str, key: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except (OSError, ValueError) as e:  # pyarrow raises OSError subclasses; ArrowInvalid is a ValueError
            raise StoreError(f"{self.url(key)}: {what} failed: {e}") from e

    def check(self) -> None:
        """Fail early, naming the store, when it cannot be reached or its bucket does not exist (S3)."""
        from pyarrow import fs

        if self.scheme in S3_SCHEMES:
            info = self._call("stat of the bucket", "", self.fs.get_file_info, self.bucket)
            if info.type == fs.FileType.NotFound:
                raise StoreError(f"{self.root}: bucket {self.bucket!r} does not exist")
        else:
            self._call("list", "", self.fs.get_file_info, fs.FileSelector(self.base, allow_not_found=True))

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

    def _listed(self, key: str) -> dict[str, Any]:
        """Every file under ``key`` in one listing (S3: one paginated list, however many objects), by its key
        relative to ``key``, with its pyarrow ``FileInfo``; temporary objects left out."""
        from pyarrow import fs

        base = self._path(key)
        selector = fs.FileSelector(base, recursive=True, allow_not_found=True)
        infos = self._call("list", key, self.fs.get_file_info, selector)
        rel = ((i.path[len(base) :].lstrip("/"), i) for i in infos if i.type == fs.FileType.File)
        return {r: i for r, i in rel if not any(part.startswith(".") for part in r.split("/"))}

    def files(self, key: str = "") -> list[str]:
        """Every file under ``key``, as keys relative to it, in one listing; temporary objects left out."""
        return sorted(self._listed(key))

    def size(self, key: str = "") -> int | None:
        """The bytes of the object at ``key``, or of every object under it (a stat, then one listing as ``files``;
        temporary objects left out); None when there is nothing there."""
        from pyarrow import fs

        info = self._call("stat", key, self.fs.get_file_info, self._path(key))
        if info.type == fs.FileType.File:
            return int(info.size)
        if info.type != fs.FileType.Directory:
            return None
        return sum(int(i.size) for i in self._listed(key).values())

    def _open(self, key: str) -> Any:
        """An input stream, or None when the object does not exist (one request: no stat first)."""
        try:
            return self.fs.open_input_stream(self._path(key), None)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise StoreError(f"{self.url(key)}: open failed: {e}") from e

    def read_bytes(self, key: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        stream = self._open(key)
        if stream is None:
            return None
        with stream as f:
            return self._call("read", key, f.read)

    def read_text(self, key: str) -> str | None:
        data = self.read_bytes(key)
        return None if data is None else self._call("decode (UTF-8)", key, data.decode, "utf-8")

    def read_json(self, key: str) -> Any:
        """The JSON document at ``key``, or None when it does not exist."""
        text = self.read_text(key)
        return None if text is None else self._call("parse (JSON)", key, json.loads, text)

    def read_jsonl(self, key: str) -> list[dict[str, Any]]:
        """Every record of a JSON Lines object, gzip'd (``.gz``) or not, read as a stream; [] when it does not
        exist."""
        stream = self._open(key)
        if stream is None:
            return []
        records: list[dict[str, Any]] = []
        line_no = 0
        with stream as raw:
            try:
                binary: Any = gzip.GzipFile(fileobj=raw) if key.endswith(".gz") else raw
                for line in io.TextIOWrapper(binary, encoding="utf-8"):
                    if line.strip():
                        records.append(json.loads(line))
                    line_no += 1
            except (OSError, EOFError, ValueError) as e:  # gzip, UTF-8 and JSON errors
                raise StoreError(f"{self.url(key)}: not JSON Lines (line {line_no + 1}): {e}") from e
        return records

    # ---- writing (atomic)
    @contextmanager
    def writer(self, key: str) -> Iterator[BinaryIO]:
        """A binary stream whose bytes appear at ``key`` only if the block exits without an exception. The
        temporary object's name is unique (two attempts of one task, on different workers, never share it)."""
        final = self._path(key)
        if self.is_local:
            try:
                os.makedirs(os.path.dirname(final), exist_ok=True)
                with atomic_file(final) as f:
                    yield f
            except OSError as e:
                raise StoreError(f"{self.url(key)}: write failed: {e}") from e
            return
        parent, _, name = final.rpartition("/")
        tmp = f"{parent}/{temporary_name(name)}"
        stream = self._call("open for writing", key, self.fs.open_output_stream, tmp, None)
        committed = False
        try:
            yield stream
            self._call("upload", key, stream.close)  # S3: the multipart upload completes here
            self._call("move into place", key, self.fs.move, tmp, final)
            committed = True
        finally:
            if not committed:
                if not stream.closed:
                    try:
                        stream.close()
                    except OSError:
                        pass
                try:
                    self.fs.delete_file(tmp)
                except OSError:
                    pass

    def delete(self, key: str) -> None:
        """Remove the object at ``key``; nothing happens when there is none."""
        try:
            self.fs.delete_file(self._path(key))
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as e:
            raise StoreError(f"{self.url(key)}: delete failed: {e}") from e

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
        region = s3_region(self._env)
        conf = {"spark.hadoop.fs.s3a.endpoint.region": region} if region else {}
        endpoint = s3_endpoint(self._env)
        if endpoint:
            conf.update(
                {
                    "spark.hadoop.fs.s3a.endpoint": f"{endpoint.scheme}://{endpoint.netloc}",
                    "spark.hadoop.fs.s3a.path.style.access": "true",
                    "spark.hadoop.fs.s3a.connection.ssl.enabled": str(endpoint.scheme == "https").lower(),
                }
            )
        return conf
