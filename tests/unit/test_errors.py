"""Every exception class faultwatch defines derives from ``FaultwatchError`` and keeps its std base."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from schemas.errors import FaultwatchError

PACKAGES = ("schemas", "pipeline", "streaming", "faultwatch")

# The standard base each class keeps, so handlers written for it still match.
EXPECTED = {
    "pipeline.config.ConfigError": ValueError,
    "pipeline.simulate.scenario.ScenarioError": ValueError,
    "pipeline.replay.CaseError": ValueError,
    "pipeline.producer.InvalidList": ValueError,
    "pipeline.simulate.sinks.SinkError": RuntimeError,
    "pipeline.kafka_local.LocalKafkaError": RuntimeError,
    "pipeline.kafka_apache.ApacheKafkaError": RuntimeError,
    "streaming.kafka_source.KafkaUnavailableError": RuntimeError,
    "streaming.kafka_source.UndecodableBatchError": RuntimeError,
    "streaming.kafka_gaps.DataLossError": RuntimeError,
    "streaming.session.JavaMissingError": RuntimeError,
    "schemas.fields.Invalid": Exception,
    "pipeline.rocketmq.javalang.JavaException": Exception,
    "pipeline.rocketmq.javalang.IllegalArgumentException": Exception,
    "pipeline.rocketmq.javalang.NullPointerException": Exception,
}


def project_exceptions() -> dict[str, type[BaseException]]:
    """Every exception class defined (not merely imported) in a module of the project's packages."""
    found: dict[str, type[BaseException]] = {}
    for package in PACKAGES:
        pkg = importlib.import_module(package)
        names = [package] + [m.name for m in pkgutil.walk_packages(pkg.__path__, f"{package}.")]
        for name in names:
            module = importlib.import_module(name)
            for _, obj in inspect.getmembers(module, inspect.isclass):
                if issubclass(obj, BaseException) and obj.__module__ == name:
                    found[f"{name}.{obj.__qualname__}"] = obj
    return found


def test_every_project_exception_derives_from_faultwatch_error() -> None:
    found = project_exceptions()
    found.pop("schemas.errors.FaultwatchError")
    assert set(EXPECTED) <= set(found), sorted(set(EXPECTED) - set(found))
    outside = sorted(name for name, cls in found.items() if not issubclass(cls, FaultwatchError))
    assert outside == []


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_keeps_its_standard_base(name: str) -> None:
    module_name, _, class_name = name.rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    assert issubclass(cls, FaultwatchError) and issubclass(cls, EXPECTED[name])


def test_a_config_error_still_names_the_key() -> None:
    from pipeline.config import ConfigError, from_dict

    with pytest.raises(FaultwatchError) as caught:
        from_dict({"stream": {"trigger_intervl_s": 1}})
    assert isinstance(caught.value, ConfigError)
    assert "stream.trigger_intervl_s" in str(caught.value)
