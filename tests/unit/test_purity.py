"""The pure packages import nothing of Spark, Kafka, Airflow or Delta, and ``schemas`` sits at the bottom.

Each pure package (and the entry points that promise to need only it) is imported in a fresh
interpreter with those libraries blocked, so a stray module-level import fails here rather than on
a machine without them. ``schemas`` is the lowest layer: no module in it may import ``pipeline`` or
``streaming``, not even for type checking or inside a function, which the AST scan below covers.
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
    "pipeline.rocketmq": ("pipeline.replay", "pipeline.commands.replay"),
    "pipeline.faults": (),
    "pipeline.lag": (),
    "pipeline.policy": (),
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


def imported_roots(source: str) -> set[str]:
    """Top-level package of every absolute import anywhere in ``source`` (any block, any function)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_scan_sees_imports_in_type_checking_blocks_and_functions() -> None:
    source = "if TYPE_CHECKING:\n    from pipeline.config import X\ndef f():\n    import streaming.job\n"
    assert imported_roots(source) == {"pipeline", "streaming"}


def test_schemas_import_neither_pipeline_nor_streaming() -> None:
    files = sorted((REPO / "schemas").rglob("*.py"))
    assert len(files) >= 8
    offenders = {
        str(path.relative_to(REPO)): sorted(roots & {"pipeline", "streaming"})
        for path in files
        if (roots := imported_roots(path.read_text(encoding="utf-8"))) & {"pipeline", "streaming"}
    }
    assert offenders == {}
