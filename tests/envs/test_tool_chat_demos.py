"""The made-up tiny model's `tool_chat` format: its demonstrations are exactly what the environment server builds
turn by turn through the tiny template (so the warm start trains on the run's own token ids), with the tool
format's tags as single tokens."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from tests.envs.test_codec import closed
from turnkeep.envs.codec import TurnCodec
from turnkeep.envs.environment import EnvContext
from turnkeep.envs.tool_chat_demos import TEMPLATE, TOKENS, demonstrations
from turnkeep.envs.tool_chat_env import ToolChatEnvironment, ToolChatOptions
from turnkeep.gpu_workers.tiny_model.tokenizer import encode, save_tokenizer, special_ids, train_tokenizer
from turnkeep.schemas.rollout import Problem

OPTIONS = ToolChatOptions(reasoning_gym={"tasks": ["chain_sum", "countdown"], "heldout_size": 2},
                          demo_error_rate=0.5)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    corpus = demonstrations(random.Random(0), 300, OPTIONS)
    tok = train_tokenizer(corpus, "".join(sorted(set("".join(corpus)))), TOKENS)
    out = tmp_path_factory.mktemp("tiny")
    save_tokenizer(tok, out, model_max_length=512, chat_template=TEMPLATE)
    for name in ("config.json", "generation_config.json"):
        (out / name).write_text(json.dumps(special_ids(tok)))
    return out, tok, corpus


def test_each_tag_is_one_token_and_encoding_stays_compositional_across_lines(tiny_dir) -> None:
    _, tok, corpus = tiny_dir
    for token in TOKENS:
        assert len(encode(tok, token)) == 1, token
    for text in corpus[:50]:
        lines = text.splitlines(keepends=True)
        assert encode(tok, text) == [i for line in lines for i in encode(tok, line)]


def test_a_demonstration_is_what_the_environment_server_builds_through_the_template(tiny_dir) -> None:
    out, tok, corpus = tiny_dir
    codec = TurnCodec(out)
    assert list(codec.end_of_turn_ids) == encode(tok, "\n")
    played = 0
    for text in demonstrations(random.Random(5), 40, OPTIONS):
        question, *turns = text.splitlines()
        policy, replies = turns[0::2], turns[1::2]
        env = ToolChatEnvironment(Problem(question=question, answer=None, env="math"), EnvContext(options=OPTIONS))
        ids = codec.conversation_start(env.prompt(), env.tools())
        for turn in policy:
            generated = closed(codec, turn)
            result = asyncio.run(env.step(codec.turn_text(generated)))
            ids += generated + codec.after_turn(generated, result.observation, result.role, result.done)
        assert [f"<tool_response>{reply}</tool_response>" for reply in _tool_replies(policy)] == replies
        assert ids == [special_ids(tok)["bos_token_id"]] + encode(tok, text)
        played += 1
    assert played == 40


def _tool_replies(policy: list[str]) -> list[str]:
    from turnkeep.envs.python_tool import run_python
    from turnkeep.envs.tool_calls import parse_tool_calls

    return [run_python(call.arguments) for turn in policy for call in parse_tool_calls(turn).calls]


def test_demonstrations_need_tasks() -> None:
    with pytest.raises(ValueError, match="makes demonstrations from options.reasoning_gym tasks"):
        demonstrations(random.Random(0), 1, ToolChatOptions())


@pytest.mark.parametrize("no_tools", [{"tools": []}, {"max_tool_calls": 0}])
def test_without_tools_the_demonstrations_answer_directly_and_the_default_ones_are_unchanged(no_tools) -> None:
    direct = demonstrations(random.Random(0), 200, OPTIONS.model_copy(update=no_tools))
    assert not any("<tool_call>" in conversation for conversation in direct)
    assert all(conversation.count("\n") == 2 and "<answer>" in conversation for conversation in direct)
    with_tools = demonstrations(random.Random(0), 200, OPTIONS)
    assert sum("<tool_call>" in conversation for conversation in with_tools) > 100
    # Same draws (the same random numbers taken in the same order): only the tool call is left out.
    assert [c.split("\n")[0] for c in direct] == [c.split("\n")[0] for c in with_tools]
    assert [c.rsplit("<answer>", 1)[1] for c in direct] == [c.rsplit("<answer>", 1)[1] for c in with_tools]
