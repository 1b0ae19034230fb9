"""Every Python and TOML snippet of README.md and docs/*.md runs as written, not only parses.

- A Python snippet is an environment class: it is written into a package of its own (`my_package/envs.py`, the
  entry the pages name), loaded by `turnkeep.envs.loading` as a run loads it, and plays an episode (prompt, step,
  reward).
- A TOML snippet is a config: the real loader (`turnkeep.config.loader.load_config`) takes it, and every
  `kind = "python"` environment in it loads by its entry with its options.
- The README's own-environment quickstart runs end to end: its class, its config, a prompts file holding the
  record the README shows (read by the run's own prompts-file reader), and its `turnkeep env try` command, run for
  real against the class.

The shell commands of the pages are checked by tests/test_readme_commands.py (which says which test runs each).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from turnkeep.cli.main import main
from turnkeep.config.loader import load_config
from turnkeep.controller.state.prompt_files import load_prompt_file
from turnkeep.envs.environment import EnvContext, Environment
from turnkeep.envs.loading import load_environment
from turnkeep.schemas.rollout import Problem
from turnkeep.workers.model_maker import transcript_source
from turnkeep.workers.startup_checks import check_before_start

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGE = "my_package"
"""The package the pages' configs name (`entry = "my_package.envs:Echo"`)."""


def snippets(language: str) -> list[tuple[str, str]]:
    """(page, code) of every fenced block of `language` in the pages."""
    found = []
    for page in PAGES:
        for code in re.findall(rf"^```{language}\n(.*?)^```", page.read_text(), re.S | re.M):
            found.append((page.name, code))
    return found


def _ids(blocks: list[tuple[str, str]]) -> list[str]:
    return [f"{page}-{n}" for n, (page, _) in enumerate(blocks, start=1)]


PYTHON, TOML = snippets("python"), snippets("toml")


@pytest.fixture
def as_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Writes a Python snippet as `my_package/envs.py` on sys.path (forgotten again after the test)."""

    def write(code: str) -> None:
        (tmp_path / PACKAGE).mkdir(exist_ok=True)
        (tmp_path / PACKAGE / "__init__.py").write_text("")
        (tmp_path / PACKAGE / "envs.py").write_text(code)
        importlib.invalidate_caches()

    monkeypatch.syspath_prepend(str(tmp_path))
    yield write
    for name in [name for name in sys.modules if name == PACKAGE or name.startswith(PACKAGE + ".")]:
        del sys.modules[name]


def _readme_class() -> str:
    """The README's own-environment class (the first Python snippet)."""
    return next(code for page, code in PYTHON if page == "README.md")


def test_the_pages_show_the_snippets_this_file_runs() -> None:
    pages = {page for page, _ in PYTHON}
    assert {"README.md", "environments.md"} <= pages
    assert any('entry = "my_package.envs:Echo"' in code for page, code in TOML if page == "README.md")
    assert len(TOML) >= 5  # README, environments.md (2), cluster.md, operations.md


@pytest.mark.parametrize(("page", "code"), PYTHON, ids=_ids(PYTHON))
def test_a_python_snippet_is_an_environment_that_plays_an_episode(page: str, code: str, as_package) -> None:
    as_package(code)
    module = importlib.import_module(f"{PACKAGE}.envs")
    (name,) = [name for name, obj in vars(module).items()
               if isinstance(obj, type) and issubclass(obj, Environment) and obj is not Environment]
    cls = load_environment(f"{PACKAGE}.envs:{name}").cls  # as a run loads a `kind = "python"` entry
    env = cls(Problem(question="Q hi", answer=2, env=cls.kind), EnvContext())
    assert isinstance(env.prompt(), str)
    first = asyncio.run(env.step("C one"))
    assert isinstance(env.reward(), float)
    if cls.kind == "echo":  # the pages' Echo: what its text says it does
        second = asyncio.run(env.step("A two"))
        assert (env.prompt(), first.observation, first.done, second.done) == ("Q hi\n", "R C one\n", False, True)
        assert env.reward() == 1.0


@pytest.mark.parametrize(("page", "code"), TOML, ids=_ids(TOML))
def test_a_toml_snippet_is_a_config_the_loader_takes(page: str, code: str, tmp_path: Path, as_package) -> None:
    config = tmp_path / "snippet.toml"
    config.write_text(code)
    cfg = load_config(config)  # every key known, every value allowed
    as_package(_readme_class())
    for name, spec in cfg.environments.items():
        if spec.kind == "python":
            assert load_environment(spec.entry, spec.options, where=f"[environments.{name}] entry").cls.kind == name
    transcript_source(cfg)  # what the tiny model would learn from: a class named in [model.tiny] offers demonstrations


def test_the_readmes_own_environment_runs_as_written(tmp_path: Path, monkeypatch, as_package, capsys) -> None:
    """The quickstart as a user follows it: the class, the config, a prompts file with the README's record, and the
    README's `turnkeep env try` command (run for real: it plays two episodes with the turns of turns.txt)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quickstart: your own environment", 1)[1].split("\n## ", 1)[0]
    toml = next(code for page, code in TOML if page == "README.md" and "my_package.envs:Echo" in code)
    record = json.loads(re.search(r"For example `(\{.*?\})`", section, re.S).group(1).replace("\n", " "))
    (command,) = [line for line in section.splitlines() if line.startswith("turnkeep env try ")]
    as_package(_readme_class())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.toml").write_text(toml)
    cfg = load_config(tmp_path / "config.toml")
    Path(cfg.data.train).write_text(json.dumps(record) + "\n")
    # The run's whole start-up check. model.path is a hub id, which a run resolves into the Hugging Face cache before
    # this check (no network here); the tiny model's source is checked with it unset.
    local = {"run.run_dir": str(tmp_path / "run"), "model.cache_dir": str(tmp_path / "models")}
    started = load_config(tmp_path / "config.toml", local)
    check_before_start(started.model_copy(update={"model": started.model.model_copy(update={"path": None})}))

    (loaded,) = load_prompt_file(cfg.data.train, cfg.environments.keys())
    problem = Problem(question=loaded.prompt, answer=loaded.answer, env=loaded.env or "echo", metadata=loaded.metadata)
    assert (problem.question, problem.answer, problem.metadata) == ("Q hi", 2, {"source": "demo"})  # the table's rows
    spec = cfg.environments["echo"]
    env = load_environment(spec.entry, spec.options).cls(problem, EnvContext())
    assert env.prompt() == "Q hi\n" and not asyncio.run(env.step("C one")).done
    assert asyncio.run(env.step("A two")).done and env.reward() == 1.0

    argv = shlex.split(command)[1:]
    (tmp_path / argv[argv.index("--turns") + 1]).write_text("C one\nA two\n")
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("  prompt  'Q hi\\n'\n  policy  'C one'\n  tool    'R C one\\n'\n") == 2
    assert out.count("  reward 1.0\n") == 2 and "mean reward 1 over 2 episode(s)" in out
