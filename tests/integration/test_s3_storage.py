"""Both roots on ``s3://``, against a real S3-compatible server (Versity's gateway, tests/integration/s3_server.py).

The default job (``faultwatch stream --once`` over the simulator's broker outage, small micro-batches)
runs once into local folders and once into a bucket, where it is SIGKILLed after its third commit to
``send_results`` and started again: every table on S3 must equal its local twin row for row, with
no bronze record twice. Then the readers without Spark read the bucket: ``serve``'s refresh builds
the same state as from the local tables, the publisher decides the same avoidance list and records
its cycle there, the report reads the same data, and ``faultwatch maintain`` compacts and vacuums there without changing a row.
Bad S3 settings fail at load, fast, naming the key.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline import objstore
from pipeline.config import Config, ConfigError, S3Config, Secret, StorageConfig, load_config
from pipeline.deltaio import read_table, table_version
from pipeline.kafka_local import free_port
from pipeline.simulate import KafkaSink, Simulation, load_scenario
from tests.conftest import unique_topics
from tests.integration.processes import kill_tree, start_faultwatch, write_config
from tests.integration.s3_server import REGION, S3Server, s3_server


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with s3_server(tmp_path_factory.mktemp("s3")) as server:
        yield server


def s3_section(server: S3Server, **over: str) -> dict[str, object]:
    return {"endpoint": server.endpoint, "region": REGION, **over}


@pytest.mark.timeout(600)  # a hang guard, not a verdict on speed
def test_bad_s3_settings_fail_at_load_naming_the_key(s3: S3Server, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL",
                "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    root = f"s3://{s3.bucket}/bad"

    def load(storage: str) -> str:
        path = tmp_path / "bad.toml"
        path.write_text(storage)
        with pytest.raises(ConfigError) as err:  # bounded by the probe's connect timeout and retries
            load_config(path, env={})
        return str(err.value)

    good = f'endpoint = "{s3.endpoint}"\nregion = "{REGION}"\n'
    keys = f'access_key_id = "{s3.access_key}"\nsecret_access_key = "{s3.secret_key}"\n'
    head = f'[storage]\nroot = "{root}"\ncheckpoint_root = "{root}/ck"\n[storage.s3]\n'
    assert "storage.root: scheme 'gs'" in load('[storage]\nroot = "gs://b/t"\n')
    assert "storage.checkpoint_root: scheme 'abfss'" in load('[storage]\ncheckpoint_root = "abfss://c@a/t"\n')
    assert "storage.s3.access_key_id is not set (nor AWS_ACCESS_KEY_ID)" in load(head + good)
    assert "storage.s3.secret_access_key is not set" in load(head + good + f'access_key_id = "{s3.access_key}"\n')
    assert "storage.s3.region is not set (nor AWS_REGION or AWS_DEFAULT_REGION)" in load(
        head + f'endpoint = "{s3.endpoint}"\n' + keys)
    assert "storage.s3.endpoint: 'localhost:1' is not an http(s) URL" in load(
        head + 'endpoint = "localhost:1"\n' + f'region = "{REGION}"\n' + keys)
    refused = load(head + f'endpoint = "http://127.0.0.1:{free_port()}"\nregion = "{REGION}"\n' + keys)
    assert "storage.root = s3://" in refused and "cannot reach storage.s3.endpoint" in refused, refused
    wrong = load(head + good + f'access_key_id = "{s3.access_key}"\nsecret_access_key = "wrong-secret"\n')
    assert "refused the credentials" in wrong and "storage.s3.secret_access_key" in wrong, wrong
    missing = load(head.replace(s3.bucket, "no-such-bucket") + good + keys)
    assert "bucket 'no-such-bucket' does not exist" in missing, missing
    # and a good one loads
    (tmp_path / "good.toml").write_text(head + good + keys)
    assert load_config(tmp_path / "good.toml", env={}).storage.root == root


def configured(server: S3Server, prefix: str) -> str:
    """``s3://bucket/prefix``, with this process's S3 settings pointing at ``server``."""
    root = f"s3://{server.bucket}/{prefix}"
    objstore.configure(StorageConfig(root=root, s3=S3Config(server.endpoint, REGION, server.access_key,
                                                             Secret(server.secret_key))), env={})
    return root


