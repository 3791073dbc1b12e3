"""delta-spark, Delta Lake's own Spark connector, as a Spark user runs it on faultwatch's tables.

delta-spark 4.4 is built for Spark 4.2 (it fails on pyspark 4.3, faultwatch's Spark, with
``NoSuchMethodError``s inside Spark's planner), so the tests run it in an interpreter of its own:
a virtual environment under ``~/.cache/faultwatch`` with pyspark 4.2.0 and the ``delta-spark``
package, and Delta's jars resolved through Maven (``pipeline.jvm``). ``python -m tests.deltaspark``
prepares both (``scripts/bootstrap.sh test`` does); later runs need no network.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from pipeline.jvm import cache_dir, maven_classpath

SPARK_VERSION = "4.2.0"
DELTA_VERSION = "4.4.0"  # the newest delta-spark on Maven Central built for Spark 4.2
DELTA_ARTIFACT = f"io.delta:delta-spark_4.2_2.13:{DELTA_VERSION}"
CHECK_SCRIPT = Path(__file__).resolve().parent / "check.py"


def venv_dir() -> Path:
    return cache_dir().parent / f"delta-spark-{DELTA_VERSION}-spark-{SPARK_VERSION}"


def delta_jars() -> list[Path]:
    """delta-spark's and delta-storage's jars: Spark itself provides the rest of what Maven lists."""
    jars = maven_classpath(f"delta-spark-{DELTA_VERSION}", [DELTA_ARTIFACT])
    mine = [j for j in jars if "/io/delta/delta-spark" in j.as_posix() or "/io/delta/delta-storage/" in j.as_posix()]
    if len(mine) != 2:
        raise RuntimeError(f"expected delta-spark and delta-storage among {DELTA_ARTIFACT}'s jars, got {mine}")
    return mine


def interpreter() -> Path:
    """The Python of the pyspark-4.2 environment, created (pip, cached) on first use."""
    folder = venv_dir()
    python = folder / "bin" / "python"
    stamp = folder / ".installed"
    if stamp.exists() and python.exists():
        return python
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--clear", str(folder)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    f"pyspark=={SPARK_VERSION}", f"delta-spark=={DELTA_VERSION}"], check=True)
    stamp.touch()
    return python


def run_check(tables: dict[str, str], maintain: Sequence[str], out_dir: Path,
              timeout_s: float = 1800.0) -> subprocess.CompletedProcess[str]:
    """Run ``check.py`` on ``tables`` (name -> path) in the delta-spark environment, with ``OPTIMIZE``
    and ``VACUUM`` on those named in ``maintain``; it writes under ``out_dir``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_", "PYTHONPATH"))}
    env["FAULTWATCH_DELTA_JARS"] = ",".join(str(j) for j in delta_jars())
    args = [str(interpreter()), str(CHECK_SCRIPT), str(out_dir), "--maintain", ",".join(maintain), *(f"{k}={v}" for k, v in tables.items())]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
