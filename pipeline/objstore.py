"""Where the tables and checkpoints live: a local folder, or ``s3://bucket/prefix`` on object storage.

Every file faultwatch itself reads or writes under ``storage.root`` or ``storage.checkpoint_root``
(Parquet data files, batch reports, markers) goes through the helpers here, and every ``deltalake``
call takes :func:`storage_options`. Local paths keep the plain ``pathlib``/``os`` calls (the job's
hot path on one machine); ``s3://`` goes through ``pyarrow.fs.S3FileSystem``, where a whole object
appears at once, so no write needs a rename. The S3 settings come from ``[storage.s3]`` or the
standard ``AWS_*`` environment variables, and reach the Spark executors' Python workers through
the environment (:data:`ENV_OPTIONS`).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from schemas.errors import FaultwatchError

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow.fs as pa_fs

    from pipeline.config import StorageConfig

__all__ = [
    "ENV_OPTIONS", "StorageError", "check_scheme", "configure", "exists", "filesystem", "hadoop_uri",
    "is_remote", "join", "list_names", "mtime_ns", "probe", "read_text", "remove", "remove_prefixed", "storage_options",
    "write_text",
]

# The resolved settings as JSON, for child processes (Spark's Python workers). "SECRET" in the name:
# Spark masks configuration values whose key matches spark.redaction.regex, in its UI and event logs.
ENV_OPTIONS = "FAULTWATCH_S3_SECRET_OPTIONS"
SCHEMES = ("s3",)  # besides local paths (no scheme, or file:)


class StorageError(FaultwatchError, RuntimeError):
    """Object storage cannot be reached or refuses faultwatch; the message names the setting."""


def is_remote(path: str) -> bool:
    """Whether ``path`` is on object storage (``s3://...``) rather than a local path."""
    return "://" in path and not path.startswith("file://")


def check_scheme(key: str, value: str) -> None:
    """Raise ``ValueError`` naming ``key`` when ``value`` is a URI of a scheme faultwatch cannot use."""
    scheme = urlparse(value).scheme if "://" in value else ""
    if scheme in ("", "file"):
        return
    if scheme not in SCHEMES:
        raise ValueError(f"{key}: scheme {scheme!r} of {value!r} is not supported; use a local path "
                         "or s3://bucket/prefix (S3 or an S3-compatible server, settings in [storage.s3])")
    if not urlparse(value).netloc:
        raise ValueError(f"{key}: {value!r} names no bucket; write s3://bucket/prefix")


def join(root: str, *parts: str) -> str:
    """``root/part/...``: a local path as ``pathlib`` joins it, a URI with ``/``."""
    if not is_remote(root):
        return str(Path(root, *parts))
    return "/".join([root.rstrip("/"), *(p.strip("/") for p in parts)])


# -- settings ---------------------------------------------------------------------------------------

_SETTINGS: dict[str, str] = {}


def configure(storage: StorageConfig, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Resolve ``[storage.s3]`` (falling back to ``AWS_*``) when a root is on S3, keep it for this
    process and its children; returns the ``deltalake`` storage options. Raises ``ValueError`` naming
    the missing key."""
    if not (is_remote(storage.root) or is_remote(storage.checkpoint_root)):
        return {}
    env = os.environ if env is None else env
    s3 = storage.s3

    def pick(value: str | None, key: str, *names: str, required: bool = True) -> str | None:
        if value:
            return value
        for name in names:
            if env.get(name):
                return env[name]
        if required:
            raise ValueError(f"storage.s3.{key} is not set (nor {' or '.join(names)}), and storage.root or "
                             "storage.checkpoint_root is on S3: set it in [storage.s3] or the environment")
        return None

    secret = s3.secret_access_key.value if s3.secret_access_key is not None else None
    options = {
        "AWS_ACCESS_KEY_ID": pick(s3.access_key_id, "access_key_id", "AWS_ACCESS_KEY_ID"),
        "AWS_SECRET_ACCESS_KEY": pick(secret, "secret_access_key", "AWS_SECRET_ACCESS_KEY"),
        "AWS_REGION": pick(s3.region, "region", "AWS_REGION", "AWS_DEFAULT_REGION"),
    }
    endpoint = pick(s3.endpoint, "endpoint", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", required=False)
    if endpoint:
        if urlparse(endpoint).scheme not in ("http", "https") or not urlparse(endpoint).netloc:
            raise ValueError(f"storage.s3.endpoint: {endpoint!r} is not an http(s) URL such as http://host:9000")
        options["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    token = env.get("AWS_SESSION_TOKEN")
    if token:
        options["AWS_SESSION_TOKEN"] = token
    # A commit is a put of the next log file that must fail if it exists ("If-None-Match: *"): without
    # it two writers of one table could both take the same version.
    options["conditional_put"] = s3.conditional_put
    resolved = {k: v for k, v in options.items() if v}
    _SETTINGS.clear()
    _SETTINGS.update(resolved)
    os.environ[ENV_OPTIONS] = json.dumps(resolved)
    _s3_filesystem.cache_clear()
    return dict(resolved)


def _settings() -> dict[str, str]:
    if not _SETTINGS and os.environ.get(ENV_OPTIONS):
        _SETTINGS.update(json.loads(os.environ[ENV_OPTIONS]))
    return _SETTINGS


def storage_options(uri: str) -> dict[str, str] | None:
    """The ``storage_options`` of a ``deltalake`` call on ``uri``: None for a local path."""
    if not is_remote(uri):
        return None
    settings = _settings()
    if not settings:
        raise StorageError(f"{uri} is on S3, but no S3 settings were loaded: set [storage.s3] (or the "
                           "AWS_* environment variables) and load the config with pipeline.config.load_config")
    return dict(settings)


@functools.cache
def _s3_filesystem(frozen: tuple[tuple[str, str], ...]) -> pa_fs.FileSystem:
    import pyarrow.fs as pa_fs

    o = dict(frozen)
    endpoint = o.get("AWS_ENDPOINT_URL")
    parsed = urlparse(endpoint) if endpoint else None
    return pa_fs.S3FileSystem(
        access_key=o.get("AWS_ACCESS_KEY_ID"), secret_key=o.get("AWS_SECRET_ACCESS_KEY"),
        session_token=o.get("AWS_SESSION_TOKEN"), region=o.get("AWS_REGION"),
        endpoint_override=parsed.netloc if parsed else None, scheme=parsed.scheme if parsed else "https",
        connect_timeout=5.0, request_timeout=30.0,
        retry_strategy=pa_fs.AwsStandardS3RetryStrategy(max_attempts=4),
    )


def filesystem(uri: str) -> tuple[pa_fs.FileSystem, str]:
    """A pyarrow filesystem for ``uri`` and the path on it (``bucket/key`` on S3)."""
    import pyarrow.fs as pa_fs

    if not is_remote(uri):
        return pa_fs.LocalFileSystem(), str(Path(uri.removeprefix("file://")).resolve())
    parsed = urlparse(uri)
    if parsed.scheme not in SCHEMES:
        raise StorageError(f"{uri}: scheme {parsed.scheme!r} is not supported (s3:// or a local path)")
    options = storage_options(uri) or {}
    return _s3_filesystem(tuple(sorted(options.items()))), (parsed.netloc + "/" + parsed.path.strip("/")).rstrip("/")


def hadoop_uri(uri: str) -> str:
    """``uri`` as Spark's Hadoop file systems name it: ``s3://`` is served by S3A as ``s3a://``."""
    return "s3a://" + uri.removeprefix("s3://") if uri.startswith("s3://") else uri


# -- small files (reports, markers) -----------------------------------------------------------------

def exists(path: str) -> bool:
    if not is_remote(path):
        return os.path.exists(path)
    import pyarrow.fs as pa_fs

    fs, key = filesystem(path)
    return fs.get_file_info(key).type != pa_fs.FileType.NotFound


def read_text(path: str) -> str:
    """The file's text; ``FileNotFoundError`` if there is none."""
    if not is_remote(path):
        return Path(path).read_text()
    fs, key = filesystem(path)
    try:
        with fs.open_input_stream(key) as f:
            return bytes(f.read()).decode()
    except FileNotFoundError:
        raise
    except OSError as exc:
        if "NoSuchKey" in str(exc) or "not found" in str(exc).lower():
            raise FileNotFoundError(path) from None
        raise


def write_text(path: str, text: str) -> None:
    """Write a whole file so that readers see the old or the new text, never a part."""
    if not is_remote(path):
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(text)
        tmp.replace(target)
        return
    fs, key = filesystem(path)
    with fs.open_output_stream(key) as f:  # an S3 object appears whole when the upload completes
        f.write(text.encode())


def remove(path: str) -> None:
    """Delete a file; no error if it is not there."""
    if not is_remote(path):
        Path(path).unlink(missing_ok=True)
        return
    fs, key = filesystem(path)
    try:
        fs.delete_file(key)
    except FileNotFoundError:
        pass


def remove_prefixed(folder: str, prefix: str) -> None:
    """Delete every file below ``folder`` (at any depth) whose name starts with ``prefix``."""
    if not is_remote(folder):
        for path in Path(folder).rglob(prefix + "*"):
            path.unlink(missing_ok=True)
        return
    import pyarrow.fs as pa_fs

    fs, key = filesystem(folder)
    for info in fs.get_file_info(pa_fs.FileSelector(key, recursive=True, allow_not_found=True)):
        if info.type == pa_fs.FileType.File and info.base_name.startswith(prefix):
            remove(join(folder, info.path[len(key):]))


def list_names(folder: str) -> list[str]:
    """The names of the files directly in ``folder`` (none if it does not exist)."""
    if not is_remote(folder):
        return [p.name for p in Path(folder).iterdir() if p.is_file()] if os.path.isdir(folder) else []
    import pyarrow.fs as pa_fs

    fs, key = filesystem(folder)
    infos = fs.get_file_info(pa_fs.FileSelector(key, recursive=False, allow_not_found=True))
    return [i.base_name for i in infos if i.type == pa_fs.FileType.File]


def mtime_ns(path: str) -> int | None:
    """The file's modification time in ns; None if it is not there."""
    if not is_remote(path):
        try:
            return os.stat(path).st_mtime_ns
        except OSError:
            return None
    import pyarrow.fs as pa_fs

    fs, key = filesystem(path)
    info = fs.get_file_info(key)
    return None if info.type == pa_fs.FileType.NotFound else info.mtime_ns


def probe(key: str, uri: str) -> None:
    """Fail fast, naming the setting, when ``uri`` (the value of ``key``) cannot be listed: a wrong
    endpoint, refused credentials or a missing bucket. Local paths are not probed."""
    if not is_remote(uri):
        return
    import pyarrow.fs as pa_fs

    settings = _settings()
    fs, path = filesystem(uri)
    bucket = path.split("/", 1)[0]
    try:
        fs.get_file_info(pa_fs.FileSelector(path, recursive=False, allow_not_found=True))
        missing = fs.get_file_info(bucket).type == pa_fs.FileType.NotFound
    except OSError as exc:
        text = str(exc)
        code = text.replace("_", "").lower()  # pyarrow says SIGNATURE_DOES_NOT_MATCH, S3 SignatureDoesNotMatch
        where = settings.get("AWS_ENDPOINT_URL", "AWS's S3 endpoint")
        if any(w in code for w in ("accessdenied", "invalidaccesskeyid", "signaturedoesnotmatch", "403")):
            raise StorageError(f"{key} = {uri}: {where} refused the credentials: check storage.s3.access_key_id "
                               f"and storage.s3.secret_access_key (or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY). "
                               f"({text.strip()[:200]})") from None
        if "nosuchbucket" in code or "404" in code:
            raise StorageError(f"{key} = {uri}: bucket {bucket!r} does not exist at {where}: create it first") from None
        raise StorageError(f"{key} = {uri}: cannot reach storage.s3.endpoint {where}: {text.strip()[:300]}") from None
    if missing:
        where = settings.get("AWS_ENDPOINT_URL", "AWS's S3 endpoint")
        raise StorageError(f"{key} = {uri}: bucket {bucket!r} does not exist at {where}: create it first")
