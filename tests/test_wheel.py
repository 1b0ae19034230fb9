"""The built wheel claims one import name: `turnkeep` (its folders as `turnkeep.<folder>`), nothing of the
repository's tests, examples or scripts. Built offline from a copy of the working tree (a build in place would
leave `build/` in the repository while other work edits it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOT_SOURCE = shutil.ignore_patterns(".venv", ".git", "runs", "build", "dist", "*.egg-info", "__pycache__", "*.pyc",
                                    ".turnkeep-cache", ".pytest_cache", ".ruff_cache")


def folders() -> list[str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["turnkeep"]["folders"]


def build_wheel(root: Path) -> Path:
    """The wheel of the working tree, built under `root` without a package index; its path."""
    source = root / "turnkeep-src"
    shutil.copytree(REPO, source, ignore=NOT_SOURCE, symlinks=True)
    # --no-build-isolation: setuptools of this venv, so the build needs no package index.
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "--quiet", "-w", str(root / "dist"), str(source)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (wheel,) = (root / "dist").glob("turnkeep-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from the working tree."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def wheel_names(wheel: Path) -> list[str]:
    """Every file name in the wheel built from the working tree."""
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_the_license_ships_in_the_metadata(wheel: Path, wheel_names: list[str]) -> None:
    """pyproject's `license` (an SPDX expression) and `license-files`: the LICENSE file rides in the dist-info."""
    (metadata,) = [name for name in wheel_names if name.endswith(".dist-info/METADATA")]
    (license_file,) = [name for name in wheel_names if name.endswith(".dist-info/licenses/LICENSE")]
    with zipfile.ZipFile(wheel) as archive:
        assert "License-Expression: Apache-2.0" in archive.read(metadata).decode()
        assert archive.read(license_file) == (REPO / "LICENSE").read_bytes()
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "the turnkeep authors" in text


def test_the_wheel_claims_only_turnkeep(wheel_names: list[str]) -> None:
    tops = {name.split("/")[0] for name in wheel_names}
    dist_info = {top for top in tops if top.endswith(".dist-info")}
    assert tops - dist_info == {"turnkeep"}, sorted(tops)
    assert len(dist_info) == 1


def test_every_folder_is_under_turnkeep(wheel_names: list[str]) -> None:
    missing = [folder for folder in folders() if f"turnkeep/{folder}/__init__.py" not in wheel_names]
    assert not missing, f"not in the wheel as turnkeep/<folder>: {missing}"
    assert {"turnkeep/__init__.py", "turnkeep/__main__.py", "turnkeep/_moved.py"} <= set(wheel_names)


def test_the_configs_ride_along_where_the_default_config_is_looked_for(wheel_names: list[str]) -> None:
    from turnkeep.cli.config_args import DEFAULT_CONFIG

    shipped = {name for name in wheel_names if name.startswith("turnkeep/configs/")}
    assert f"turnkeep/configs/{DEFAULT_CONFIG.name}" in shipped
    assert {f"turnkeep/configs/{path.relative_to(REPO / 'configs')}" for path in (REPO / "configs").rglob("*")
            if path.is_file()} == shipped


def test_tests_examples_and_scripts_stay_out(wheel_names: list[str]) -> None:
    leaked = [name for name in wheel_names
              if any(part in ("tests", "examples", "scripts") for part in name.split("/")[:2])]
    assert not leaked, leaked[:10]
