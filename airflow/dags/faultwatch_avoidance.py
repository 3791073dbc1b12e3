"""faultwatch avoidance publisher: every minute, load → recommend → validate → publish (+ lag alerts).

Thin on purpose (STYLE.md §11): each task calls one ``pipeline.publish`` step, and everything heavy
(deltalake, kafka, great_expectations, the pipeline itself) is imported inside the tasks, so parsing
this file makes no connection and stays fast. Values between tasks are small JSON (XCom).

A cycle is numbered from the run's logical time (``floor(t / publish.interval_s)``); its Delta
appends carry that number as a transaction version, so a retried or re-run task publishes nothing
twice. A failed validation fails the ``validate`` task without retries (the next minute's run is
the retry), after recording the refusal and sending an alert; the last good list stays in force
until its own expiry.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from typing import Any

from airflow.sdk import Param, dag, task

from pipeline.config import DEFAULT_CONFIG_PATH  # light: no Spark, Kafka or Delta at parse time

# The configuration shipped with faultwatch, unless the deployment says otherwise.
DEFAULT_CONFIG = os.environ.get("FAULTWATCH_CONFIG", str(DEFAULT_CONFIG_PATH))


def _cycle_time_ms(context: dict[str, Any]) -> int:
    """The run's logical time; manual runs in Airflow 3 may have none, then when it was queued."""
    when = context.get("logical_date") or getattr(context.get("dag_run"), "run_after", None)
    return int(when.timestamp() * 1000) if when is not None else int(datetime.now(timezone.utc).timestamp() * 1000)


def _config(params: dict[str, Any]) -> Any:
    from pipeline.config import load_config

    return load_config(params["config"])


@dag(
    dag_id="faultwatch_avoidance",
    description="Publish which RocketMQ brokers producers should avoid (rmq.avoidance)",
    schedule="* * * * *",  # every minute, on the minute: cycle numbers follow the logical time
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=5),
    default_args={
        "retries": 2,
        "retry_delay": timedelta(seconds=5),
        "retry_exponential_backoff": True,
        "max_retry_delay": timedelta(seconds=30),
    },
    params={
        "config": Param(DEFAULT_CONFIG, type="string", description="faultwatch TOML configuration file"),
        "cycle": Param(None, type=["null", "integer"], description="cycle number (default: from the logical time)"),
    },
    tags=["faultwatch", "rocketmq"],
)
def faultwatch_avoidance() -> None:
    @task
    def load(params: dict[str, Any] | None = None, **context: Any) -> dict[str, Any]:
        from pipeline.publish import cycle_number_for, load_inputs

        params = params or {}
        cfg = _config(params)
        number = params.get("cycle")
        if number is None:
            number = cycle_number_for(_cycle_time_ms(context), cfg.publish.interval_s)
        return load_inputs(cfg, int(number)).to_jsonable()

    @task
    def recommend(loaded: dict[str, Any], params: dict[str, Any] | None = None) -> dict[str, Any]:
        from pipeline.policy import to_jsonable
        from pipeline.publish import CycleInput
        from pipeline.publish import recommend as decide

        cfg = _config(params or {})
        return to_jsonable(decide(CycleInput.from_jsonable(loaded), cfg))

    @task
    def validate(loaded: dict[str, Any], decision: dict[str, Any], params: dict[str, Any] | None = None) -> bool:
        from airflow.sdk.exceptions import AirflowFailException

        from pipeline.policy import decision_from_jsonable
        from pipeline.publish import CycleInput, reject
        from pipeline.publish import validate as run_gate

        cfg = _config(params or {})
        inp, dec = CycleInput.from_jsonable(loaded), decision_from_jsonable(decision)
        gate = run_gate(inp, dec, cfg)
        if not gate.success:
            reject(cfg, inp, dec, gate)
            raise AirflowFailException(f"cycle {inp.cycle_id}: {gate.summary()}")
        return True

    @task
    def publish(
        loaded: dict[str, Any], decision: dict[str, Any], valid: bool, params: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        from pipeline.policy import decision_from_jsonable
        from pipeline.publish import CycleInput, GateResult
        from pipeline.publish import publish as send

        cfg = _config(params or {})
        return send(cfg, CycleInput.from_jsonable(loaded), decision_from_jsonable(decision), GateResult(valid))

    @task
    def lag_alerts(loaded: dict[str, Any], params: dict[str, Any] | None = None) -> dict[str, Any]:
        from pipeline.publish import CycleInput, send_lag_alerts

        return send_lag_alerts(_config(params or {}), CycleInput.from_jsonable(loaded))

    loaded = load()
    decision = recommend(loaded)
    publish(loaded, decision, validate(loaded, decision))
    lag_alerts(loaded)


faultwatch_avoidance()
