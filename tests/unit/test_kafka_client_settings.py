"""[kafka.client]: extra kafka-python settings reach every client's options; secrets stay masked;
a key no client takes, or one with its own [kafka] setting, is refused naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import ConfigError, describe, load_config


def load(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "c.toml"
    path.write_text(text)
    return load_config(path, env={})


def test_settings_reach_the_client_options_and_secrets_are_masked(tmp_path: Path) -> None:
    cfg = load(tmp_path, '[kafka]\nsecurity_protocol = "SASL_SSL"\nsasl_mechanism = "SCRAM-SHA-512"\n'
                         'sasl_username = "fw"\nsasl_password = "hunter2"\n'
                         '[kafka.client]\nssl_check_hostname = false\nmetadata_max_age_ms = 60000\n'
                         'sasl_kerberos_service_name = "kafka"\n')
    opts = cfg.kafka.client_options()
    assert opts["ssl_check_hostname"] is False and opts["metadata_max_age_ms"] == 60000
    assert opts["sasl_kerberos_service_name"] == "kafka" and opts["sasl_plain_password"] == "hunter2"
    for text in (repr(cfg), str(cfg), describe(cfg)):
        assert "hunter2" not in text


def test_a_secret_named_client_value_is_masked() -> None:
    from pipeline.config import KafkaConfig, Secret

    kafka = KafkaConfig(client={"sasl_oauth_token_provider_secret_like": "s3cr3t"})
    assert isinstance(kafka.client["sasl_oauth_token_provider_secret_like"], Secret)
    assert "s3cr3t" not in repr(kafka)


def test_a_config_with_client_settings_travels_to_spark_tasks() -> None:
    """Spark pickles the sinks, and the config inside them, for every task."""
    import pickle

    from pyspark import cloudpickle

    from pipeline.config import Config, KafkaConfig, Secret

    cfg = Config().replace(kafka=KafkaConfig(client={"metadata_max_age_ms": 1000, "token_secret": "s3cr3t"}))
    for dumps in (pickle.dumps, cloudpickle.dumps):
        shipped = pickle.loads(dumps(cfg))
        assert shipped == cfg
        assert dict(shipped.kafka.client) == dict(cfg.kafka.client)
        assert isinstance(shipped.kafka.client["token_secret"], Secret)
        with pytest.raises(TypeError):  # still read-only on the other side
            shipped.kafka.client["metadata_max_age_ms"] = 1  # type: ignore[index]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("acks = 1", "kafka.client.acks: not a setting every kafka-python client takes"),
        ('bootstrap_servers = "x:1"', "kafka.client.bootstrap_servers: set kafka.bootstrap_servers instead"),
        ('sasl_plain_password = "x"', "kafka.client.sasl_plain_password: set kafka.sasl_password instead"),
        ("ssl_check_hostname = [1]", "kafka.client.ssl_check_hostname: expected a string, number or boolean"),
    ],
)
def test_bad_client_settings_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, f"[kafka.client]\n{text}\n")
    assert message in str(err.value)
