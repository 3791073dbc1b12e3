"""The layers import one way, and the pure packages import nothing of Spark, Kafka, Airflow or Delta.

The layers, bottom up: ``schemas`` <- ``pipeline`` <- ``streaming`` <- ``faultwatch`` (the entry
points: CLI and demo). The Airflow DAG sits beside the entry points but needs only ``pipeline`` and
``schemas``. No product module imports ``tests`` or ``bench``. An AST scan of every file checks
this, imports inside functions and ``TYPE_CHECKING`` blocks and ``importlib.import_module`` on a
literal name included. Each pure package (and the entry points that promise to need only it) is
also imported in a fresh interpreter with those libraries blocked, so a stray module-level import
fails here rather than on a machine without them.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BLOCKED = ("pyspark", "kafka", "airflow", "deltalake")

# package -> further modules that must import with the package's guarantee
PURE = {
    "pipeline.rocketmq": ("pipeline.replay", "faultwatch.commands.replay"),
    "pipeline.faults": (),
    "pipeline.lag": (),
    "pipeline.policy": (),
}

PROJECT = {"schemas", "pipeline", "streaming", "faultwatch", "tests", "bench"}
NOT_PRODUCT = {"tests", "bench"}
# folder -> the project's top-level packages its modules may import (besides itself)
LAYERS = {
    "schemas": set(),
    "pipeline": {"schemas"},
    "streaming": {"schemas", "pipeline"},
    "faultwatch": {"schemas", "pipeline", "streaming"},
    "airflow/dags": {"schemas", "pipeline"},
}

PROBE = textwrap.dedent(
    """
    import importlib, pkgutil, sys

    BLOCKED = {blocked!r}

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"blocked import of {{name}}")
            return None

    sys.meta_path.insert(0, Block())
    pkg = importlib.import_module({package!r})
    names = [m.name for m in pkgutil.walk_packages(pkg.__path__, {package!r} + ".")]
    for name in names + {extra!r}:
        importlib.import_module(name)
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    print(len(names), leaked)
    """
)


@pytest.mark.parametrize("package", sorted(PURE))
def test_pure_package_imports_without_spark_kafka_airflow_or_delta(package: str) -> None:
    probe = PROBE.format(blocked=BLOCKED, package=package, extra=list(PURE[package]))
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    count, leaked = done.stdout.split(" ", 1)
    assert int(count) >= 3 and leaked.strip() == "[]"


def _literal_prefix(node: ast.expr) -> str | None:
    """The module name an ``import_module`` argument starts with, when it is written in the call."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value
    return None


def imported_roots(source: str) -> set[str]:
    """Top-level package of every absolute import anywhere in ``source`` (any block, any function)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__") and (prefix := _literal_prefix(node.args[0])):
                roots.add(prefix.split(".")[0])
    return roots


def test_the_scan_sees_imports_in_type_checking_blocks_functions_and_import_module() -> None:
    source = (
        "if TYPE_CHECKING:\n    from pipeline.config import X\ndef f():\n    import streaming.job\n"
        "    importlib.import_module(f'faultwatch.commands.{name}')\n    __import__('tests.doubles')\n"
        "    importlib.import_module(name)\nfrom . import sibling\n"
    )
    assert imported_roots(source) == {"pipeline", "streaming", "faultwatch", "tests"}


def layer_offenders(folder: str) -> dict[str, list[str]]:
    """Files under ``folder`` importing a project package its layer may not, with those packages."""
    files = sorted((REPO / folder).rglob("*.py"))
    assert files, folder
    allowed = LAYERS[folder] | {folder.split("/")[0]}
    offenders = {}
    for path in files:
        wrong = (imported_roots(path.read_text(encoding="utf-8")) & PROJECT) - allowed
        if wrong:
            offenders[str(path.relative_to(REPO))] = sorted(wrong)
    return offenders


@pytest.mark.parametrize("folder", sorted(LAYERS))
def test_each_layer_imports_only_the_layers_below_it(folder: str) -> None:
    assert layer_offenders(folder) == {}


def test_no_product_layer_may_import_tests_or_bench() -> None:
    assert all(not (allowed & NOT_PRODUCT) for allowed in LAYERS.values())


def test_every_top_level_package_has_a_layer() -> None:
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")}
    assert packages == set(LAYERS) - {"airflow/dags"}
