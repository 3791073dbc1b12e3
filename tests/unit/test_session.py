"""What the session sets from the config alone (no JVM started here)."""

from __future__ import annotations

import pytest

from streaming.session import is_local_path


@pytest.mark.parametrize(("path", "local"), [
    ("data/checkpoints", True), ("/var/lib/faultwatch/checkpoints", True), ("file:///tmp/cp", True),
    ("hdfs://nn:8020/faultwatch/cp", False), ("s3a://bucket/cp", False), ("abfss://c@a.dfs.core.windows.net/cp", False),
])
def test_only_local_checkpoint_roots_get_the_fork_free_checkpoint_manager(path: str, local: bool) -> None:
    assert is_local_path(path) is local
