from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import DEFAULT_CONFIG_PATH, Config, ConfigError, describe, load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_repository_file_equals_embedded_defaults() -> None:
    assert load_config(DEFAULT_CONFIG_PATH, env={}) == Config()


@pytest.mark.parametrize(
    "text, message",
    [
        ("[stream]\ntrigger_intervl_s = 1", "unknown key stream.trigger_intervl_s"),
        ("[nosuch]\nx = 1", "unknown key nosuch"),
        ("[stream]\ntrigger_interval_s = 'fast'", "stream.trigger_interval_s: expected a number"),
        ("[stream]\nmax_events_per_batch = 0", "stream.max_events_per_batch must be > 0"),
        ("[kafka]\nsecurity_protocol = 'TLS'", "kafka.security_protocol: 'TLS' is not valid"),
        ("[faults]\nquorum_share = 1.5", "faults.quorum_share must be in (0, 1]"),
        ("[faults]\nshards = 0", "faults.shards must be an integer >= 1"),
        ("[lag.groups.g1]\nconsume_from_where = 'LATEST'", "lag.groups.g1.consume_from_where"),
        ("[kafka]\nsecurity_protocol = 'SASL_SSL'", "kafka.sasl_mechanism and kafka.sasl_username are required"),
        ("[spark]\nconf = 3", "spark.conf: expected a table"),
        ("[storage]\nwriter = 'delta-spark'\nroot = 's3://b/t'", "storage.writer: 'delta-spark' writes a local storage.root only"),
        ("[storage]\nwriter = 'spark'", "storage.writer: 'spark' is not valid; valid values: ['deltalake', 'delta-spark']"),
        ("[maintenance]\ndata_retention_h = -1", "maintenance.data_retention_h must be >= 0 (0 keeps every row)"),
        ("[spark]\njvm = 'fast'", "spark.jvm must be one of 'dev', 'production', got 'fast'"),
        ("stream = 3", "stream: expected a table"),
        ("[stream\n", "not valid TOML"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text), env={})
    assert message in str(err.value)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.toml")


def test_environment_overrides_connection_settings_and_secrets_only(tmp_path: Path) -> None:
    path = write(tmp_path, "[kafka]\nbootstrap_servers = 'file:9092'\n")
    env = {
        "FAULTWATCH_KAFKA_BOOTSTRAP_SERVERS": "env-a:9092,env-b:9092",
        "FAULTWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "FAULTWATCH_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "FAULTWATCH_KAFKA_SASL_USERNAME": "fw",
        "FAULTWATCH_KAFKA_SASL_PASSWORD": "hunter2",
        "FAULTWATCH_STREAM_TRIGGER_INTERVAL_S": "99",  # not a connection setting: ignored
    }
    cfg = load_config(path, env=env)
    assert cfg.kafka.bootstrap_servers == "env-a:9092,env-b:9092"
    assert cfg.stream.trigger_interval_s == Config().stream.trigger_interval_s
    opts = cfg.kafka.client_options()
    assert opts["bootstrap_servers"] == ["env-a:9092", "env-b:9092"]
    assert opts["sasl_plain_password"] == "hunter2"
    assert opts["security_protocol"] == "SASL_SSL"


def test_secrets_never_appear_in_reprs_or_logs(tmp_path: Path) -> None:
    cfg = load_config(
        write(tmp_path, "[kafka]\nsecurity_protocol = 'SASL_PLAINTEXT'\nsasl_mechanism = 'PLAIN'\nsasl_username = 'u'\n"),
        env={"FAULTWATCH_KAFKA_SASL_PASSWORD": "hunter2", "FAULTWATCH_KAFKA_SSL_PASSWORD": "s3cret"},
    )
    for text in (repr(cfg), str(cfg), describe(cfg), repr(cfg.kafka)):
        assert "hunter2" not in text and "s3cret" not in text
    assert "***" in repr(cfg.kafka)


def test_spark_conf_values_are_strings(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, '[spark.conf]\n"spark.sql.shuffle.partitions" = 8\n'), env={})
    assert dict(cfg.spark.conf) == {"spark.sql.shuffle.partitions": "8"}


def test_the_jvm_flag_set_is_read_from_the_spark_section(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, '[spark]\njvm = "production"\n'), env={}).spark.jvm == "production"
    assert load_config(write(tmp_path, '[spark]\njvm = "dev"\n'), env={}).spark.jvm == "dev"


def test_replace_sections_and_keys() -> None:
    cfg = Config().replace(storage__root="/x", stream__trigger_interval_s=1.0)
    assert cfg.storage.root == "/x" and cfg.stream.trigger_interval_s == 1.0
    assert Config().storage.root == "data/tables"
