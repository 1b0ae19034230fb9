"""`kind = "verifiers"` against verifiers 0.4 itself: the example's taskset (examples/verifiers_vault) loaded by its
id, its tasks as prompts, its MCP toolset called in-process, its rewards and metric as the reward and its parts,
replay, the one-line refusals, the demonstrations, and (integration) a few steps of `turnkeep run`."""

from __future__ import annotations

import asyncio
import json
import random
import re
import sys
from pathlib import Path

import pytest
import verifiers.v1 as vf

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "verifiers_vault"
sys.path.insert(0, str(EXAMPLE / "src"))  # the example package, installed or not

from turnkeep.envs.adapters import verifiers_loading  # noqa: E402
from turnkeep.envs.adapters.verifiers_env import TASK_KEY, VerifiersEnvironment, VerifiersOptions  # noqa: E402
from turnkeep.envs.environment import EnvContext  # noqa: E402
from turnkeep.envs.kinds import resolve  # noqa: E402
from turnkeep.schemas.config import EnvironmentSpec  # noqa: E402
from turnkeep.schemas.rollout import Problem  # noqa: E402

OPTIONS = VerifiersOptions(env_id="vf-vault", env_args={"count": 20}, eval_env_args={"split": "eval", "count": 5},
                           demo_script="vf_vault.scripted:turns")


def _read(key: str, name: str = "vault_read") -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": {"key": key}}) + "</tool_call>"


def _env(position: int = 0, seed: int = 0, options: VerifiersOptions = OPTIONS) -> VerifiersEnvironment:
    record = VerifiersEnvironment.dataset(options, "train")[position]
    problem = Problem(question=record.prompt, env="vault", metadata=record.metadata)
    return VerifiersEnvironment(problem, EnvContext(options=options, seed=seed))


def _play(env: VerifiersEnvironment, turns: list[str]) -> list:
    async def play():
        try:
            return [await env.step(turn) for turn in turns]
        finally:
            await env.close()
    return asyncio.run(play())


def test_the_kind_resolves_to_the_adapter_with_its_options() -> None:
    loaded = resolve("vault", EnvironmentSpec(kind="verifiers", options={"env_id": "vf-vault"}))
    assert loaded.cls is VerifiersEnvironment and loaded.options.env_id == "vf-vault"
    assert VerifiersEnvironment.recovery_mode_for(loaded.options) == "replay"
    assert VerifiersEnvironment.recovery_mode_for(OPTIONS.model_copy(update={"replay": False})) == "restart_only"
    assert _env(options=OPTIONS.model_copy(update={"replay": False})).recovery_mode == "restart_only"


def test_the_taskset_is_the_dataset_train_and_heldout() -> None:
    train = VerifiersEnvironment.dataset(OPTIONS, "train")
    heldout = VerifiersEnvironment.dataset(OPTIONS, "heldout")
    tasks = list(verifiers_loading.load("vf-vault", json.dumps({"count": 20})).taskset)
    assert [r.prompt for r in train] == [t.data.prompt for t in tasks] and len(heldout) == 5
    assert train[0].metadata[TASK_KEY]["vault"] == tasks[0].data.vault and train[0].metadata["split"] == "train"
    assert heldout[0].metadata[TASK_KEY]["id"] == "eval-0"
    assert VerifiersEnvironment.dataset(VerifiersOptions(env_id="vf-vault"), "heldout") is None


def test_tool_calls_run_the_toolset_and_the_rubric_scores_every_function() -> None:
    env = _env()
    row = env.task.data
    assert env.prompt() == row.prompt and env.tools()[0]["function"]["name"] == "vault_read"
    results = _play(env, [_read(key) for key in row.asked] + ["".join(str(row.vault[k]) for k in row.asked)])
    assert [r.observation for r in results[:-1]] == [str(row.vault[k]) for k in row.asked]
    assert all(r.role == "tool" and not r.done for r in results[:-1]) and results[-1] == results[-1].__class__(None, True)
    assert env.reward() == pytest.approx(1.0)
    assert env.reward_parts() == {"correct": 1.0, "read_all": 1.0, "reads": float(len(row.asked))}


def test_a_guess_without_reading_scores_by_the_rubrics_weights() -> None:
    env = _env(1)
    row = env.task.data
    _play(env, ["".join(str(row.vault[k]) for k in row.asked)])
    assert env.reward() == pytest.approx(0.8) and env.reward_parts()["read_all"] == 0.0


def test_bad_calls_are_answered_and_the_episode_goes_on() -> None:
    env = _env()
    unknown, missing, bad, absent = _play(env, [_read("a", "nope"), '<tool_call>{"name": "vault_read", '
                                                '"arguments": {"k": 1}}</tool_call>', "<tool_call>{bad</tool_call>",
                                                _read("z")])
    assert "unknown tool 'nope'; the tools are vault_read" in unknown.observation and not unknown.done
    assert "error" in json.loads(missing.observation) and "key" in missing.observation
    assert "not valid JSON" in bad.observation and not bad.done
    assert absent.observation == "?"
    assert env.reward() == 0.0 and env.reward_parts()["reads"] == 1.0  # scored without a final answer


