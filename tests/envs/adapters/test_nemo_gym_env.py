"""The `nemo_gym` adapter against the real nemo-gym 0.4.0: its bundled `example_session_state_mgmt` resources server
(a per-session counter, a verify that compares it with the row's `expected_count`) started from the NeMo Gym venv.

The venv is made by scripts/nemo_gym_venv.sh when it is missing (about 1 minute and 1.4 GB the first time, with the
registry reachable; nothing afterwards).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from turnkeep.envs.adapters import nemo_gym_server
from turnkeep.envs.adapters.nemo_gym_env import ROW_KEY, NemoGymEnvironment, NemoGymOptions
from turnkeep.envs.adapters.nemo_gym_rows import RowError, check_rows, prompt_of, tools_of
from turnkeep.envs.adapters.nemo_gym_server import DEFAULT_PYTHON, ResourcesServer
from turnkeep.envs.environment import EnvContext
from turnkeep.envs.kinds import resolve
from turnkeep.schemas.config import EnvironmentSpec
from turnkeep.schemas.rollout import Problem

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "nemo_gym_counter"
SERVER = "example_session_state_mgmt"


def _call(name: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


RIGHT = [_call("increment_counter", count=1) + _call("increment_counter", count=2), _call("get_counter_value"),
         "The count is 6."]


@pytest.fixture(scope="module")
def options() -> NemoGymOptions:
    if not DEFAULT_PYTHON.is_file():
        subprocess.run([str(REPO / "scripts" / "nemo_gym_venv.sh")], check=True, timeout=1200)
    return NemoGymOptions(server=SERVER)


def _env(options: NemoGymOptions, index: int = 0, seed: int = 0) -> NemoGymEnvironment:
    record = NemoGymEnvironment.dataset(options, "train")[index]
    return NemoGymEnvironment(Problem(question=record.prompt, env="counter", metadata=record.metadata),
                              EnvContext(options=options, seed=seed))


async def _play(env: NemoGymEnvironment, turns: list[str]) -> list:
    try:
        return [await env.step(turn) for turn in turns]
    finally:
        await env.close()


def test_the_rows_are_the_prompts_and_their_tools_the_tools(options: NemoGymOptions) -> None:
    records = NemoGymEnvironment.dataset(options, "train")
    assert [r.prompt for r in records][:2] == ["add 1 then add 2 then get the count",
                                               "add 4 then add 5 then get the count"]
    assert len(records) == 5 and records[0].metadata[ROW_KEY]["expected_count"] == 6
    assert NemoGymEnvironment.dataset(options, "heldout") is None
    env = _env(options)
    assert env.prompt() == records[0].prompt
    assert [t["function"]["name"] for t in env.tools()] == ["increment_counter", "get_counter_value"]
    assert env.tools()[0]["function"]["parameters"]["required"] == ["count"]


def test_calls_reach_the_server_and_its_verify_scores_the_episode(options: NemoGymOptions) -> None:
    env = _env(options)
    steps = asyncio.run(_play(env, RIGHT))
    assert [(s.observation, s.done) for s in steps] == [('{"success":true}\n{"success":true}', False),
                                                        ('{"count":6}', False), (None, True)]
    assert env.reward() == 1.0 and env.reward_parts() == {}
    wrong = _env(options)
    asyncio.run(_play(wrong, [_call("increment_counter", count=2), "The count is 5."]))
    assert wrong.reward() == 0.0
    unanswered = _env(options)
    asyncio.run(_play(unanswered, RIGHT[:2]))  # cut before a final message: not verified
    assert unanswered.reward() == 0.0


def test_bad_calls_are_answered_and_the_episode_goes_on(options: NemoGymOptions) -> None:
    env = _env(options)
    steps = asyncio.run(_play(env, ["<tool_call>{oops</tool_call>", _call("verify"), _call("increment_counter",
                                                                                            count="x"), *RIGHT]))
    assert "not valid JSON" in steps[0].observation and not steps[0].done
    assert json.loads(steps[1].observation) == {"error": "unknown tool 'verify'; the tools are increment_counter, "
                                                         "get_counter_value"}
    assert json.loads(steps[2].observation)["detail"][0]["type"] == "int_parsing"  # the server's own 422 body
    assert env.reward() == 1.0
    limited = _env(options.model_copy(update={"max_tool_calls": 1}))
    capped = asyncio.run(_play(limited, [RIGHT[0]]))[0].observation.split("\n")
    assert capped[0] == '{"success":true}' and "no tool calls left" in capped[1]


def test_replay_meets_the_same_observations_in_a_fresh_session(options: NemoGymOptions) -> None:
    assert NemoGymEnvironment.recovery_mode_for(options) == "replay" and _env(options).recovery_mode == "replay"
    turns = [_call("increment_counter", count=4), _call("get_counter_value"), _call("increment_counter", count=9),
             _call("get_counter_value")]
    live = _env(options, index=1, seed=7)
    observed = [s.observation for s in asyncio.run(_play(live, turns))]
    assert observed[1] == '{"count":10}' and observed[3] == '{"count":19}'

    async def replayed(seed: int) -> list:
        env = _env(options, index=1, seed=seed)
        try:
            return await env.replay(turns)
        finally:
            await env.close()

    assert asyncio.run(replayed(7)) == observed == asyncio.run(replayed(8))  # the counter draws nothing at random

    async def interleaved() -> list:  # sessions of one server are apart (the cookie carries each one's id)
        first, second = _env(options, 0), _env(options, 1)
        try:
            await first.step(_call("increment_counter", count=100))
            await second.step(_call("increment_counter", count=1))
            return [(await env.step(_call("get_counter_value"))).observation for env in (first, second)]
        finally:
            await first.close()
            await second.close()

    assert asyncio.run(interleaved()) == ['{"count":103}', '{"count":7}']
    assert NemoGymEnvironment.recovery_mode_for(options.model_copy(update={"replay": False})) == "restart_only"


def test_an_attached_server_is_used_at_its_url(options: NemoGymOptions) -> None:
    server = ResourcesServer.shared(DEFAULT_PYTHON, options.app())
    url = asyncio.run(server.ready(60))
    attached = NemoGymOptions(url=url, data=str(options.data_path()))
    env = _env(attached)
    asyncio.run(_play(env, RIGHT))
    assert env.reward() == 1.0
    with pytest.raises(ValueError, match="example rollouts"):
        NemoGymEnvironment.demonstrations(random.Random(0), 2, attached)


@pytest.mark.parametrize(("given", "match"), [
    ({}, "exactly one of options.server"),
    ({"server": SERVER, "url": "http://127.0.0.1:1"}, "exactly one of options.server"),
    ({"url": "http://127.0.0.1:1"}, "needs options.data"),
    ({"server": "no_such_server"}, "no resources server 'no_such_server'"),
    ({"server": SERVER, "python": "/nonexistent/bin/python"}, "no python at /nonexistent/bin/python"),
    ({"server": "math_with_judge"}, "calls a model server \\(math_with_judge.judge_model_server"),
    ({"server": "blackjack"}, "agent 'blackjack_gymnasium_agent' \\(gymnasium_agent\\), not a simple_agent"),
    ({"server": SERVER, "data": "/nonexistent.jsonl"}, "no data file /nonexistent.jsonl"),
])
def test_what_cannot_be_mapped_is_refused_in_one_line(options: NemoGymOptions, given: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match) as err:
        NemoGymOptions.model_validate(given)
    assert "\n" not in str(err.value).strip().splitlines()[-1] and "nemo_gym: " in str(err.value)


def test_rows_map_to_one_prompt_and_unmappable_rows_are_named() -> None:
    row = {"responses_create_params": {"instructions": "Be brief.", "input": [
        {"role": "system", "content": "You count."}, {"role": "user", "content": [{"type": "input_text",
                                                                                    "text": "add 1"}]}]}}
    assert prompt_of(row) == "Be brief.\n\nYou count.\n\nadd 1"
    assert prompt_of({"responses_create_params": {"input": "hi"}}) == "hi"
    bad_rows = [
        ({"input": [{"role": "assistant", "content": "x"}]}, "role 'assistant'"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}, "'input_image'"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "'web_search' tool"),
        ({"input": "x", "tools": [{"type": "function", "name": "seed_session"}]}, "a route of the server"),
    ]
    for params, match in bad_rows:
        with pytest.raises(RowError, match=match):
            check_rows(({"responses_create_params": params},), Path("rows.jsonl"), None)
    assert tools_of({"responses_create_params": {"input": "x"}}) == []


def test_the_kind_resolves_to_the_adapter(options: NemoGymOptions) -> None:
    loaded = resolve("counter", EnvironmentSpec(kind="nemo_gym", options={"server": SERVER}))
    assert loaded.cls is NemoGymEnvironment and loaded.options == options
    with pytest.raises(ValueError, match="no NeMo Gym row"):
        NemoGymEnvironment(Problem(question="add 1", env="counter"), EnvContext(options=options))


def test_demonstrations_are_the_servers_rollouts_played_against_it(options: NemoGymOptions) -> None:
    texts = NemoGymEnvironment.demonstrations(random.Random(3), 60, options)
    assert len(texts) == 60 and all(t.endswith("\n") for t in texts)
    prompts = {r.prompt for r in NemoGymEnvironment.dataset(options, "train")}
    right = 0
    for text in texts:
        lines = text.splitlines()
        assert lines[0] in prompts and "<tool_call>" not in lines[-1]
        for turn, reply in zip(lines[1:-1:2], lines[2:-1:2]):
            assert turn.startswith("<tool_call>") and reply.startswith("<tool_response>")
        right += text == _played_right(options, lines[0])
    assert 10 <= right <= 50  # demo_error_rate 0.5: some right, some with a mistake
    again = NemoGymEnvironment.demonstrations(random.Random(3), 60, options)
    assert again == texts  # the same draws give the same conversations (the tokenizer's corpus is stable)


def _played_right(options: NemoGymOptions, prompt: str) -> str:
    one = NemoGymEnvironment.demonstrations(random.Random(0), 200, options.model_copy(update={"demo_error_rate": 0}))
    return next(t for t in one if t.startswith(prompt + "\n"))


def test_the_started_server_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    script = ("import asyncio, sys\n"
              "from turnkeep.envs.adapters.nemo_gym_env import NemoGymOptions\n"
              "from turnkeep.envs.adapters.nemo_gym_server import ResourcesServer, python_of\n"
              f"o = NemoGymOptions(server={SERVER!r})\n"
              "s = ResourcesServer.shared(python_of(None), o.app())\n"
              "asyncio.run(s.ready(60))\n"
              "print(s._proc.pid, flush=True)\n"
              "sys.stdin.read()\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    child = int(parent.stdout.readline())
    os.kill(child, 0)  # up
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.1)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_server_that_fails_to_start_names_its_log(options: NemoGymOptions, tmp_path: Path) -> None:
    app = options.app()
    broken = nemo_gym_server.ServerApp(app.folder, tmp_path / "missing.yaml", app.name, app.agents)
    server = ResourcesServer.shared(DEFAULT_PYTHON, broken)
    with pytest.raises(RuntimeError, match=f"exited with 1 while starting; see {server.log}"):
        asyncio.run(server.ready(60))


@pytest.mark.integration
def test_the_example_trains_a_few_steps(stack_config, options: NemoGymOptions) -> None:
    from tests.envs.adapters.example_runs import train_example  # late: integration only

    train_example(stack_config, EXAMPLE / "config.toml", "tk-ng-", "--set", "rollout.group_size=4",
                  "--set", "train.prompts_per_step=4")
