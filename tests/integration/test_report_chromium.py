"""The report opens in headless Chromium without console errors and every plot renders something.

Chromium (Debian's ``chromium`` package) is driven over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: fd 3 in, fd 4 out, NUL-separated JSON), so no extra client library
is needed. Rendering is checked twice: the DOM (drawn SVG elements with a non-empty box per figure)
and pixels (a screenshot of each figure is not blank).
"""

from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import select
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib import image as mpimg

from pipeline.report import write_report
from pipeline.simulate import run_to_memory
from tests.unit.test_report import write_silver

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)
PLOTS = ("availability", "broker_health", "group_lag", "queue_ownership")


def _high_fd(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


def _navigated(event: dict[str, Any], loader_id: str) -> bool:
    """Whether ``event`` is the main frame committing the document of ``loader_id``."""
    if event.get("method") != "Page.frameNavigated":
        return False
    frame = event.get("params", {}).get("frame", {})
    return not frame.get("parentId") and frame.get("loaderId") == loader_id


class Chromium:
    """Just enough of the DevTools protocol: commands, events, one page session."""

    def __init__(self, user_data_dir: Path, timeout_s: float = 60.0) -> None:
        binary = shutil.which("chromium") or shutil.which("chromium-browser")
        if binary is None:
            pytest.fail("chromium is not installed (the test set-up runs: apt-get install -y chromium)")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # Chromium reads commands on fd 3 and writes on fd 4: bash moves the pipe ends there
        # (from above 9, so moving one cannot overwrite the other; dash only knows fds 0-9).
        to_browser_r, from_browser_w = (_high_fd(fd) for fd in (to_browser_r, from_browser_w))
        wire = f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w} {to_browser_r}<&- {from_browser_w}>&-'
        self.proc = subprocess.Popen(
            ["/bin/bash", "-c", wire, binary, *CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}",
             "--remote-debugging-pipe", "--window-size=1280,1000", "about:blank"],
            pass_fds=(to_browser_r, from_browser_w), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self.timeout_s = timeout_s
        self.events: list[dict[str, Any]] = []
        self._checked = 0  # events wait_for has looked at
        self.loader_id = ""  # the document loaded by the last open()
        self._buf = b""
        self._next_id = 0
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable", session=True)

    def call(self, method: str, params: dict[str, Any] | None = None, session: bool = False) -> dict[str, Any]:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def _read(self, deadline: float | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s if deadline is None else deadline
        while b"\0" not in self._buf:
            ready, _, _ = select.select([self._from_browser], [], [], max(deadline - time.monotonic(), 0))
            if not ready:
                raise TimeoutError("no answer from Chromium")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def open(self, url: str) -> None:
        """Navigate and wait for this navigation's load event (not a late one of the page before)."""
        self.events.clear()
        self._checked = 0
        result = self.call("Page.navigate", {"url": url}, session=True)
        if result.get("errorText"):
            raise RuntimeError(f"{url} did not load: {result['errorText']}")
        self.loader_id = result.get("loaderId", "")
        self.wait_for(lambda e: _navigated(e, self.loader_id), self.timeout_s, f"{url} committing")
        self.wait_for(lambda e: e.get("method") == "Page.loadEventFired", self.timeout_s, f"{url} loading")

    def wait_for(self, wanted: Callable[[dict[str, Any]], bool], timeout_s: float, what: str) -> dict[str, Any]:
        """The first event that ``wanted`` accepts, among those not looked at yet (each call goes on
        after the event the last one returned); a timeout lists the page's events, so a failure
        says how far the navigation got."""
        deadline = time.monotonic() + timeout_s
        while True:
            while self._checked < len(self.events):
                event = self.events[self._checked]
                self._checked += 1
                if wanted(event):
                    return event
            try:
                self.events.append(self._read(deadline))
            except TimeoutError:
                seen = [f"{e.get('method')} {json.dumps(e.get('params', {}))[:160]}" for e in self.events
                        if str(e.get("method", "")).startswith("Page.")]
                raise TimeoutError(f"{what}: not within {timeout_s:g} s; page events so far: {seen}") from None

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"]["value"]

    def screenshot(self, clip: dict[str, float]) -> np.ndarray:
        params = {"format": "png", "clip": {**clip, "scale": 1}, "captureBeyondViewport": True}
        data = self.call("Page.captureScreenshot", params, session=True)["data"]
        return mpimg.imread(io.BytesIO(base64.b64decode(data)), format="png")

    def errors(self) -> list[dict[str, Any]]:
        """Console errors, uncaught exceptions and error log entries (failed loads included)."""
        bad = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if (
                method == "Runtime.exceptionThrown"
                or (method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert", "warning"))
                or (method == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"))
            ):
                bad.append(e)
        return bad

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)


_MEASURE = """
JSON.stringify(Array.from(document.querySelectorAll('figure.plot')).map(fig => {
  const box = fig.getBoundingClientRect();
  const drawn = Array.from(fig.querySelectorAll('svg path, svg use, svg image, svg rect')).filter(el => {
    const r = el.getBoundingClientRect(); return r.width * r.height > 0; }).length;
  return {key: fig.dataset.plot, items: Number(fig.dataset.items), drawn: drawn,
          x: box.left + window.scrollX, y: box.top + window.scrollY, width: box.width, height: box.height};
}))
"""


# Per panel (matplotlib axes) of each figure: its plotting area, which is the axes' first path.
_PANELS = """
JSON.stringify(Array.from(document.querySelectorAll('figure.plot')).flatMap(fig =>
  Array.from(fig.querySelectorAll('svg g[id^="axes_"]')).map((axes, i) => {
    const r = axes.querySelector('path').getBoundingClientRect();
    return {key: fig.dataset.plot, panel: i, x: r.left + window.scrollX, y: r.top + window.scrollY,
            width: r.width, height: r.height};
  })))
"""


def panel_ink(browser: Chromium, panel: dict[str, Any], inset: int = 3) -> int:
    """Pixels inside a panel's plotting area, less its frame, that are not (near) white."""
    clip = {"x": panel["x"] + inset, "y": panel["y"] + inset,
            "width": panel["width"] - 2 * inset, "height": panel["height"] - 2 * inset}
    pixels = browser.screenshot(clip)[..., :3]
    return int((pixels.min(axis=2) < 0.9).sum())


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Any:
    chrome = Chromium(tmp_path_factory.mktemp("chromium-profile"))
    yield chrome
    chrome.close()


def test_report_renders_every_plot_without_console_errors(tmp_path: Path, browser: Chromium) -> None:
    sim, sink = run_to_memory("broker-outage", duration_s=100.0)
    write_silver(tmp_path / "tables", sim, sink)
    report = write_report(str(tmp_path / "tables"), tmp_path / "report.html", generated_ms=sim.end_ms)
    browser.open(report.as_uri())
    figures = {f["key"]: f for f in json.loads(browser.evaluate(_MEASURE))}
    assert sorted(figures) == sorted(PLOTS)
    for key, fig in figures.items():
        assert fig["items"] > 0 and fig["drawn"] >= 5, fig  # a heatmap is one <image> plus axes
        assert fig["width"] > 400 and fig["height"] > 150, fig
        pixels = browser.screenshot({k: fig[k] for k in ("x", "y", "width", "height")})[..., :3]
        ink = (pixels.min(axis=2) < 0.9).mean()  # share of pixels that are not (near) white
        colours = len(np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0))
        assert ink > 0.02 and colours > 20, (key, ink, colours)
    assert browser.errors() == []


def test_empty_report_opens_without_console_errors(tmp_path: Path, browser: Chromium) -> None:
    report = write_report(str(tmp_path / "no-tables"), tmp_path / "empty.html", generated_ms=1_767_225_600_000)
    browser.open(report.as_uri())
    empty = browser.evaluate("Array.from(document.querySelectorAll('.empty[data-plot]')).map(e => e.dataset.plot)")
    assert sorted(empty) == sorted(PLOTS)
    assert browser.evaluate("document.querySelectorAll('figure.plot').length") == 0
    assert browser.errors() == []


def test_a_short_run_draws_data_in_every_panel(tmp_path: Path, browser: Chromium) -> None:
    # 50 s: broker_health holds one minute per broker, the lag tables a few rows per group.
    sim, sink = run_to_memory("broker-outage", duration_s=50.0)
    rows = write_silver(tmp_path / "tables", sim, sink)
    assert len({r["minute_ms"] for r in rows["broker_health"]}) == 1
    report = write_report(str(tmp_path / "tables"), tmp_path / "report.html", generated_ms=sim.end_ms)
    browser.open(report.as_uri())
    # No scrollbar: a screenshot beyond the viewport drops it, and the centred page would move
    # by half its width between measuring and capturing.
    browser.evaluate("document.documentElement.style.overflow = 'hidden'")
    panels = json.loads(browser.evaluate(_PANELS))
    assert sorted({p["key"] for p in panels}) == sorted(PLOTS)
    assert sum(p["key"] == "broker_health" for p in panels) == 2  # failure rate, latency
    empty = [(p["key"], p["panel"]) for p in panels if panel_ink(browser, p) < 10]
    assert empty == []
    assert browser.errors() == []
