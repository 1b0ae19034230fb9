"""Installed, turnkeep is one import name: the environment author's names come from `turnkeep`, an import by a
folder's old top-level name fails with its new one, and a user's own package of such a name imports as its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import turnkeep
from turnkeep.envs.environment import Environment


def _python(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    # From a folder of its own: run from the repository, `import envs` would find the folder itself.
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", **env})


def test_the_public_names_are_the_ones_the_modules_define():
    assert turnkeep.Environment is Environment
    for name in turnkeep.__all__:
        assert getattr(turnkeep, name).__name__ == name
    assert set(turnkeep.__all__) == set(turnkeep.PUBLIC)
    with pytest.raises(AttributeError, match="public names: EnvContext"):
        turnkeep.NoSuchThing  # noqa: B018


def test_an_old_import_path_names_its_replacement(tmp_path):
    done = _python("import turnkeep\nimport envs.environment\n", tmp_path)
    assert done.returncode == 1
    assert "No module named 'envs'" in done.stderr and "`turnkeep.envs...`" in done.stderr, done.stderr


def test_an_old_entry_in_a_config_names_its_replacement(tmp_path):
    done = _python("""
        from turnkeep.envs.loading import EnvironmentLoadError, load_environment_class
        try:
            load_environment_class("envs.calc_env:CalcEnvironment")
        except EnvironmentLoadError as err:
            print(err)
        """, tmp_path)
    assert "use 'turnkeep.envs.calc_env:CalcEnvironment'" in done.stdout, done.stdout + done.stderr


def test_a_users_own_envs_package_imports_as_its_own(tmp_path):
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "__init__.py").write_text("OWNER = 'the user'\n")
    done = _python("import turnkeep, turnkeep.envs.environment, envs\nprint(envs.OWNER)\n", tmp_path / "envs",
                   PYTHONPATH=str(tmp_path))
    assert done.stdout.strip() == "the user", done.stderr
