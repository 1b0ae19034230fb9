"""The TRL side of the TRL-vs-turnkeep benchmark (bench/peers_trl.py): its problems are turnkeep's, its reward is
turnkeep's `tool_chat` verdict on a final turn, and a short run on a made-up tiny chat model writes one line a step
and resumes from its checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from turnkeep.bench.peers_trl import ToolChatReward, parse_args, read_problems, train, write_problems
from turnkeep.config.loader import load_config
from turnkeep.envs.codec import TurnCodec
from turnkeep.workers.model_maker import tiny_model_dir

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tool_chat.toml"
SINGLE_TURN = {"environments.math.options.tools": [], "environments.math.options.max_tool_calls": 0,
               "rollout.max_turns": 1}
TINY = {"model.tiny.hidden_size": 32, "model.tiny.num_layers": 1, "model.tiny.num_heads": 1,
        "model.tiny.head_dim": 32, "model.tiny.intermediate_size": 32, "model.tiny.max_position_embeddings": 64,
        "model.tiny.warm_start_steps": 0}


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return load_config(CONFIG, {**SINGLE_TURN, **TINY, "model.cache_dir": str(tmp_path_factory.mktemp("models"))})


@pytest.fixture(scope="module")
def model_dir(config):
    return tiny_model_dir(config, eval_rollouts=0)


@pytest.fixture(scope="module")
def problems(config, tmp_path_factory):
    path = tmp_path_factory.mktemp("problems") / "problems.jsonl"
    write_problems(config, 8, path)
    return path


def test_the_problems_are_turnkeeps_first_groups_in_order(config, problems, tmp_path):
    records = read_problems(problems)
    assert len(records) == 8 and {record["task"] for record in records} == {"math"}
    entry = records[0]["metadata"]["reasoning_gym"]
    assert entry["question"] == records[0]["question"] and entry["metadata"]["source_index"] == 0
    again = write_problems(CONFIG, 3, tmp_path / "again.jsonl")  # from the file: the same draw
    assert again == records[:3]


def test_the_reward_is_tool_chats_verdict_on_the_final_turn(model_dir, problems):
    record = read_problems(problems)[0]
    codec = TurnCodec(model_dir)
    turns = [f"<answer>{record['answer']}</answer>", f"<answer>{int(record['answer']) + 1}</answer>",
             f"{record['answer']}",  # no tags: the whole turn is the answer
             '<tool_call>{"name": "python", "arguments": {"code": "1 + 1"}}</tool_call>']  # no final answer
    ids = [codec.encode(turn + "\n") for turn in turns]  # each turn ends on the template's end-of-turn newline
    reward = ToolChatReward(codec)
    count = len(turns)
    rewards = reward(prompts=[None] * count, completions=[None] * count, completion_ids=ids,
                     question=[record["question"]] * count, answer_json=[json.dumps(record["answer"])] * count,
                     task=[record["task"]] * count, metadata_json=[json.dumps(record["metadata"])] * count,
                     index=[0] * count, trainer_state=None)
    assert rewards == [1.0, 0.0, 1.0, 0.0]
    summary = reward.tally.drain()
    assert summary["completions"] == 4 and summary["completion_tokens"] == sum(map(len, ids))
    assert summary["reward_mean"] == 0.5 and reward.tally.drain()["completions"] == 0


def _run(model_dir, problems, out, steps: int, *extra: str):
    return train(parse_args(["--model", str(model_dir), "--problems", str(problems), "--out", str(out),
                             "--steps", str(steps), "--save-steps", "1", "--group-size", "2",
                             "--prompts-per-step", "2", "--max-completion-length", "8", *extra]))


def test_a_two_step_run_writes_two_lines_and_resumes_from_its_checkpoint(model_dir, problems, tmp_path):
    steps_path = _run(model_dir, problems, tmp_path, 2)
    lines = [json.loads(line) for line in steps_path.read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert [line["problems"] for line in lines] == [[0, 1], [2, 3]]  # the file's order, 2 prompts a step
    assert all(line["completions"] == 4 and line["completion_tokens"] >= 4 and not line["resumed"] for line in lines)
    assert all(line["rss_mib"] > 0 and line["wall_s"] > 0 and 0.0 <= line["reward_mean"] <= 1.0 for line in lines)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["trl_version"] == "1.16.0" and meta["grpo_config"]["loss_type"] == "dapo"
    assert meta["derived"]["generation_batch_size"] == 4 and meta["derived"]["shuffle_dataset"] is False

    _run(model_dir, problems, tmp_path, 3, "--resume")
    lines = [json.loads(line) for line in steps_path.read_text().splitlines()]
    assert [(line["step"], line["resumed"], line["problems"]) for line in lines[2:]] == [(3, True, [4, 5])]
    assert json.loads((tmp_path / "meta.json").read_text())["starts"][-1]["resumed_from"].endswith("checkpoint-2")
