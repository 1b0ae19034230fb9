"""Installed, each folder at the top of the repository is a subpackage of the one import name `turnkeep`.

The folders stay where the design card puts them (`schemas/`, `controller/`, ...; listed in pyproject's
`[tool.turnkeep] folders`); only what is installed is named `turnkeep.schemas`, `turnkeep.controller`, ... so
turnkeep claims no top-level name but its own (a wheel would otherwise overwrite a user's own `envs` or `cli`).
setuptools' pyproject tables cannot put found packages under a name, hence this file; the rest is in pyproject.toml.
"""

import tomllib
from pathlib import Path

from setuptools import find_packages, setup

FOLDERS = tomllib.loads((Path(__file__).parent / "pyproject.toml").read_text())["tool"]["turnkeep"]["folders"]

subpackages = find_packages(include=[pattern for folder in FOLDERS for pattern in (folder, f"{folder}.*")])
setup(
    # configs/ rides along as data, so an installed `turnkeep run` finds its default config where a checkout does.
    packages=["turnkeep", *(f"turnkeep.{name}" for name in subpackages), "turnkeep.configs",
              "turnkeep.configs.prompts"],
    package_dir={"turnkeep": "turnkeep", **{f"turnkeep.{folder}": folder for folder in FOLDERS},
                 "turnkeep.configs": "configs"},
    package_data={"turnkeep.configs": ["*.toml"], "turnkeep.configs.prompts": ["*"]},
)