def test_replay_gives_the_same_observations_on_a_fresh_instance() -> None:
    row = _env().task.data
    turns = [_read(row.asked[0]), _read("nope", "x"), _read(row.asked[1])]
    first = _play(_env(seed=5), turns)
    again = asyncio.run(_env(seed=5).replay(turns))
    assert [r.observation for r in first] == again
    assert asyncio.run(_env(seed=6).replay(turns)) == again  # the taskset draws nothing from the seed


def test_demonstrations_are_episodes_played_through_the_environment() -> None:
    demos = VerifiersEnvironment.demonstrations(random.Random(3), 30, OPTIONS)
    assert len(demos) == 30 and all(d.endswith("\n") for d in demos)
    for demo in demos:
        lines = demo.splitlines()
        assert lines[0].startswith("keys ") and lines[-1].isdigit()
        assert all(line.startswith(("<tool_call>", "<tool_response>")) for line in lines[1:-1])
    assert any("<tool_response>" in d for d in demos) and any(len(d.splitlines()) == 2 for d in demos)
    assert demos == VerifiersEnvironment.demonstrations(random.Random(3), 30, OPTIONS)
    with pytest.raises(ValueError, match="no demonstrations.*demo_script"):
        VerifiersEnvironment.demonstrations(random.Random(0), 1, VerifiersOptions(env_id="vf-vault"))


@pytest.mark.parametrize("options, problem", [
    ({"env_id": "vf-no-such-env"}, "does not load.*pip install vf-no-such-env"),
    ({"env_id": "vf-vault", "env_args": {"colour": 1}}, "does not load.*colour.*env_args"),
    ({"env_id": "vf-vault", "surprise": 1}, "surprise"),
    ({"env_id": "textarena"}, "does not load.*textarena"),  # the built-in game taskset needs the textarena package
])
def test_what_cannot_load_is_refused_at_start_in_one_line(options: dict, problem: str) -> None:
    with pytest.raises(ValueError) as err:
        VerifiersOptions(**options)
    assert re.search(problem, str(err.value)), str(err.value)


def test_what_cannot_be_mapped_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import vf_vault  # late: importable only once the example's source folder is on the path (above)

    class OwnEnv(vf.SingleAgentEnv):
        pass

    monkeypatch.setattr(vf_vault, "OwnEnv", OwnEnv, raising=False)
    monkeypatch.setattr(vf_vault, "__all__", [*vf_vault.__all__, "OwnEnv"])
    verifiers_loading.load.cache_clear()
    with pytest.raises(ValueError, match=r"brings its own Env \(OwnEnv.run drives its agents"):
        VerifiersOptions(env_id="vf-vault")
    monkeypatch.setattr(vf_vault, "__all__", [n for n in vf_vault.__all__ if n != "OwnEnv"])
    monkeypatch.setattr(vf_vault.VaultTask, "NEEDS_CONTAINER", True)
    verifiers_loading.load.cache_clear()
    with pytest.raises(ValueError, match="needs a container"):
        VerifiersOptions(env_id="vf-vault")
    monkeypatch.setattr(vf_vault.VaultTask, "NEEDS_CONTAINER", False)

    async def tests_pass(self, trace, runtime) -> float:
        return 1.0
    monkeypatch.setattr(vf_vault.VaultTask, "tests_pass", vf.reward(tests_pass), raising=False)
    verifiers_loading.load.cache_clear()
    with pytest.raises(ValueError, match="the reward tests_pass reads a runtime"):
        VerifiersOptions(env_id="vf-vault")
    monkeypatch.delattr(vf_vault.VaultTask, "tests_pass")
    verifiers_loading.load.cache_clear()
    with pytest.raises(ValueError, match="scores with a judge model"):
        VerifiersOptions(env_id="vf-vault", env_args={"task": {"judges": [{"id": "reference"}]}})
    verifiers_loading.load.cache_clear()


@pytest.mark.integration
def test_the_example_trains_a_few_steps(stack_config) -> None:
    from tests.envs.adapters.example_runs import train_example  # late: integration only
    from tests.run_command import metrics  # late: integration only

    run_dir = train_example(stack_config, EXAMPLE / "config.toml", "tk-vf-", "--set", "rollout.group_size=4",
                            "--set", "train.prompts_per_step=4", timeout_s=500)
    # Every reward and metric of the taskset's rubric reaches the step's metrics by name.
    assert {"correct", "read_all"} <= set(metrics(run_dir, "train_step")[-1]["reward_parts_mean"])
