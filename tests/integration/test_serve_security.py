"""``faultwatch serve`` as users run it, secured: basic auth (bcrypt hash from the environment) and TLS.

The server is a real process started from the command line; it is called without and with
credentials and over HTTPS with a certificate made for the test. The password, its hash and the
key never appear in its output, even with debug logging.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import re
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest

from tests.integration.processes import kill_tree, start_faultwatch
from tests.unit.test_serve import get, get_json, write_outage_tables

PASSWORD = "correct horse battery staple"
USER = "prometheus"


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (PEM), made with cryptography."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "faultwatch test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "tls.crt", folder / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def write_serve_config(tmp_path: Path, extra: str = "") -> Path:
    conf = tmp_path / "serve.toml"
    conf.write_text(
        f'[storage]\nroot = "{tmp_path / "tables"}"\npublish_dir = "{tmp_path / "avoidance"}"\n'
        f"[serve]\nrefresh_interval_s = 0.5\n{extra}"
    )
    return conf


def start_serve(conf: Path, log: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    proc = start_faultwatch("-v", "serve", "--config", str(conf), "--port", "0", log=log, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        match = re.search(r"listening on (\S+)", log.read_text(errors="replace"))
        if match:
            return proc, match.group(1)
        if proc.poll() is not None:
            raise AssertionError(f"serve exited ({proc.returncode}):\n{log.read_text(errors='replace')}")
        time.sleep(0.1)
    raise AssertionError(f"serve did not start:\n{log.read_text(errors='replace')}")


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[str, ssl.SSLContext, Path, str]]:
    write_outage_tables(tmp_path)
    cert, key = self_signed(tmp_path)
    password_hash = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
    conf = write_serve_config(tmp_path, f'basic_auth_username = "{USER}"\n')
    env = {"FAULTWATCH_SERVE_BASIC_AUTH_PASSWORD_HASH": password_hash,
           "FAULTWATCH_SERVE_TLS_CERT_FILE": str(cert), "FAULTWATCH_SERVE_TLS_KEY_FILE": str(key)}
    log = tmp_path / "serve.log"
    proc, url = start_serve(conf, log, env)
    context = ssl.create_default_context(cafile=str(cert))
    try:
        yield url, context, log, password_hash
    finally:
        kill_tree(proc, 15)


def test_basic_auth_over_tls(secured: tuple[str, ssl.SSLContext, Path, str]) -> None:
    url, context, log, password_hash = secured
    assert url.startswith("https://127.0.0.1:")
    for path in ("metrics", "healthz", "v3/rocketmq", ""):
        status, body, headers = get(url + path, context=context)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Basic realm="), path
        assert get(url + path, auth=basic(USER, "wrong"), context=context)[0] == 401
        assert get(url + path, auth=basic("someone", PASSWORD), context=context)[0] == 401
    deadline = time.monotonic() + 60  # serve listens at once; its first refresh takes a moment
    while (answer := get_json(url + "v3/rocketmq", auth=basic(USER, PASSWORD), context=context))[0] == 503:
        assert time.monotonic() < deadline, answer
        time.sleep(0.2)
    status, doc = answer
    assert status == 200 and doc["clusters"] == ["DefaultCluster"]
    status, body, _ = get(url + "metrics", auth=basic(USER, PASSWORD), context=context)
    assert status == 200 and b"faultwatch_group_lag_messages" in body
    # Plain HTTP to the TLS port gets nothing; an unverified certificate is refused by the client.
    with pytest.raises(OSError):
        get(url.replace("https://", "http://") + "healthz")
    with pytest.raises(OSError):
        get(url + "healthz", context=ssl.create_default_context())
    text = log.read_text(errors="replace")
    assert "DEBUG" in text  # debug logging was on, and still no secret:
    for secret in (PASSWORD, password_hash, password_hash[7:29]):
        assert secret not in text


def test_binds_loopback_by_default_and_refuses_a_bad_hash(tmp_path: Path) -> None:
    conf = write_serve_config(tmp_path, f'basic_auth_username = "{USER}"\n')
    log = tmp_path / "bad.log"
    proc = start_faultwatch("serve", "--config", str(conf), "--port", "0", log=log,
                            env={"FAULTWATCH_SERVE_BASIC_AUTH_PASSWORD_HASH": "plain-text-password"})
    assert proc.wait(timeout=60) == 2
    text = log.read_text()
    assert "serve.basic_auth_password_hash must be a bcrypt hash" in text and "plain-text-password" not in text
    proc, url = start_serve(write_serve_config(tmp_path), tmp_path / "plain.log", env={})
    try:
        assert url.startswith("http://127.0.0.1:")
    finally:
        kill_tree(proc, 15)
