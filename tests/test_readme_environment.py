"""The environment in the README's "Your own environments" section is a working environment."""

from __future__ import annotations

import asyncio
import re
import types
from pathlib import Path

from turnkeep.envs.environment import EnvContext
from turnkeep.envs.loading import check_environment_class
from turnkeep.schemas.rollout import Problem

README = Path(__file__).resolve().parents[1] / "docs" / "environments.md"


def test_the_readme_environment_loads_and_plays_an_episode() -> None:
    section = README.read_text().split("## Your own environments, tools and prompts", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    module = types.ModuleType("readme_env")
    exec(compile(code, "README.md", "exec"), module.__dict__)
    cls = check_environment_class(module.Echo, "README's Echo")
    env = cls(Problem(question="Q hi", answer=2, env="echo"), EnvContext())
    assert env.prompt() == "Q hi\n"
    first = asyncio.run(env.step("C one\n"))
    second = asyncio.run(env.step("A two\n"))
    assert (first.observation, first.done, second.done) == ("R C one\n", False, True)
    assert env.reward() == 1.0
