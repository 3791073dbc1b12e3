"""``pipeline.rocketmq`` (and the replay it backs) import nothing of pyspark, kafka or airflow."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = textwrap.dedent(
    """
    import importlib, pkgutil, sys

    BLOCKED = ("pyspark", "kafka", "airflow")

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"blocked import of {name}")
            return None

    sys.meta_path.insert(0, Block())
    import pipeline.rocketmq as pkg
    names = [m.name for m in pkgutil.walk_packages(pkg.__path__, "pipeline.rocketmq.")]
    for name in names + ["pipeline.replay", "pipeline.commands.replay"]:
        importlib.import_module(name)
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    print(len(names), leaked)
    """
)


def test_rules_import_without_spark_kafka_or_airflow() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    count, leaked = done.stdout.split(" ", 1)
    assert int(count) >= 8 and leaked.strip() == "[]"