def test_the_sinks_own_files_and_commits_on_s3(s3: S3Server) -> None:
    """Commits once per batch (a replay skipped), a failed batch's files deleted by list and by
    name, the batch report, the layout marker and the cluster decisions beside the checkpoint."""
    from streaming.decisions import ClusterDecisions
    from streaming.delta_sink import RoutedDeltaWriter, check_layout, ensure_tables, read_report
    from tests.unit.test_delta_sink import _rows

    root = configured(s3, "sink/tables")
    ck = f"s3://{s3.bucket}/sink/ck/q"
    on_disk = s3.folder / s3.bucket / "sink" / "tables"

    def files(name: str) -> set[str]:
        return {p.name for p in (on_disk / name).rglob("*.parquet")}

    tables = ["broker_health", "broker_fault_episodes"]
    ensure_tables(root, tables)
    w = RoutedDeltaWriter(root, tables, "test:s3", report_dir=objstore.join(ck, "faultwatch-reports"))
    msg = w.write(iter([_rows("broker_health", 3), _rows("broker_fault_episodes", 2)]), batch_id=0)
    w.commit([msg], 0)
    assert read_report(objstore.join(ck, "faultwatch-reports"), 0) == {"broker_health": 3, "broker_fault_episodes": 2}
    w.commit([msg], 0)  # a replay: the logs hold batch 0
    assert read_table(root, "broker_health").num_rows == 3 and read_table(root, "broker_fault_episodes").num_rows == 2
    kept = files("broker_health")
    failed = w.write(iter([_rows("broker_health", 4)]), batch_id=1)
    assert files("broker_health") > kept
    w.abort([failed], 1)
    assert files("broker_health") == kept
    w.write(iter([_rows("broker_health", 5), _rows("broker_fault_episodes", 1)]), batch_id=1)
    w.discard(1)
    assert files("broker_health") == kept and len(files("broker_fault_episodes")) == 1
    assert read_table(root, "broker_health").num_rows == 3

    check_layout(ck, "q", 2, {"faults.shards": 4})  # a new checkpoint: marked
    objstore.write_text(objstore.join(ck, "metadata"), "{}")  # as Spark marks a started query
    check_layout(ck, "q", 2, {"faults.shards": 4})
    with pytest.raises(ConfigError, match="faults.shards is 8"):
        check_layout(ck, "q", 2, {"faults.shards": 8})

    cfg = Config().replace(storage__root=root)
    decisions = ClusterDecisions(cfg, ck, "tag")
    decisions._save(5, {}, 1234)
    decisions._saved = None
    assert decisions._load(6) == ({}, 1234)
    assert objstore.list_names(objstore.join(ck, "faultwatch-decisions")) == ["5.json"]


