"""faultwatch avoidance publisher: every minute, load → recommend → validate → publish, then alerts.

Thin on purpose: each task calls one ``pipeline.publish`` step, and everything heavy
(deltalake, kafka, great_expectations, the pipeline itself) is imported inside the tasks, so parsing
this file makes no connection and stays fast. Values between tasks are small JSON (XCom).

A cycle's identity is the run's time in ms (when it was due); its Delta appends carry it as a
transaction version, so a retried or re-run task publishes nothing twice, whatever
``publish.interval_s`` or another publisher over the same tables uses. A cycle with nothing to do
(it, or a cycle at or after its time, already published) ends ``skipped`` with the reason in the
task log and, when superseded, a ``skipped`` row in ``publisher_cycles``. A failed validation
fails the ``validate`` task without retries (the next run is the retry), after recording the
refusal and sending an alert; the last good list stays in force until its own expiry. An error in
any avoidance task is the cycle's ``failed`` row. The ``alerts`` task runs last whatever happened
upstream (it reads its inputs itself), so a failed or refused cycle is an alert in the same run;
``outcome`` then fails the run when an avoidance task failed.

``FAULTWATCH_AVOIDANCE_SCHEDULE`` replaces the schedule: a cron expression, or a number of seconds.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from airflow.sdk import Param, dag, task
from airflow.sdk.exceptions import AirflowSkipException

from pipeline.config import DEFAULT_CONFIG_PATH  # light: no Spark, Kafka or Delta at parse time

# The configuration shipped with faultwatch, unless the deployment says otherwise.
DEFAULT_CONFIG = os.environ.get("FAULTWATCH_CONFIG", str(DEFAULT_CONFIG_PATH))
T = TypeVar("T")


def _schedule(value: str) -> str | timedelta:
    """Every minute on the minute unless the deployment says otherwise (seconds or a cron line)."""
    value = value.strip()
    return timedelta(seconds=int(value)) if value.isdigit() else value


def _cycle_time_ms(context: dict[str, Any]) -> int:
    """When the run was due (``run_after``: the tick of a schedule, the trigger time of a manual run).

    Not the logical date, which an interval schedule puts a whole interval earlier.
    """
    when = getattr(context.get("dag_run"), "run_after", None) or context.get("logical_date")
    return int(when.timestamp() * 1000) if when is not None else int(datetime.now(timezone.utc).timestamp() * 1000)


def _skip(result: dict[str, Any]) -> dict[str, Any]:
    """A step that did nothing ends its task as skipped, with the reason in the task's log; a step
    that failed (its ``failed`` row written) fails its task, so Airflow retries it."""
    if result.get("status") == "skipped":
        raise AirflowSkipException(result.get("reason") or "nothing to do")
    if result.get("status") == "failed":
        raise RuntimeError(f"cycle {result.get('cycle_id')} failed: {result.get('reason')}")
    return result


def _config(params: dict[str, Any]) -> Any:
    from pipeline.config import load_config

    return load_config(params["config"])


def _cycle_number(params: dict[str, Any], context: dict[str, Any]) -> int:
    number = params.get("cycle")
    return _cycle_time_ms(context) if number is None else int(number)


def _recorded(params: dict[str, Any], context: dict[str, Any], step: Callable[[], T]) -> T:
    """Run an avoidance step; an error (not a skip, not a refusal) becomes the cycle's ``failed`` row,
    naming the table, file or broker, before it fails the task."""
    from airflow.sdk.exceptions import AirflowFailException

    try:
        return step()
    except (AirflowSkipException, AirflowFailException):
        raise
    except Exception as exc:
        from pipeline.publish import record_failure, short_reason

        now = int(datetime.now(timezone.utc).timestamp() * 1000)
        record_failure(_config(params), _cycle_number(params, context), now, short_reason(exc))
        raise


@dag(
    dag_id="faultwatch_avoidance",
    description="Publish which RocketMQ brokers producers should avoid (rmq.avoidance)",
    schedule=_schedule(os.environ.get("FAULTWATCH_AVOIDANCE_SCHEDULE", "* * * * *")),
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
        "cycle": Param(
            None, type=["null", "integer"], description="cycle identity in Unix ms (default: when the run was due)"
        ),
    },
    tags=["faultwatch", "rocketmq"],
)
def faultwatch_avoidance() -> None:
    @task
    def load(params: dict[str, Any] | None = None, **context: Any) -> dict[str, Any]:
        from pipeline.publish import load_inputs, skip_cycle

        params = params or {}
        number = _cycle_number(params, context)

        def step() -> dict[str, Any]:
            cfg = _config(params)
            reason = skip_cycle(cfg, number)
            if reason is not None:
                raise AirflowSkipException(reason)  # the avoidance tasks are skipped too
            return load_inputs(cfg, number).to_jsonable()

        return _recorded(params, context, step)

    @task
    def recommend(loaded: dict[str, Any], params: dict[str, Any] | None = None, **context: Any) -> dict[str, Any]:
        from pipeline.policy import to_jsonable
        from pipeline.publish import CycleInput
        from pipeline.publish import recommend as decide

        params = params or {}
        return _recorded(params, context,
                         lambda: to_jsonable(decide(CycleInput.from_jsonable(loaded), _config(params))))

    @task
    def validate(
        loaded: dict[str, Any], decision: dict[str, Any], params: dict[str, Any] | None = None, **context: Any
    ) -> bool:
        from airflow.sdk.exceptions import AirflowFailException

        from pipeline.policy import decision_from_jsonable
        from pipeline.publish import CycleInput, reject
        from pipeline.publish import validate as run_gate

        params = params or {}

        def step() -> bool:
            cfg = _config(params)
            inp, dec = CycleInput.from_jsonable(loaded), decision_from_jsonable(decision)
            gate = run_gate(inp, dec, cfg)
            if not gate.success:
                reject(cfg, inp, dec, gate)
                raise AirflowFailException(f"cycle {inp.cycle_id}: {gate.summary()}")
            return True

        return _recorded(params, context, step)

    @task
    def publish(
        loaded: dict[str, Any], decision: dict[str, Any], valid: bool, params: dict[str, Any] | None = None,
        **context: Any,
    ) -> dict[str, Any]:
        from pipeline.policy import decision_from_jsonable
        from pipeline.publish import CycleInput, GateResult
        from pipeline.publish import publish as send

        params = params or {}
        return _skip(_recorded(params, context, lambda: send(
            _config(params), CycleInput.from_jsonable(loaded), decision_from_jsonable(decision), GateResult(valid))))

    @task(trigger_rule="all_done")
    def alerts(params: dict[str, Any] | None = None, **context: Any) -> dict[str, Any]:
        """Whatever the avoidance tasks did: its own inputs, and their ``failed`` or ``rejected`` row."""
        from pipeline.publish import run_alerts

        params = params or {}
        return _skip(run_alerts(_config(params), _cycle_number(params, context)))

    @task(trigger_rule="one_failed")
    def outcome() -> None:
        """Fails the run when a task before it failed: ``alerts`` is the last task and succeeds on its
        own, so without this a run whose list never went out would end green."""
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException("an avoidance task failed (its reason is in publisher_cycles and its log)")

    # TaskFlow passes each task's XComArg where the function takes its value; Airflow's stubs say otherwise
    loaded = load()
    decision = recommend(loaded)  # type: ignore[arg-type]
    sent = publish(loaded, decision, validate(loaded, decision))  # type: ignore[arg-type]
    told = alerts()
    sent >> told
    [sent, told] >> outcome()

faultwatch_avoidance()
