"""Run faultwatch as a real process (for kill and spark-submit tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline.config import Config

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def write_config(cfg: Config, path: Path, **extra_sections: dict[str, object]) -> Path:
    """A TOML file for ``cfg``'s connection, topics, storage and stream settings."""
    lines = [
        "[kafka]",
        f'bootstrap_servers = "{cfg.kafka.bootstrap_servers}"',
        f"connect_timeout_s = {cfg.kafka.connect_timeout_s}",
        "[topics]",
        *(f'{k} = "{getattr(cfg.topics, k)}"' for k in ("send_results", "consumer_progress", "group_membership", "avoidance", "alerts")),
        "[storage]",
        f'root = "{cfg.storage.root}"',
        f'checkpoint_root = "{cfg.storage.checkpoint_root}"',
        f'publish_dir = "{cfg.storage.publish_dir}"',
        f'writer = "{cfg.storage.writer}"',
        "[stream]",
        f"trigger_interval_s = {cfg.stream.trigger_interval_s}",
        f"max_events_per_batch = {cfg.stream.max_events_per_batch}",
        f"watermark_delay_s = {cfg.stream.watermark_delay_s}",
    ]
    for section, values in extra_sections.items():
        lines.append(f"[{section}]")
        lines.extend(f"{k} = {v!r}".replace("'", '"') for k, v in values.items())
    path.write_text("\n".join(lines) + "\n")
    return path


def start_faultwatch(*args: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    full_env = {**os.environ, **(env or {})}
    with open(log, "ab") as out:
        return subprocess.Popen(
            [str(BIN / "faultwatch"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
            env=full_env,
            start_new_session=True,  # so a kill reaches the JVM and Python workers too
        )


def kill_tree(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)


def wait_for(predicate, timeout_s: float, what: str, proc: subprocess.Popen[bytes] | None = None, log: Path | None = None) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            text = log.read_text(errors="replace")[-3000:] if log else ""
            raise AssertionError(f"process exited ({proc.returncode}) while waiting for {what}:\n{text}")
        time.sleep(0.25)
    text = log.read_text(errors="replace")[-3000:] if log else ""
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}:\n{text}")


def committed_batches(cfg: Config, query: str) -> int:
    folder = Path(cfg.storage.checkpoint_root) / query / "faultwatch-reports"
    return len(list(folder.glob("*.json"))) if folder.exists() else 0
