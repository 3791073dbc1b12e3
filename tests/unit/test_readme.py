"""README.md stays true: its sections, its two commands, and every command, flag, table, folder,
path, config key and config example it names."""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import pytest

from faultwatch.cli import build_parser
from pipeline.config import Config, load_config
from schemas.tables import all_tables

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")

# The user guide's sections, in this order; other sections may be added between them.
SECTIONS = (
    "What faultwatch finds",
    "Two commands",
    "Pointing it at your Kafka",
    "Plugging in real producers and consumers",
    "Commands",
    "Tables",
    "Configuration",
    "Avoidance lists and alerts",
    "Prometheus, Grafana, the HTTP API and the live page",
    "Running on a cluster",
    "Tests and benchmarks",
    "Layout",
    "Further reading",
)


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end >= 0 else None]


def table_cells(text: str, column: int = 0) -> list[str]:
    """The ``column``-th cell of each body row of the markdown table(s) in ``text``."""
    rows = [ln for ln in text.splitlines() if ln.startswith("|") and not ln.startswith("|---")]
    return [re.split(r"(?<!\\)\|", r)[column + 1].strip() for r in rows[1:]]


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_the_sections_are_all_there_in_order() -> None:
    titles = re.findall(r"^## (.+)$", README, flags=re.MULTILINE)
    assert [t for t in titles if t in SECTIONS] == list(SECTIONS)


def test_the_two_commands_are_make_demo_and_make_test() -> None:
    block = re.search(r"```sh\n(.*?)```", section("Two commands"), flags=re.DOTALL)
    assert block is not None
    assert [ln.split("#")[0].strip() for ln in block.group(1).splitlines()] == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^demo:", makefile, flags=re.MULTILINE) and re.search(r"^test:", makefile, flags=re.MULTILINE)
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines() if ln and not ln.startswith("#")]
    assert ci[-1] == "make test"


def test_every_command_and_flag_in_the_table_exists_and_every_command_is_listed() -> None:
    commands = subcommands(build_parser())
    listed = set()
    for cell in table_cells(section("Commands")):
        words = cell.strip("`").split()
        assert words[0] == "faultwatch", cell
        parser = commands[words[1]]
        listed.add(words[1])
        nested = subcommands(parser)
        if nested:
            parser = nested[words[2]]
        options = {s for a in parser._actions for s in a.option_strings}
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", cell):
            assert flag in options, (cell, flag)
    assert listed == set(commands)


def test_the_tables_listed_are_the_tables_faultwatch_writes() -> None:
    listed = set()
    for cell in table_cells(section("Tables")):
        listed |= set(re.findall(r"`(\w+)`", cell))
    assert listed == set(all_tables())


def test_the_layout_lists_every_folder() -> None:
    listed = {cell.strip("`").rstrip("/") for cell in table_cells(section("Layout"))}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    folders = {p.split("/")[0] for p in tracked if "/" in p and not p.startswith(".")}
    assert listed == folders


def test_every_path_named_exists() -> None:
    tops = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")} - {"data"}
    for token in set(re.findall(r"`([^`\s]+)`", README)):
        path = token.split("::")[0]
        if "/" in path and path.split("/")[0] in tops and not re.search(r"[A-Z]{3,}|\*", path):
            assert (ROOT / path).exists(), token


def test_every_config_key_named_exists() -> None:
    cfg = load_config(None)
    for section_name, key in set(re.findall(r"`([a-z_]+)\.([a-z_0-9]+)`", README)):
        if section_name in Config.__dataclass_fields__:
            assert hasattr(getattr(cfg, section_name), key), f"{section_name}.{key}"


def test_the_kafka_example_is_a_valid_config(tmp_path: Path) -> None:
    example = re.search(r"```toml\n(.*?)```", section("Pointing it at your Kafka"), flags=re.DOTALL)
    assert example is not None
    path = tmp_path / "my.toml"
    path.write_text(example.group(1), encoding="utf-8")
    cfg = load_config(path, env={"FAULTWATCH_KAFKA_SASL_PASSWORD": "s3cret"})
    assert cfg.kafka.bootstrap_servers == "kafka-1:9092,kafka-2:9092"
    assert cfg.kafka.sasl_password is not None and cfg.kafka.sasl_password.value == "s3cret"


@pytest.mark.parametrize("doc", ["docs/architecture.md", "docs/lag.md", "docs/performance.md"])
def test_the_docs_the_readme_points_to_are_there(doc: str) -> None:
    assert f"]({doc})" in README and (ROOT / doc).is_file()
