"""The `openenv` adapter against real OpenEnv servers: the example's guessing game (examples/openenv_guess, OpenEnv's
own FastAPI app), served by uvicorn processes the adapter starts, as a run's environment server does."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
from pathlib import Path

import pytest

from tests.envs.adapters.example_runs import train_example
from tests.envs.adapters.openenv_games import (
    APP,
    EXAMPLE,
    GAME,
    episode,
    example_importable,
    guess,
    play,
    secret_of,
)
from turnkeep.envs.adapters.openenv_env import HELDOUT_SEED_BASE, OpenEnvEnvironment, OpenEnvOptions
from turnkeep.envs.adapters.openenv_session import LOOP, SERVERS
from turnkeep.envs.environment import EnvContext, StepResult
from turnkeep.envs.tool_calls import parse_tool_calls
from turnkeep.schemas.choices import RecoveryMode

__all__ = ["example_importable"]  # the autouse fixture of these tests


# Options: what cannot be mapped is refused in one line.

@pytest.mark.parametrize("options, message", [
    ({}, "set exactly one of options.url"),
    ({"url": "http://127.0.0.1:1", "app": APP}, "set exactly one of options.url"),
    ({"url": "127.0.0.1:8000"}, "is not http://host:port"),
    ({"app": "turnkeep_example_openenv_guess.server"}, "is not package.module:name"),
    ({"app": "no_such_openenv_package.server:app"}, "module 'no_such_openenv_package.server' is not importable"),
    ({"app": APP, "demonstrator": "no_such_player:play"}, "options.demonstrator: module 'no_such_player'"),
    ({"app": APP, "reward": "mean"}, "reward"),
    ({"app": APP, "unknown": 1}, "unknown"),
])
def test_options_that_cannot_be_mapped_are_refused_in_one_line(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        OpenEnvOptions(**options)
    assert message in str(err.value)


def test_recovery_mode_follows_options_replay() -> None:
    assert OpenEnvEnvironment.recovery_mode_for(OpenEnvOptions(**GAME)) == RecoveryMode.REPLAY
    assert OpenEnvEnvironment.recovery_mode_for(OpenEnvOptions(**GAME, replay=False)) == RecoveryMode.RESTART_ONLY
    env = episode(replay=False)
    assert env.recovery_mode == RecoveryMode.RESTART_ONLY
    asyncio.run(env.close())


def test_the_dataset_gives_one_record_per_seed_heldout_apart() -> None:
    options = OpenEnvOptions(**GAME, train_episodes=5, heldout_episodes=3)
    train = OpenEnvEnvironment.dataset(options, "train")
    heldout = OpenEnvEnvironment.dataset(options, "heldout")
    assert [r.metadata["seed"] for r in train] == [0, 1, 2, 3, 4]
    assert [r.metadata["seed"] for r in heldout] == [HELDOUT_SEED_BASE + i for i in range(3)]
    assert all(r.env is None and r.answer is None for r in train + heldout)


# The mapping, against the game served by a uvicorn process the adapter starts.

def test_an_episode_maps_tool_calls_to_actions_and_sums_the_step_rewards() -> None:
    seed = 3
    secret = secret_of(seed)
    low = 1 if secret > 1 else 2
    env = episode(seed)
    assert env.prompt() == "Guess my number from 1 to 8 in 4 tries."
    [tool] = env.tools()
    assert tool["function"]["name"] == "guess"
    assert tool["function"]["parameters"]["properties"]["number"]["maximum"] == 8
    first, right = asyncio.run(play(env, [guess(low), guess(secret)]))
    assert (first.observation, first.done) == (f"{low} is too {'low' if low < secret else 'high'}.", False)
    assert (right.observation, right.done) == (f"{secret} is right!", True)
    assert env.reward() == 0.75  # right at the second of four tries
    assert env.reward_parts() == {}


def test_refused_actions_unknown_tools_and_bad_json_are_answered_and_the_episode_goes_on() -> None:
    env = episode()
    env.prompt()
    steps = asyncio.run(play(env, [guess(9), guess("many"), '<tool_call>{"name": "peek", "arguments": {}}'
                                    '</tool_call>', "<tool_call>{not json</tool_call>", guess(secret_of(3))]))
    errors = [json.loads(s.observation)["error"] for s in steps[:4]]
    assert errors[0] == "invalid action: number: Input should be less than or equal to 8"
    assert errors[1].startswith("invalid action: number: Input should be a valid integer")
    assert errors[2] == "unknown tool 'peek'; the tool is 'guess'"
    assert errors[3].startswith("tool call 1: not valid JSON")
    assert not any(s.done for s in steps[:4]) and steps[4].done
    assert env.reward() == 1.0  # refused actions are not the game's tries


def test_a_turn_without_a_call_is_the_final_answer_or_goes_into_the_text_field() -> None:
    final = episode()
    [step] = asyncio.run(play(final, ["I give up"]))
    assert (step.observation, step.done, final.reward()) == (None, True, 0.0)
    texted = episode(text_field="number", reward="last")
    secret = secret_of(3)
    steps = asyncio.run(play(texted, [str(secret % 8 + 1), f" {secret}\n"]))
    assert [s.done for s in steps] == [False, True] and steps[1].observation == f"{secret} is right!"
    assert texted.reward() == 0.75


def test_observation_fields_choose_the_text_fed_back() -> None:
    env = episode(observation_fields=[])
    assert json.loads(env.prompt()) == {"message": "Guess my number from 1 to 8 in 4 tries.", "tries_left": 4}
    asyncio.run(env.close())
    missing = episode(observation_fields=["hint"])
    with pytest.raises(RuntimeError, match="has no field 'hint'.*fix options.observation_fields"):
        missing.prompt()
    asyncio.run(missing.close())


def test_siblings_of_a_group_share_the_records_seed_unless_seed_from_episode() -> None:
    seeds = [s for s in range(50) if secret_of(s) != secret_of(0)]
    a, b = episode(0, ctx_seed=seeds[0]), episode(0, ctx_seed=seeds[1])
    assert [asyncio.run(play(e, [guess(secret_of(0))]))[0].done for e in (a, b)] == [True, True]
    own = episode(0, ctx_seed=seeds[0], seed_from="episode")
    assert asyncio.run(play(own, [guess(secret_of(0))]))[0].done is False


def test_replay_on_a_fresh_session_gives_the_same_observations_and_another_seed_may_differ() -> None:
    turns = [guess(n) for n in (4, 9, 2, 6)]
    first = [s.observation for s in asyncio.run(play(episode(5), turns))]
    again = episode(5)

    async def replayed() -> list[str | None]:
        try:
            return await again.replay(turns)
        finally:
            await again.close()

    assert asyncio.run(replayed()) == first
    other = next(s for s in range(6, 60) if secret_of(s) not in (secret_of(5), 4, 2, 6))
    assert [s.observation for s in asyncio.run(play(episode(other), turns))] != first


def test_many_episodes_at_once_each_hold_their_own_session() -> None:
    async def group() -> list[list[StepResult]]:
        envs = [episode(seed) for seed in range(8)]
        return await asyncio.gather(*(play(env, [guess(secret_of(seed))]) for seed, env in enumerate(envs)))

    assert all(steps[0].done and steps[0].observation.endswith("is right!") for steps in asyncio.run(group()))


def test_attaching_to_a_running_server_by_url() -> None:
    url = LOOP.run(SERVERS.url_of(APP, 60), 70)  # the server the tests above started
    env = episode(app=None, url=url + "/")
    assert env.prompt().startswith("Guess my number")
    assert asyncio.run(play(env, [guess(secret_of(3))]))[0].done


MCP_ENV = """
from fastmcp import FastMCP
from openenv.core.env_server import CallToolAction, CallToolObservation, MCPEnvironment, Observation, State, create_app


