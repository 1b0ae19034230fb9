"""Every start-up problem of a user's environment is named in one line before anything starts."""

from __future__ import annotations

import pytest

from tests.envs.user_envs import Echo
from turnkeep.envs.environment import EnvContext
from turnkeep.envs.kinds import EnvironmentFactory, environment_capabilities, resolve
from turnkeep.envs.loading import EnvironmentLoadError, load_environment
from turnkeep.schemas.config import EnvironmentSpec
from turnkeep.schemas.rollout import Problem

ENTRY = "tests.envs.user_envs"


@pytest.mark.parametrize("entry, problem", [
    ("tests.envs.user_envs", "use the form"),
    ("tests.envs.no_such_module:Echo", "module 'tests.envs.no_such_module' does not import (ModuleNotFoundError"),
    ("tests.envs.broken_env_module:Env", "does not import (RuntimeError: the sandbox client needs SANDBOX_URL)"),
    (f"{ENTRY}:Missing", "has no attribute 'Missing'"),
    (f"{ENTRY}:NotAnEnvironment", "is not an environment class; subclass turnkeep.Environment"),
    (f"{ENTRY}:Abstract", "does not implement __init__, prompt, reward, step"),
    (f"{ENTRY}:NoRecoveryMode", "has no recovery_mode; set recovery_mode = one of"),
    (f"{ENTRY}:UnknownRecoveryMode", "recovery_mode = 'snapshotted'; use one of"),
])
def test_each_start_up_problem_is_named(entry: str, problem: str) -> None:
    with pytest.raises(EnvironmentLoadError) as info:
        load_environment(entry, {})
    message = str(info.value)
    assert problem in message and entry in message and "\n" not in message


def test_options_the_class_refuses_are_named() -> None:
    with pytest.raises(EnvironmentLoadError, match=r"Echo refuses its options \(turns: Input should be greater"):
        load_environment(f"{ENTRY}:Echo", {"turns": 0})
    with pytest.raises(EnvironmentLoadError, match="colour: Extra inputs are not permitted"):
        load_environment(f"{ENTRY}:Echo", {"colour": "red"})


def test_a_built_in_kind_takes_no_options_but_tool_chat_and_the_adapters_and_no_entry() -> None:
    with pytest.raises(ValueError, match="options apply to kinds nemo_gym, openenv, python, tool_chat, verifiers, "
                                         "not 'calc'"):
        EnvironmentSpec(kind="calc", options={"x": 1})
    with pytest.raises(ValueError, match="entry applies to kind = \"python\", not 'tool_chat'"):
        EnvironmentSpec(kind="tool_chat", entry="a.b:C")
    assert EnvironmentSpec(kind="tool_chat", options={"max_tool_calls": 2}).options == {"max_tool_calls": 2}
    assert EnvironmentSpec(kind="openenv", options={"url": "http://h:1"}).options == {"url": "http://h:1"}


def test_a_python_environment_is_built_with_its_validated_options() -> None:
    specs = {"mine": EnvironmentSpec(kind="python", entry=f"{ENTRY}:Echo", options={"turns": 3}),
             "calc": EnvironmentSpec(kind="calc"),
             "far": EnvironmentSpec(kind="remote", url="http://127.0.0.1:1", token_file="/nonexistent")}
    factory = EnvironmentFactory.from_specs(specs, EnvContext())
    assert factory.names() == ["calc", "mine"]  # a remote environment is served elsewhere
    env = factory.make(Problem(question="Q hi", env="mine"))
    assert isinstance(env, Echo) and env._turns_left == 3
    [calc, mine] = environment_capabilities(specs, 8)
    assert (mine.name, mine.kind, mine.recovery_mode) == ("mine", "echo", "stateless")
    assert resolve("mine", specs["mine"]).options.turns == 3


def test_the_cli_names_a_bad_entry_and_writes_nothing(tmp_path, capsys) -> None:
    from turnkeep.cli.main import main

    config = tmp_path / "bad.toml"
    run_dir = tmp_path / "run"
    config.write_text(f'[run]\nrun_dir = "{run_dir}"\n[environments.mine]\nkind = "python"\n'
                      f'entry = "{ENTRY}:NotAnEnvironment"\n')
    assert main(["run", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "environments.mine.entry" in err[0] and "not an environment class" in err[0]
    assert not run_dir.exists()
