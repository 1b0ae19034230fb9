"""The version `turnkeep --version` prints: the installed distribution's, else the checkout's pyproject.toml."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
"""pyproject.toml of a checkout (the repository root, one folder above cli/); an installed wheel has none."""


def installed_version() -> str:
    """`importlib.metadata`'s version of the turnkeep distribution; in a checkout that was never installed,
    `[project] version` of its pyproject.toml."""
    try:
        return importlib.metadata.version("turnkeep")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        return str(tomllib.loads(PYPROJECT.read_text())["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown (not installed, and no pyproject.toml beside the source)"
