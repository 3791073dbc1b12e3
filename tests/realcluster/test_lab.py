"""``faultwatch lab`` end to end, shortened: its own Kafka and RocketMQ cluster (not the session's), six
real producers, the poller, the live stream and the publisher; broker-b killed and restarted,
broker-c frozen and resumed. The printed facts are the verdict: every fault item of the producers'
own tables matched in every phase, the episode on broker-b opened and closed, and the producers with
the feed failed fewer first attempts on the dead broker than those without.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.integration.processes import BIN, REPO

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_lab_prints_the_oracle_the_episode_and_the_feeds_effect(tmp_path: Path) -> None:
    done = subprocess.run([str(BIN / "faultwatch"), "lab", "--root", str(tmp_path / "lab"), "--phase", "15"],
                          cwd=REPO, capture_output=True, text=True, timeout=1500, check=False)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]
    print(done.stdout)
    [line] = [x for x in done.stdout.splitlines() if x.startswith("lab facts: ")]
    facts = json.loads(line.removeprefix("lab facts: "))
    oracle = facts["oracle"]
    assert set(oracle) == {"warm", "killed", "recovered", "frozen"}
    assert all(matched == total for matched, total in oracle.values()), oracle
    assert oracle["killed"][1] >= 2, oracle  # the kill opened windows in the tolerant producers' tables
    episode = facts["episode"]
    assert episode is not None and episode["opened_after_kill_s"] >= 0, episode
    assert episode["closed_after_kill_s"] is not None, episode
    failures = facts["first_attempt_failures"]
    assert failures["with_feed"] < failures["without_feed"], failures
