"""``faultwatch-python``: this environment's interpreter, for the Python processes Spark starts.

Spark starts the data source's planners as ``<python> -m pyspark.daemon <module>`` whatever
``spark.python.daemon.module`` says, and pyspark's daemon prints a BrokenPipeError traceback into
the job's log whenever the JVM drops an idle planner worker (a minute after its last call, and
when it stops). This command runs the same interpreter with faultwatch's daemon in its place
(:mod:`streaming.daemon`, which ends such a worker quietly) and passes anything else through.
A locally started session gets the same from the wrapper in :mod:`streaming.session`; under
``spark-submit`` the JVM starts before faultwatch runs, so the command goes in
``PYSPARK_DRIVER_PYTHON`` (README: the streaming job under spark-submit).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


def exec_args(args: Sequence[str]) -> list[str]:
    """The interpreter's arguments: ``-m pyspark.daemon`` becomes ``-m streaming.daemon``."""
    if list(args[:2]) == ["-m", "pyspark.daemon"]:
        return ["-m", "streaming.daemon", *args[2:]]
    return list(args)


def main() -> None:
    os.environ["PYTHONSAFEPATH"] = "1"  # -m must not import from the working directory (streaming.session)
    os.execv(sys.executable, [sys.executable, *exec_args(sys.argv[1:])])


if __name__ == "__main__":
    main()
