"""The alert lifecycle's pure rules: fire once, repeat while active, resolve, keep undelivered resolutions."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from pipeline.config import ALERT_KINDS
from pipeline.policy.model import Episode
from pipeline.publish import alertmanager, alerts, lifecycle
from pipeline.publish.lifecycle import Condition, advance, broker_conditions, delivered, group_conditions
from schemas.alerts import ALERT_SCHEMA_PATH

REPEAT = 300_000


def cond(alert_id: str = "broker_fault|c1|b2", summary: str = "b2 down") -> Condition:
    return Condition(alert_id, "broker_fault", "critical", "c1", {"broker": "b2"}, summary, {"episode_id": "e1"})


def ids(alerts) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    return [(a.alert_id, a.status) for a in alerts]


def test_fires_once_repeats_after_the_interval_and_resolves_once() -> None:
    s1 = advance((), [cond()], 1_000, REPEAT)
    assert ids(s1.records) == [("broker_fault|c1|b2", "firing")] and ids(s1.to_alertmanager) == ids(s1.records)
    s2 = advance(delivered(s1, True), [cond(summary="b2 still down")], 61_000, REPEAT)
    assert s2.records == () and ids(s2.to_alertmanager) == [("broker_fault|c1|b2", "firing")]
    assert (s2.alerts[0].starts_ms, s2.alerts[0].summary) == (1_000, "b2 still down")
    s3 = advance(delivered(s2, True), [cond()], 301_000, REPEAT)  # the repeat interval has passed
    assert ids(s3.records) == [("broker_fault|c1|b2", "firing")] and s3.records[0].starts_ms == 1_000
    s4 = advance(delivered(s3, True), [], 361_000, REPEAT)
    assert ids(s4.records) == [("broker_fault|c1|b2", "resolved")]
    assert (s4.records[0].starts_ms, s4.records[0].ends_ms) == (1_000, 361_000)
    assert delivered(s4, True) == ()
    assert advance((), [], 421_000, REPEAT) == lifecycle.Step((), (), ())


def test_a_resolution_alertmanager_did_not_take_is_kept_and_sent_again() -> None:
    s1 = advance((), [cond()], 1_000, REPEAT)
    s2 = advance(delivered(s1, True), [], 61_000, REPEAT)
    kept = delivered(s2, False)
    assert ids(kept) == [("broker_fault|c1|b2", "resolved")]
    s3 = advance(kept, [], 121_000, REPEAT)
    assert s3.records == ()  # the topic already has the resolution
    assert ids(s3.to_alertmanager) == [("broker_fault|c1|b2", "resolved")] and s3.to_alertmanager[0].ends_ms == 61_000
    assert delivered(s3, True) == ()


def test_a_condition_that_comes_back_fires_again_with_a_new_start() -> None:
    s1 = advance((), [cond()], 1_000, REPEAT)
    s2 = advance(delivered(s1, True), [], 61_000, REPEAT)
    s3 = advance(delivered(s2, False), [cond()], 121_000, REPEAT)
    assert ids(s3.records) == [("broker_fault|c1|b2", "firing")] and s3.records[0].starts_ms == 121_000


def episode(state: str, broker: str = "b2", closed: int | None = None) -> Episode:
    return Episode(f"c1|{broker}|100", "c1", broker, 100, closed, state, "quorum", 5, 6, 300, 150, 3000.0, 200)


@pytest.mark.parametrize(
    ("state", "fires"), [("suspected", True), ("open", True), ("closed", False)],
)
def test_broker_alert_per_episode_state(state: str, fires: bool) -> None:
    found = broker_conditions([episode(state, closed=150 if state == "closed" else None)])
    assert [c.alert_id for c in found] == ([f"broker_fault|c1|b2|{state}"] if fires else [])
    if fires:
        assert found[0].labels == {"broker": "b2", "state": state} and found[0].details["state"] == state


def group(status: str, ts: int = 1_000, time_lag: int | None = 1_000, name: str = "G") -> dict:  # type: ignore[type-arg]
    return {"cluster": "c1", "consumer_group": name, "ts_ms": ts, "status": status, "max_time_lag_ms": time_lag,
            "alert_reason": None}


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([group("OK")], []),
        ([group("WARN")], [("consumer_lag|c1|G|WARN", "warning")]),  # the rule's severity for every status
        ([group("STALL")], [("consumer_lag|c1|G|STALL", "warning")]),
        ([group("STOP")], [("consumer_lag|c1|G|STOP", "warning")]),
        ([group("REWIND")], [("consumer_lag|c1|G|REWIND", "warning")]),
        ([group("UNKNOWN")], []),
        ([group("OK", time_lag=300_001)], [("consumer_lag|c1|G|time_lag", "warning")]),  # over the bound
        ([group("OK", time_lag=300_000)], []),  # at the bound
        ([group("OK", time_lag=None)], []),
        ([group("STALL", ts=1), group("OK", ts=2)], []),  # the newest row counts
        ([group("OK", ts=2), group("STALL", ts=1)], []),
    ],
)
def test_group_alert_rules(rows: list[dict], expected: list[tuple[str, str]]) -> None:  # type: ignore[type-arg]
    assert [(c.alert_id, c.severity) for c in group_conditions(rows, 300_000)] == expected


def test_config_kinds_are_the_lifecycle_kinds() -> None:
    assert ALERT_KINDS == lifecycle.ALERT_KINDS


def test_records_match_the_published_json_schema() -> None:
    schema = json.loads(ALERT_SCHEMA_PATH.read_text())
    s1 = advance((), [cond()], 1_000, REPEAT)
    s2 = advance(delivered(s1, True), [], 61_000, REPEAT)
    for alert in s1.records + s2.records:
        _, record = alerts.lifecycle_record(alert, "61000", 61_000)
        jsonschema.validate(json.loads(alerts.encode_alert(record)), schema)
    _, gate = alerts.gate_alert("61000", 61_000, ("x",), ["c1"], None)
    jsonschema.validate(json.loads(alerts.encode_alert(gate)), schema)
    bad = dict(alerts.lifecycle_record(s2.records[0], "61000", 61_000)[1], ends_ms=None)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_alertmanager_payload_ends_only_resolved_alerts() -> None:
    s1 = advance((), [cond()], 1_000, REPEAT)
    s2 = advance(delivered(s1, True), [], 61_500, REPEAT)
    firing, resolved = alertmanager.payload(s1.records[0]), alertmanager.payload(s2.records[0])
    assert firing["labels"] == resolved["labels"] == {
        "alertname": "FaultwatchBrokerFaultEpisode", "cluster": "c1", "severity": "critical", "broker": "b2"}
    assert (firing["startsAt"], "endsAt" in firing) == ("1970-01-01T00:00:01.000Z", False)
    assert resolved["endsAt"] == "1970-01-01T00:01:01.500Z"


def cycle(n: int, status: str, step: str = "avoidance") -> dict:  # type: ignore[type-arg]
    return {"cycle_id": str(n), "cycle_number": n, "step": step, "status": status, "failed_checks": ["x"],
            "reason": "Kafka k:9092 topic t: KafkaTimeoutError" if status == "failed" else None}


@pytest.mark.parametrize(
    ("rows", "fires"),
    [
        ([], False),
        ([cycle(1, "published")], False),
        ([cycle(1, "published"), cycle(2, "rejected")], True),
        ([cycle(2, "rejected"), cycle(3, "published")], False),  # a later publication resolves it
        ([cycle(2, "rejected"), cycle(3, "sent", step="alerts")], True),
        ([cycle(2, "failed")], "failed"),  # a failed cycle alerts too, under its own name
        ([cycle(2, "failed"), cycle(2, "published")], False),  # failed, then finished by a retry
        ([cycle(2, "failed"), cycle(3, "published")], False),
    ],
)
def test_refusal_alert_follows_the_newest_decided_cycle(rows: list[dict], fires: bool | str) -> None:  # type: ignore[type-arg]
    found = lifecycle.refusal_conditions(rows, "pub")
    if fires == "failed":
        assert [(c.alert_id, c.details) for c in found] == [
            ("avoidance_failed|pub", {"cycle_id": "2", "reason": "Kafka k:9092 topic t: KafkaTimeoutError"})]
        s = advance((), found, 1_000, REPEAT)
        assert alertmanager.labels(s.records[0]) == {
            "alertname": "FaultwatchAvoidanceFailed", "severity": "critical", "publisher": "pub"}
        return
    assert [c.alert_id for c in found] == (["avoidance_refused|pub"] if fires else [])
    if fires:
        s = advance((), found, 1_000, REPEAT)
        assert alertmanager.labels(s.records[0]) == {
            "alertname": "FaultwatchAvoidanceRefused", "severity": "critical", "publisher": "pub"}
        key, record = alerts.lifecycle_record(s.records[0], "1000", 1_000)
        assert (key, record["cluster"]) == ("faultwatch-publisher", None)
        jsonschema.validate(record, json.loads(ALERT_SCHEMA_PATH.read_text()))


def test_alerts_config_is_validated_naming_the_key() -> None:
    from pipeline.config import ConfigError, from_dict

    cfg = from_dict({"alerts": {"alertmanager_urls": ["http://127.0.0.1:9093"], "kinds": ["broker_fault"]}})
    assert (cfg.alerts.alertmanager_urls, cfg.alerts.kinds) == (("http://127.0.0.1:9093",), ("broker_fault",))
    for raw, message in [
        ({"kinds": ["nope"]}, "alerts.kinds"),
        ({"alertmanager_urls": ["127.0.0.1:9093"]}, "alerts.alertmanager_urls"),
        ({"repeat_interval_s": 0}, "alerts.repeat_interval_s"),
        ({"timeout_s": "soon"}, "alerts.timeout_s"),
    ]:
        with pytest.raises(ConfigError, match=message):
            from_dict({"alerts": raw})


def test_an_unacknowledged_resolution_is_retried_for_a_bounded_time() -> None:
    s1 = advance((), [cond()], 1_000, REPEAT, retry_resolution_ms=120_000)
    s2 = advance(delivered(s1, True), [], 61_000, REPEAT, retry_resolution_ms=120_000)
    s3 = advance(delivered(s2, False), [], 180_999, REPEAT, retry_resolution_ms=120_000)
    assert ids(s3.to_alertmanager) == [("broker_fault|c1|b2", "resolved")]
    s4 = advance(delivered(s3, False), [], 181_000, REPEAT, retry_resolution_ms=120_000)
    assert s4 == lifecycle.Step((), (), ())


def rule_identity(name: str) -> tuple[set[str], dict[str, str]]:
    """The label names an alert of the shipped Prometheus rule ``name`` carries, and its fixed labels."""
    import re

    import yaml

    rules = yaml.safe_load((Path(__file__).resolve().parents[2] / "deploy/prometheus/faultwatch-rules.yml").read_text())
    [rule] = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == name]
    by = re.search(r"by \(([^)]*)\)", rule["expr"])
    assert by is not None, f"{name}: aggregate by its identity labels"
    names = {n.strip() for n in by.group(1).split(",")} | set(rule["labels"]) | {"alertname"}
    return names, {"alertname": name, **rule["labels"]}


@pytest.mark.parametrize(
    ("condition", "rule"),
    [
        (broker_conditions([episode("open")])[0], "FaultwatchBrokerFaultEpisode"),
        (broker_conditions([episode("suspected")])[0], "FaultwatchBrokerFaultEpisode"),
        (group_conditions([group("STALL")], 300_000)[0], "FaultwatchConsumerGroupNotOK"),
        (group_conditions([group("WARN")], 300_000)[0], "FaultwatchConsumerGroupNotOK"),
    ],
)
def test_publisher_alerts_carry_the_prometheus_rules_identity(condition: Condition, rule: str) -> None:
    """One alert path: Alertmanager fingerprints labels, so the same fault from the rule and from the
    publisher must carry exactly the same label names and the rule's fixed values."""
    names, fixed = rule_identity(rule)
    labels = alertmanager.labels(advance((), [condition], 1_000, REPEAT).records[0])
    assert set(labels) == names
    assert {k: labels[k] for k in fixed} == fixed