class Counter(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        mcp = FastMCP("counter")
        self.total = 0

        @mcp.tool()
        def add(n: int) -> int:
            \"\"\"Add n to the counter; returns the total.\"\"\"
            self.total += n
            return self.total

        super().__init__(mcp)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.total = seed or 0
        return Observation(metadata={})

    def _step_impl(self, action, timeout_s=None, **kwargs):
        return Observation()

    @property
    def state(self):
        return State()


app = create_app(Counter, CallToolAction, CallToolObservation, env_name="counter", max_concurrent_envs=8)
"""


def test_an_mcp_environment_takes_each_tool_call_as_a_call_tool_action(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "openenv_mcp_counter.py").write_text(MCP_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    app = "openenv_mcp_counter:app"
    try:
        env = episode(seed=5, app=app, mcp=True, action_tool="step", observation_fields=[])
        assert env.prompt() == "{}"
        [tool] = env.tools()
        assert tool["function"]["name"] == "add" and tool["function"]["parameters"]["required"] == ["n"]
        call = '<tool_call>{{"name": "{}", "arguments": {}}}</tool_call>'.format
        added, refused, unknown = asyncio.run(play(env, [
            call("add", '{"n": 3}') + call("add", '{"n": 1}'), call("add", '{"n": "x"}'), call("peek", "{}")]))
        assert (added.observation, added.done) == ("8\n9", False)  # the seed 5, plus 3, plus 1
        assert "Input should be a valid integer" in json.loads(refused.observation)["error"]
        assert json.loads(unknown.observation) == {"error": "Unknown tool: 'peek'"}
    finally:
        log = SERVERS._started[app].log
        SERVERS.stop(app)
        log.unlink(missing_ok=True)  # FastMCP's warnings


def test_a_server_that_is_not_there_fails_the_episode_in_one_line() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = episode(app=None, url=f"http://127.0.0.1:{port}")
    with pytest.raises(RuntimeError, match=f"could not open an OpenEnv session at http://127.0.0.1:{port} "
                                           r"\(seed 3\): (ConnectionRefusedError|URLError)"):
        env.prompt()
    asyncio.run(env.close())


def test_demonstrations_are_whole_games_in_the_tool_format() -> None:
    options = OpenEnvOptions(**GAME)
    texts = OpenEnvEnvironment.demonstrations(random.Random(1), 60, options)
    assert SERVERS.running(APP)  # kept for the next batch (a warm start asks for one per step)
    assert texts == OpenEnvEnvironment.demonstrations(random.Random(1), 60, options)
    assert len(texts) == 60
    for text in texts:
        lines = text.splitlines()
        assert text.endswith("\n") and lines[0] == "Guess my number from 1 to 8 in 4 tries."
        for turn, reply in zip(lines[1::2], lines[2::2]):
            [call], _ = parse_tool_calls(turn)
            assert call.name == "guess" and set(call.arguments) == {"number"}
            assert reply.startswith("<tool_response>") and reply.endswith("</tool_response>")
    joined = "".join(texts)
    assert "is right!" in joined and "It was" in joined and "invalid action" in joined  # right, wrong, refused
    with pytest.raises(ValueError, match="set it to package.module:function"):
        OpenEnvEnvironment.demonstrations(random.Random(1), 1, OpenEnvOptions(app=APP))


# End to end: `turnkeep run` trains the example for a few steps.


@pytest.mark.integration
def test_the_example_trains_through_the_adapter(stack_config) -> None:
    train_example(stack_config, EXAMPLE / "config.toml", "tk-openenv-", "--set", "model.tiny.warm_start_steps=100",
                  timeout_s=500)


def test_the_environment_servers_warm_up_starts_the_apps_server_before_any_episode(caplog) -> None:
    from turnkeep.envs.kinds import EnvironmentFactory, resolve  # late: only this test builds a factory
    from turnkeep.schemas.config import EnvironmentSpec  # late: only this test builds a factory

    def factory(**options) -> EnvironmentFactory:
        return EnvironmentFactory({"guess": resolve("guess", EnvironmentSpec(kind="openenv", options=options))},
                                  EnvContext())

    async def warm(built: EnvironmentFactory) -> list:
        return await asyncio.gather(*built.warm_up(), return_exceptions=True)

    SERVERS.stop(APP)  # whatever an earlier test started
    assert not SERVERS.running(APP)
    assert asyncio.run(warm(factory(**GAME))) == [None] and SERVERS.running(APP)
    [failed] = asyncio.run(warm(factory(**{**GAME, "app": "json:no_such_app", "start_timeout_s": 20})))
    SERVERS.stop("json:no_such_app")  # the next test that asks for it starts it afresh
    assert isinstance(failed, RuntimeError) and "warm-up guess failed (the OpenEnv server of json:no_such_app" \
        in caplog.text
