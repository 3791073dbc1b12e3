"""A real S3-compatible server for tests: Versity's S3 gateway over a local folder (POSIX backend).

scripts/bootstrap.sh (test set) builds it from its Go module into ~/.cache/faultwatch/bin; here it is
started on a free loopback port with its own root user, and one bucket is made in it.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pipeline.children import stop_child
from pipeline.kafka_local import free_port

BINARY = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "faultwatch" / "bin" / "versitygw"
REGION = "us-east-1"


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    bucket: str
    folder: Path  # the backend folder: the bucket's objects are files under folder/bucket

    def env(self) -> dict[str, str]:
        """The standard AWS variables for a client of this server."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_REGION": REGION, "AWS_ENDPOINT_URL": self.endpoint}


@contextmanager
def s3_server(folder: Path, bucket: str = "faultwatch") -> Iterator[S3Server]:
    if not BINARY.exists():
        raise RuntimeError(f"{BINARY} is missing: run scripts/bootstrap.sh test (it builds Versity's S3 gateway)")
    backend = folder / "backend"
    (backend / bucket).mkdir(parents=True, exist_ok=True)  # a folder under the backend root is a bucket
    port = free_port()
    server = S3Server(f"http://127.0.0.1:{port}", "faultwatch-test", "faultwatch-test-secret", bucket, backend)
    log = open(folder / "versitygw.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [str(BINARY), "--access", server.access_key, "--secret", server.secret_key, "--region", REGION,
         "--port", f"127.0.0.1:{port}", "--quiet", "posix", str(backend)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        _wait_ready(server, proc)
        yield server
    finally:
        stop_child(proc, 10)
        log.close()


def _wait_ready(server: S3Server, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """Until the bucket lists (the server answers signed requests)."""
    import pyarrow.fs as pa_fs

    fs = pa_fs.S3FileSystem(access_key=server.access_key, secret_key=server.secret_key, region=REGION,
                            endpoint_override=server.endpoint.removeprefix("http://"), scheme="http",
                            connect_timeout=1.0, request_timeout=2.0)
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"versitygw exited with {proc.returncode}: see {server.folder.parent / 'versitygw.log'}")
        try:
            fs.get_file_info(pa_fs.FileSelector(server.bucket, allow_not_found=True))
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
