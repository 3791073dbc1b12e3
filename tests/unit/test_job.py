"""The streaming job's plain parts: which queries run, and what a progress line says."""

from __future__ import annotations

import pytest

from streaming.job import DEFAULT_CONCERNS, _state_text, backlog_of, resolve_concerns


def test_default_is_the_one_combined_query() -> None:
    assert resolve_concerns(None) == list(DEFAULT_CONCERNS) == ["combined"]


def test_every_query_is_known_to_the_sink() -> None:
    from streaming.delta_sink import QUERIES
    from streaming.job import CONCERNS

    assert sorted(QUERIES) == sorted(CONCERNS)


def test_repeated_concerns_run_once() -> None:
    assert resolve_concerns(["lag", "bronze", "lag"]) == ["lag", "bronze"]


@pytest.mark.parametrize("mix", [["bronze_faults", "bronze"], ["faults", "bronze_faults"], ["combined", "lag"],
                                 ["bronze", "combined"]])
def test_the_combined_query_refuses_its_parts(mix: list[str]) -> None:
    with pytest.raises(ValueError, match="already writes"):
        resolve_concerns(mix)


def test_unknown_concern_is_named() -> None:
    with pytest.raises(ValueError, match="'silver'"):
        resolve_concerns(["silver"])


def test_state_size_is_printed_for_stateful_queries_only() -> None:
    stateful = {"stateOperators": [{"numRowsTotal": 1, "memoryUsedBytes": 9,
                                    "customMetrics": {"stateOnCurrentVersionSizeBytes": 3 * 2**20}}]}
    assert _state_text(stateful) == " state=1 rows/3.00MiB"
    assert _state_text({"stateOperators": [{"numRowsTotal": 2, "memoryUsedBytes": 2**20}]}) == " state=2 rows/1.00MiB"
    assert _state_text({}) == ""


def test_backlog_sums_what_is_left_per_partition() -> None:
    source = {"latestOffset": '{"t:0": 10, "t:1": 5}', "endOffset": {"t:0": 4, "t:1": 5}}
    assert backlog_of(source) == 6
    settled = {"latestOffset": '{"t:0": 10, "_settle_ms": 99}', "endOffset": {"t:0": 4, "_settle_ms": 7}}
    assert backlog_of(settled) == 6  # an offset's meta entries are not partitions
    assert backlog_of({"latestOffset": None, "endOffset": "{}"}) is None


@pytest.mark.spark
def test_warming_the_python_workers_runs_one_job_in_the_background(spark) -> None:  # type: ignore[no-untyped-def]
    from streaming.job import WARM_JOB_GROUP, warm_python_workers

    thread = warm_python_workers(spark)
    thread.join(120)
    assert not thread.is_alive()
    tracker = spark.sparkContext.statusTracker()
    jobs = tracker.getJobIdsForGroup(WARM_JOB_GROUP)
    assert jobs, "the warm-up job did not run"
    assert all(tracker.getJobInfo(j).status == "SUCCEEDED" for j in jobs)


def test_a_query_whose_python_worker_started_too_slowly_is_started_again_a_few_times() -> None:
    from streaming.job import START_RETRIES, TRANSIENT, to_restart

    slow = {"combined": f"{TRANSIENT}."}
    assert to_restart(slow, {"combined": 0}) == ["combined"]
    assert to_restart(slow, {"combined": START_RETRIES}) == []
    assert to_restart({"combined": "ValueError: bad"}, {"combined": 0}) == []
    assert to_restart({**slow, "lag": "ValueError: bad"}, {"combined": 0, "lag": 0}) == []
