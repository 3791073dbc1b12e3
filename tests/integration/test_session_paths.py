"""Spark's Python processes import faultwatch's code, not whatever the working directory holds.

A process started as ``python -m module`` puts its working directory first on ``sys.path``, and
Spark starts its Python workers that way in the directory the job was started from. faultwatch's
packages have common names (``pipeline``, ``streaming``, ``schemas``): started from a project that
has a ``pipeline/`` of its own, the workers imported that one instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import pipeline

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DRIVER = """
import sys
from pipeline.config import Config
from streaming.session import spark_session

def where(batches):
    import pyarrow as pa
    import pipeline
    import streaming
    for _ in batches:
        yield pa.record_batch([pa.array([f"{pipeline.__file__} {streaming.__file__}"])], names=["path"])

import dataclasses
cfg = Config()
spark = spark_session(dataclasses.replace(cfg, spark=dataclasses.replace(cfg.spark, master="local[1]")))
for row in spark.range(1, numPartitions=1).mapInArrow(where, "path string").collect():
    print("WORKER", row.path)
spark.stop()
"""


def test_workers_ignore_packages_in_the_working_directory(tmp_path: Path) -> None:
    work = tmp_path / "project"  # a user's project with packages of the same names
    for name in ("pipeline", "streaming"):
        (work / name).mkdir(parents=True)
        (work / name / "__init__.py").write_text(f"raise ImportError('the project directory\\'s {name}')\n")
    script = tmp_path / "driver.py"  # its directory, not the project, is the script's sys.path[0]
    script.write_text(DRIVER)
    repo = str(Path(pipeline.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": repo}
    done = subprocess.run([sys.executable, str(script)], cwd=work, env=env, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = [x for x in done.stdout.splitlines() if x.startswith("WORKER ")]
    assert line.split()[1:] == [str(Path(repo, "pipeline", "__init__.py")), str(Path(repo, "streaming", "__init__.py"))]
