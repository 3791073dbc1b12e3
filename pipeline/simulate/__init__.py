"""A deterministic discrete-event model of a RocketMQ cluster that emits faultwatch's events.

Typical use::

    from pipeline.simulate import MemorySink, Simulation, load_scenario

    sim = Simulation(load_scenario("broker-outage"), seed=7)
    sink = MemorySink()
    sim.run(sink)                       # as fast as possible; speed=1.0 paces to wall time
    sends = sink.events("send_result")  # schemas.events.SendResult objects
    sim.client_windows()                # the avoidance windows the simulated clients used
"""

from pipeline.simulate.client_state import ClientWindow
from pipeline.simulate.engine import Batch, RunStats, Simulation, run_to_memory
from pipeline.simulate.scenario import (
    DEFAULT_EPOCH_MS,
    Scenario,
    ScenarioError,
    available_scenarios,
    load_scenario,
    scenario_from_dict,
)
from pipeline.simulate.sinks import JsonLinesSink, KafkaSink, MemorySink, Sink, SinkError

__all__ = [
    "DEFAULT_EPOCH_MS",
    "Batch",
    "ClientWindow",
    "JsonLinesSink",
    "KafkaSink",
    "MemorySink",
    "RunStats",
    "Scenario",
    "ScenarioError",
    "Simulation",
    "Sink",
    "SinkError",
    "available_scenarios",
    "load_scenario",
    "run_to_memory",
    "scenario_from_dict",
]
