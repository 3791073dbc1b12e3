"""pipeline/objstore.py without a server: local paths, schemes, and how the S3 settings resolve
(tests/integration/test_s3_storage.py runs the same helpers against a real S3 server)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipeline import objstore
from pipeline.config import S3Config, Secret, StorageConfig
from streaming.s3a import hadoop_version, spark_conf


@pytest.fixture(autouse=True)
def _fresh_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objstore, "_SETTINGS", {})
    monkeypatch.delenv(objstore.ENV_OPTIONS, raising=False)


def test_local_paths_use_the_local_file_system(tmp_path: Path) -> None:
    root = str(tmp_path / "ck")
    assert not objstore.is_remote(root) and objstore.storage_options(root) is None
    assert objstore.join(root, "q", "a.json") == str(tmp_path / "ck" / "q" / "a.json")
    path = objstore.join(root, "q", "a.json")
    assert not objstore.exists(path) and objstore.mtime_ns(path) is None and objstore.list_names(root) == []
    objstore.write_text(path, "one")
    objstore.write_text(path, "two")
    assert objstore.read_text(path) == "two" and objstore.list_names(objstore.join(root, "q")) == ["a.json"]
    assert objstore.mtime_ns(path) == os.stat(path).st_mtime_ns
    objstore.write_text(objstore.join(root, "q", "d=1", "part-x-b1-0.parquet"), "")
    objstore.write_text(objstore.join(root, "q", "part-y-b1-0.parquet"), "")
    objstore.remove_prefixed(root, "part-x-b1-")
    assert sorted(p.name for p in Path(root).rglob("*.*")) == ["a.json", "part-y-b1-0.parquet"]
    objstore.remove(path)
    objstore.remove(path)  # gone already: no error
    with pytest.raises(FileNotFoundError):
        objstore.read_text(path)
    assert spark_conf(root, root) == {}  # no S3A jars for a local run


def test_uris_and_schemes() -> None:
    assert objstore.join("s3://b/p/", "t", "_delta_log") == "s3://b/p/t/_delta_log"
    assert objstore.hadoop_uri("s3://b/p/ck") == "s3a://b/p/ck" and objstore.hadoop_uri("/x") == "/x"
    objstore.check_scheme("root", "s3://b/p")
    objstore.check_scheme("root", "file:///x")
    with pytest.raises(ValueError, match="root: scheme 'gs'"):
        objstore.check_scheme("root", "gs://b/p")
    with pytest.raises(ValueError, match="names no bucket"):
        objstore.check_scheme("checkpoint_root", "s3:///p")


def test_settings_from_the_config_or_the_aws_variables() -> None:
    storage = StorageConfig(root="s3://b/t", s3=S3Config(endpoint="http://127.0.0.1:9", region="r1",
                                                          access_key_id="id", secret_access_key=Secret("s")))
    options = objstore.configure(storage, env={"AWS_ACCESS_KEY_ID": "ignored"})
    assert options == {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "r1",
                       "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ALLOW_HTTP": "true", "conditional_put": "etag"}
    assert json.loads(os.environ[objstore.ENV_OPTIONS]) == options  # for Spark's Python workers
    assert objstore.storage_options("s3://b/t/x") == options
    env = {"AWS_ACCESS_KEY_ID": "e", "AWS_SECRET_ACCESS_KEY": "f", "AWS_DEFAULT_REGION": "r2", "AWS_SESSION_TOKEN": "t"}
    options = objstore.configure(StorageConfig(checkpoint_root="s3://b/ck"), env=env)
    assert options == {"AWS_ACCESS_KEY_ID": "e", "AWS_SECRET_ACCESS_KEY": "f", "AWS_REGION": "r2",
                       "AWS_SESSION_TOKEN": "t", "conditional_put": "etag"}  # no endpoint: AWS itself, https
    assert objstore.configure(StorageConfig(), env=env) == {}  # local roots need no settings
    with pytest.raises(ValueError, match=r"storage.s3.secret_access_key is not set \(nor AWS_SECRET_ACCESS_KEY\)"):
        objstore.configure(StorageConfig(root="s3://b/t", s3=S3Config(region="r", access_key_id="i")), env={})


def test_the_s3a_jars_follow_the_installed_sparks_hadoop() -> None:
    import pyspark

    jars = {p.name for p in (Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar")}
    assert jars == {f"hadoop-client-api-{hadoop_version()}.jar"}
