"""Tansu, the demo's embedded broker (pipeline/kafka_local.py), still carries the job: a mix of valid
and malformed events through bronze, row for row, as on Apache Kafka (tests/integration/test_bronze.py)."""

from __future__ import annotations

import io
from collections import Counter

import orjson
import pytest

from pipeline.config import Config
from pipeline.deltaio import read_table
from pipeline.kafka_local import local_kafka
from tests.integration.bronze_data import make_mix, produce_mix

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_bronze_through_tansu(spark, cfg: Config) -> None:  # type: ignore[no-untyped-def]
    from streaming.job import run_stream

    with local_kafka(topics=Config().topics.all(), partitions=2) as tansu:
        cfg = cfg.replace(kafka__bootstrap_servers=tansu.bootstrap, stream__max_events_per_batch=1500)
        mix = make_mix(3_000, seed=11)
        produce_mix(tansu.bootstrap, cfg.topics.event_topics(), mix)
        out = io.StringIO()
        assert run_stream(cfg, once=True, concerns=["bronze"], spark=spark, out=out) == 0, out.getvalue()

    sends = read_table(cfg.storage.root, "send_results").to_pylist()
    sent = {orjson.loads(v)["event_id"]: orjson.loads(v) for v in mix.valid["send_result"]}
    assert sorted(r["event_id"] for r in sends) == sorted(sent)
    for row in sends:
        assert {k: row[k] for k in sent[row["event_id"]]} == sent[row["event_id"]]
    quarantine = read_table(cfg.storage.root, "quarantine")
    assert Counter(quarantine.column("reason").to_pylist()) == Counter(r for _k, _v, r in mix.bad)
