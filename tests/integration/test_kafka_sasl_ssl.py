"""Apache Kafka on a SASL_SSL listener (SCRAM-SHA-512, a CA made here with openssl): the job reads
through it to bronze, the publisher's producer and the feed client talk through it too, a wrong
password is refused, and the password appears in no output."""

from __future__ import annotations

import io
import logging
import subprocess
from pathlib import Path

import orjson
import pytest

from pipeline.config import Config, Secret
from pipeline.deltaio import read_table
from pipeline.kafka_apache import start_apache_kafka
from tests.integration.test_kafka_codecs import produce_with

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

USER, PASSWORD, STORE_PASSWORD = "faultwatch", "scram-Pa55word-47", "store-pass-47"


def make_certificates(folder: Path) -> tuple[Path, Path]:
    """A CA and a broker certificate for 127.0.0.1 signed by it: (CA PEM, broker PKCS12 keystore)."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", "/CN=faultwatch-test-ca")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
            "-subj", "/CN=127.0.0.1")
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "broker.pem", "-days", "2", "-extfile", "san.ext")
    openssl("pkcs12", "-export", "-in", "broker.pem", "-inkey", "broker.key", "-certfile", "ca.pem",
            "-out", "broker.p12", "-passout", f"pass:{STORE_PASSWORD}")
    return folder / "ca.pem", folder / "broker.p12"


def test_the_job_publisher_and_feed_over_sasl_ssl(spark, cfg: Config, tmp_path: Path, caplog, capsys) -> None:  # type: ignore[no-untyped-def]
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    from pipeline.producer import AvoidanceFeed
    from pipeline.publish.sinks import send_records
    from streaming.job import run_stream

    ca, keystore = make_certificates(tmp_path)
    secure = {
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(keystore),
        "ssl.keystore.password": STORE_PASSWORD, "ssl.key.password": STORE_PASSWORD,
    }
    topics = Config().topics.all()
    with start_apache_kafka(topics=topics, partitions=2, listeners=["SASL_SSL"], extra_properties=secure,
                            format_args=["--add-scram", f"SCRAM-SHA-512=[name={USER},password={PASSWORD}]"]) as kafka:
        cfg = cfg.replace(
            kafka__bootstrap_servers=kafka.listener("SASL_SSL"), kafka__security_protocol="SASL_SSL",
            kafka__sasl_mechanism="SCRAM-SHA-512", kafka__sasl_username=USER,
            kafka__sasl_password=Secret(PASSWORD), kafka__ssl_cafile=str(ca),
            kafka__client={"ssl_check_hostname": True, "metadata_max_age_ms": 60_000},
        )
        sent = produce_with(kafka.bootstrap, cfg.topics.send_results, "lz4", 0, 300)  # test data: plaintext

        with caplog.at_level(logging.INFO):
            out = io.StringIO()
            assert run_stream(cfg, once=True, concerns=["bronze"], spark=spark, out=out) == 0, out.getvalue()
            send_records(cfg, cfg.topics.avoidance, [("c1", b'{"cluster": "c1"}')])
            feed = AvoidanceFeed.from_config(cfg)
            try:
                read = 0
                for _ in range(50):
                    read += feed.poll(timeout_ms=200)
                    if read:
                        break
                assert read == 1
            finally:
                feed.close()

        wrong = cfg.replace(kafka__sasl_password=Secret("not-the-password"))
        with pytest.raises(KafkaError):
            KafkaAdminClient(**wrong.kafka.client_options()).list_topics()

    rows = read_table(cfg.storage.root, "send_results").to_pylist()
    expected = {orjson.loads(v)["event_id"]: orjson.loads(v) for v in sent}
    assert sorted(r["event_id"] for r in rows) == sorted(expected)
    for row in rows:
        assert {k: row[k] for k in expected[row["event_id"]]} == expected[row["event_id"]]
    printed = out.getvalue() + caplog.text + "".join(capsys.readouterr())
    assert PASSWORD not in printed
