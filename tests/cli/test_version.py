"""`turnkeep --version`: the installed distribution's version, else (a checkout never installed) pyproject's."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from turnkeep.cli import version
from turnkeep.cli.main import _build_parser, main

REPO = Path(__file__).resolve().parents[2]
PYPROJECT_VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_it_prints_the_installed_version_and_exits_0(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"turnkeep {importlib.metadata.version('turnkeep')}\n"


def test_an_uninstalled_checkout_falls_back_to_its_pyproject(monkeypatch) -> None:
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert version.installed_version() == PYPROJECT_VERSION
    monkeypatch.setattr(version, "PYPROJECT", REPO / "no-such-pyproject.toml")
    assert version.installed_version().startswith("unknown")


def test_the_command_prints_it_without_loading_any_command() -> None:
    code = ("import sys\nfrom turnkeep.cli.main import entry\nsys.argv = ['turnkeep', '--version']\n"
            "try:\n    entry()\nexcept SystemExit as exit_:\n"
            "    loaded = sorted(m for m in sys.modules if m.startswith('turnkeep.cli.') and m not in "
            "('turnkeep.cli.main', 'turnkeep.cli.version'))\n"
            "    assert not loaded and exit_.code == 0, (loaded, exit_.code)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == f"turnkeep {PYPROJECT_VERSION}\n"
    assert "--version" in _build_parser(["--version"]).format_help()
