"""Bronze ingest throughput against the raw Kafka consume ceiling, in one run.

    .venv/bin/python bench/ingest.py [--events 1000000] [--partitions 4]

1. starts a local broker (Tansu) and preloads N send results spread over 50 brokers' keys;
2. (a) ceiling: consumes the whole topic with kafka-python in this one process, no decoding;
   and again with faultwatch's faster record unpacking (``streaming/kafka_records.py``, which the
   reader uses), for reference;
3. (b) runs ``faultwatch stream --once --only bronze`` as a separate process on that topic;
4. prints events/s for both, their ratio, and the peak RSS of the streaming process tree
   (driver JVM + Python workers).

Throughput of (b) is measured from the moment the queries start (the "started:" line) to the last
batch's commit (the "total:" line), so the JVM's start-up and the session's shutdown are reported
separately rather than diluting the figure.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import log_tail, run_measured, run_parallel
from pipeline.config import Config
from pipeline.kafka_local import start_local_kafka

BASE_TS = 1_700_000_000_000


def _event(i: int, n_brokers: int = 50, n_producers: int = 500) -> bytes:
    from schemas.events import SendResult

    ok = i % 50 != 0
    return SendResult(
        event_id=f"bench-{i}", ts_ms=BASE_TS + i, cluster="bench", producer_group="PG",
        client_id=f"10.0.{i % n_producers // 250}.{i % 250}@{i % n_producers}",
        client_version="4.9.8" if i % 2 else "5.3.3", topic="BenchTopic",
        broker_name=f"broker-{i % n_brokers:02d}", queue_id=i % 8,
        status="SEND_OK" if ok else "FAILED", latency_ms=(i * 7919) % 400,
        error=None if ok else "org.apache.rocketmq.remoting.exception.RemotingTimeoutException",
        queue_offset=i // n_brokers if ok else None, attempt=0,
    ).to_json()


def _produce_slice(bootstrap: str, topic: str, start: int, stop: int) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, batch_size=512 * 1024,
        max_request_size=8 * 1024 * 1024,
    )
    for i in range(start, stop):
        producer.send(topic, key=f"broker-{i % 50:02d}".encode(), value=_event(i))
    producer.flush()
    producer.close()


def preload(bootstrap: str, topic: str, n: int, procs: int = 2) -> float:
    step = (n + procs - 1) // procs
    return run_parallel(_produce_slice, [(bootstrap, topic, i * step, min(n, (i + 1) * step)) for i in range(procs)])


def consume_ceiling(bootstrap: str, topic: str, n: int, fast_records: bool = False) -> float:
    """Seconds to read all ``n`` records with one kafka-python consumer (no decoding at all); with
    ``fast_records``, its batches unpacked by streaming.kafka_records as faultwatch's reader does."""
    from kafka import KafkaConsumer, TopicPartition

    from streaming.kafka_records import install

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
        fetch_max_bytes=64 * 1024 * 1024, max_partition_fetch_bytes=16 * 1024 * 1024,
    )
    if fast_records and not install(consumer):
        raise SystemExit("streaming.kafka_records could not be installed on this kafka-python")
    tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
    consumer.assign(tps)
    consumer.seek_to_beginning()
    t0 = time.perf_counter()
    seen = 0
    while seen < n:
        for records in consumer.poll(timeout_ms=1000, max_records=100_000).values():
            seen += len(records)
    elapsed = time.perf_counter() - t0
    consumer.close()
    return elapsed


BATCH_LINE = re.compile(r"batch (\d+): in=(\d+) .*\((\d+(?:\.\d+)?)s\)")