def test_two_writers_on_one_stale_version_both_land(s3: S3Server) -> None:
    """Commits are conditional puts: a writer whose snapshot is one version behind does not
    overwrite the other's commit file (it finds it there, reads forward and commits the next)."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    uri = configured(s3, "race/t")
    options = objstore.storage_options(uri)
    assert options is not None and options["conditional_put"] == "etag"
    write_deltalake(uri, pa.table({"x": [0]}), storage_options=options)
    first, second = DeltaTable(uri, storage_options=options), DeltaTable(uri, storage_options=options)
    write_deltalake(first, pa.table({"x": [1]}), mode="append")
    write_deltalake(second, pa.table({"x": [2]}), mode="append")  # its snapshot is still version 0
    dt = DeltaTable(uri, storage_options=options)
    assert dt.version() == 2
    assert sorted(read_table(f"s3://{s3.bucket}/race", "t").column("x").to_pylist()) == [0, 1, 2]


def canonical(cfg: Config, table: str) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in read_table(cfg.storage.root, table).to_pylist())


def run_job(conf: Path, log: Path, env: dict[str, str] | None = None) -> None:
    proc = start_faultwatch("stream", "--config", str(conf), "--once", log=log, env=env)
    assert proc.wait(timeout=900) == 0, log.read_text(errors="replace")[-3000:]


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_default_job_on_s3_equals_local_across_a_kill_and_serves_publishes_maintains(
    s3: S3Server, kafka: Any, cfg: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = unique_topics(cfg, kafka, "s3job")
    Simulation(load_scenario("broker-outage").replace(duration_s=120.0)).run(KafkaSink(cfg), close=True)
    local = cfg.replace(stream__max_events_per_batch=3000, storage__publish_dir=str(tmp_path / "pub-local"))
    run_job(write_config(local, tmp_path / "local.toml"), tmp_path / "local.log")

    # the bucket: settings in [storage.s3], credentials from the standard environment variables
    remote = local.replace(storage__root=f"s3://{s3.bucket}/job/tables",
                           storage__checkpoint_root=f"s3://{s3.bucket}/job/checkpoints",
                           storage__publish_dir=str(tmp_path / "pub-s3"))
    conf = write_config(remote, tmp_path / "s3.toml", **{"storage.s3": s3_section(s3)})
    env = {k: v for k, v in s3.env().items() if k != "AWS_ENDPOINT_URL"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    remote = load_config(conf)  # this process reads the bucket too (configures pipeline.objstore)
    log = tmp_path / "s3-killed.log"
    first = start_faultwatch("stream", "--config", str(conf), "--once", log=log, env=env)
    deadline = time.monotonic() + 600
    while (table_version(remote.storage.root, "send_results") or 0) < 3:  # created, then two commits
        assert first.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "no third commit to send_results on S3 within 600 s"
        time.sleep(0.05)
    kill_tree(first)
    run_job(conf, tmp_path / "s3.log", env)

    names = sorted(p.parent.name for p in Path(local.storage.root).glob("*/_delta_log"))
    assert {"send_results", "consumer_progress", "producer_fault_windows", "broker_fault_episodes",
            "broker_health", "queue_lag", "group_status"} <= set(names), names
    # the data files are objects in the bucket (the server keeps them as files of its own folder)
    assert list((s3.folder / s3.bucket / "job" / "tables" / "send_results").rglob("*.parquet"))
    assert list((s3.folder / s3.bucket / "job" / "checkpoints").rglob("offsets/*"))
    for name in names:
        assert canonical(remote, name) == canonical(local, name), name
    events = read_table(remote.storage.root, "send_results", columns=["event_id"]).column("event_id").to_pylist()
    assert not [e for e, n in Counter(events).items() if n > 1]
    assert len(events) > 3 * 3000  # several micro-batches, some after the kill

    # serve's refresh: the same state from the bucket as from the folder
    from pipeline.serve.snapshot import Refresher

    clock = lambda: 2_000_000_000.0  # one instant for both
    states = [Refresher(c, clock).refresh_once().state for c in (local, remote)]
    assert not states[1].table_errors.get("broker_fault_episodes_live"), states[1].table_errors
    assert states[0] == states[1]

    # the publisher: the same decision, recorded in the bucket's publisher_cycles
    from pipeline.publish import run_cycle
    from pipeline.publish.cycle import load_inputs

    at = load_inputs(local, 1, 0).snapshot.freshest_ms  # the cycle runs just after the newest event
    assert at is not None
    reports = [run_cycle(c.replace(topics__avoidance=f"{c.topics.avoidance}-{i}"), cycle_number=at // 60_000,
                         at_ms=at + 1000) for i, c in enumerate((local, remote))]
    assert [r.status for r in reports] == ["published", "published"], [r.reason for r in reports]
    assert reports[0].decision is not None and reports[1].decision is not None
    assert reports[0].decision.recommendations() == reports[1].decision.recommendations()
    assert canonical(remote, "publisher_cycles") and len(canonical(remote, "publisher_cycles")) == len(
        canonical(local, "publisher_cycles"))

    # the report: the same data from the bucket as from the folder, and its page drawn
    from pipeline.report import load_report_data, write_report

    def report_rows(c: Config) -> dict[str, list[str]]:
        """The report's frames; without the latency percentiles it draws from bronze with a t-digest,
        which depends on the order of the rows (of the files) as well as on the rows."""
        frames = load_report_data(c.storage.root).frames
        return {n: sorted(f.drop(columns=[x for x in f.columns if x.startswith("latency_p")])
                          .to_json(orient="records", lines=True).splitlines()) for n, f in frames.items()}

    assert report_rows(local) == report_rows(remote)
    assert "broker-b" in write_report(remote.storage.root, tmp_path / "report.html", generated_ms=at).read_text()

    # faultwatch maintain on the bucket: compacted, vacuumed, not a row changed
    out = tmp_path / "maintain.log"
    proc = start_faultwatch("maintain", "--config", str(conf), log=out, env=env)
    assert proc.wait(timeout=600) == 0, out.read_text(errors="replace")[-3000:]
    text = out.read_text()
    assert "failed" not in text and "compact send_results" in text, text[-3000:]
    for name in names:
        assert canonical(remote, name) == canonical(local, name), name
    assert objstore.is_remote(remote.storage.root)