def run_stream(config: Path, only: list[str], log: Path) -> dict[str, float]:
    """Run faultwatch stream --once; returns wall, startup and processing seconds and peak RSS."""
    args = [str(REPO / ".venv" / "bin" / "faultwatch"), "stream", "--config", str(config), "--once"]
    for concern in only:
        args += ["--only", concern]
    t0 = time.perf_counter()
    started_at: list[float] = []
    done_at: list[float] = []  # the "total:" line: every batch has been committed

    later: list[tuple[int, float]] = []  # (rows, seconds) of every batch after the first

    def on_line(line: str) -> None:
        if line.startswith("started:") and not started_at:
            started_at.append(time.perf_counter())
        batch = BATCH_LINE.search(line)
        if batch and int(batch.group(1)) > 0:
            later.append((int(batch.group(2)), float(batch.group(3))))
        if "total:" in line and not done_at:
            done_at.append(time.perf_counter())
        if "total:" in line or line.startswith("[") and "batch" in line:
            print("   ", line.rstrip(), flush=True)

    code, peak = run_measured(args, log, on_line, REPO)
    end = time.perf_counter()
    if code != 0:
        raise SystemExit(f"faultwatch stream exited {code}; last lines of {log}:\n{log_tail(log)}")
    start = started_at[0] if started_at else t0
    done = done_at[0] if done_at else end
    rows, secs = sum(r for r, _ in later), sum(t for _, t in later)
    return {"wall": end - t0, "startup": start - t0, "processing": done - start, "shutdown": end - done,
            "peak_rss": peak, "steady": rows / secs if secs else float("nan")}


def write_config(path: Path, bootstrap: str, topic: str, data: Path, max_batch: int, extra: str = "") -> Path:
    path.write_text(
        f'[kafka]\nbootstrap_servers = "{bootstrap}"\n'
        f'[topics]\nsend_results = "{topic}"\n'
        f'[storage]\nroot = "{data}/tables"\ncheckpoint_root = "{data}/checkpoints"\n'
        f"[stream]\nmax_events_per_batch = {max_batch}\ntrigger_interval_s = 1.0\n{extra}"
    )
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--max-batch", type=int, default=Config().stream.max_events_per_batch,
                    help="stream.max_events_per_batch (default: the shipped config's)")
    args = ap.parse_args()
    n = args.events
    topic = "bench.send-results"
    work = Path(tempfile.mkdtemp(prefix="faultwatch-bench-ingest-"))
    cfg = Config()
    print(
        f"bench/ingest: {n} send results, {args.partitions} partitions, {os.cpu_count()} cores, "
        f"{args.max_batch} events per micro-batch at most; work dir {work}"
    )
    with start_local_kafka(topics=[topic, *cfg.topics.all()], partitions=args.partitions) as kafka:
        secs = preload(kafka.bootstrap, topic, n)
        print(f"preload: {n / secs:,.0f} events/s ({secs:.1f}s)")
        ceiling_s = consume_ceiling(kafka.bootstrap, topic, n)
        print(f"(a) ceiling, raw kafka-python consume in one process: {n / ceiling_s:,.0f} events/s ({ceiling_s:.1f}s)")
        fast_s = consume_ceiling(kafka.bootstrap, topic, n, fast_records=True)
        print(
            f"    the same with faultwatch's record unpacking (streaming/kafka_records.py): {n / fast_s:,.0f} events/s "
            f"({fast_s:.1f}s)"
        )
        conf = write_config(work / "fw.toml", kafka.bootstrap, topic, work / "data", args.max_batch)
        r = run_stream(conf, ["bronze"], work / "bronze.log")
    bronze = n / r["processing"]
    print(
        f"(b) bronze, faultwatch stream --once: {bronze:,.0f} events/s "
        f"({r['processing']:.1f}s processing + {r['startup']:.1f}s start-up + {r['shutdown']:.1f}s shutdown; "
        f"whole process {n / r['wall']:,.0f} events/s)"
    )
    print(f"ratio bronze / ceiling: {bronze / (n / ceiling_s):.2f} (against the faster unpacking: {bronze / (n / fast_s):.2f})")
    print(
        f"    steady state (batches after the first, which also pays the Python workers' start): "
        f"{r['steady']:,.0f} events/s, ratio {r['steady'] / (n / ceiling_s):.2f}"
    )
    print(f"peak RSS of the streaming process tree: {r['peak_rss'] / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
