"""The turn codec: a conversation rendered once by the model's chat template, then extended by exact
deltas; the template's rendering of the same messages gives the same ids."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from tests.envs.chat_model import ENDOFTEXT, IM_END, QWEN_TEMPLATE, save_chat_tokenizer
from turnkeep.envs.calc_task import ALPHABET, sample_problem, synthetic_transcript
from turnkeep.envs.codec import LINE_SOURCE, LINE_TEMPLATE, ChatTemplateError, TurnCodec
from turnkeep.gpu_workers.tiny_model.tokenizer import encode, save_tokenizer, special_ids, train_tokenizer
from turnkeep.schemas.config import TaskConfig
from turnkeep.schemas.rollout import Segment


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qwen_style")
    save_chat_tokenizer(out)
    return out


@pytest.fixture(scope="module")
def codec(chat_dir: Path) -> TurnCodec:
    return TurnCodec(chat_dir)


@pytest.fixture(scope="module")
def hf(chat_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(chat_dir)


def tiny_tokenizer() -> Tokenizer:
    rng = random.Random(0)
    return train_tokenizer(
        [synthetic_transcript(sample_problem(TaskConfig(), rng), rng, 0.5) for _ in range(300)] + ["R ERR\n"] * 4,
        ALPHABET)


def save_tiny_dir(out: Path, tok: Tokenizer) -> Path:
    """The tiny model's tokenizer files as `build.py` writes them (config.json and generation_config.json ids)."""
    out.mkdir(parents=True, exist_ok=True)
    save_tokenizer(tok, out, model_max_length=256, chat_template=LINE_TEMPLATE)
    for name in ("config.json", "generation_config.json"):
        (out / name).write_text(json.dumps(special_ids(tok)))
    return out


def closed(codec: TurnCodec, text: str) -> list[int]:
    """The ids a policy generates for `text`, ended on the template's end-of-turn token."""
    return codec.encode(text) + list(codec.end_of_turn_ids)


def test_end_of_turn_and_stop_tokens_come_from_the_template_and_the_configs(codec: TurnCodec) -> None:
    im_end, endoftext = codec.encode(IM_END), codec.encode(ENDOFTEXT)
    assert codec.template_source == "tokenizer_config.json"
    assert list(codec.end_of_turn_ids) == im_end and codec.closing_ids == im_end
    assert codec.stop_ids == sorted(im_end + endoftext)


def test_the_prompt_is_the_templates_first_user_message_with_the_generation_prompt(codec: TurnCodec, hf) -> None:
    messages = [{"role": "user", "content": "What is 37 plus 48?"}]
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    ids = codec.conversation_start("What is 37 plus 48?")
    assert codec.decode(ids) == text
    assert ids == hf(text, add_special_tokens=False)["input_ids"]


def test_a_system_message_opens_the_conversation_as_the_template_renders_it(codec: TurnCodec, hf) -> None:
    messages = [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "2+3?"}]
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nAnswer with a number.<|im_end|>")
    ids = codec.conversation_start("2+3?", None, "Answer with a number.")
    assert ids == hf(text, add_special_tokens=False)["input_ids"]


def test_turn_by_turn_ids_equal_the_templates_rendering_of_the_whole_conversation(codec: TurnCodec, hf) -> None:
    turns = ['<tool_call>\n{"name": "add", "arguments": {"a": 37, "b": 48}}\n</tool_call>',
             "I will ask the user.", "The answer is 85."]
    replies = [("tool", "85"), ("user", "Are you sure?"), ("tool", "error: no valid tool call found")]
    messages = [{"role": "user", "content": "What is 37 plus 48?"}]
    ids = codec.conversation_start(messages[0]["content"])
    for turn, (role, reply) in zip(turns, replies, strict=True):
        generated = closed(codec, turn)
        assert codec.turn_text(generated) == turn
        ids += generated + codec.after_turn(generated, reply, role)
        messages += [{"role": "assistant", "content": turn}, {"role": role, "content": reply}]
    whole = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert codec.decode(ids) == whole
    assert ids == hf(whole, add_special_tokens=False)["input_ids"]


def test_the_newline_after_the_end_of_turn_token_is_glue(codec: TurnCodec) -> None:
    glue = codec.after_turn(closed(codec, "hi"), "85", "tool")
    assert codec.decode(glue) == "\n<|im_start|>user\n<tool_response>\n85\n</tool_response><|im_end|>\n" \
                                 "<|im_start|>assistant\n"


def test_a_cut_turn_is_closed_before_the_next_message(codec: TurnCodec, hf) -> None:
    cut = codec.encode("The answer is")  # max_tokens hit: no end-of-turn token
    assert not codec.turn_closed(cut) and codec.turn_text(cut) == "The answer is"
    glue = codec.after_turn(cut, "85", "tool")
    assert glue[: len(codec.closing_ids)] == codec.closing_ids
    messages = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "The answer is"},
                {"role": "tool", "content": "85"}]
    whole = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert codec.decode(codec.conversation_start("Q") + cut + glue) == whole


def test_a_final_turn_gets_no_generation_prompt_and_nothing_follows_a_silent_one(codec: TurnCodec) -> None:
    turn = closed(codec, "done")
    assert codec.decode(codec.after_turn(turn, "bye", "tool", done=True)).endswith("</tool_response><|im_end|>\n")
    assert codec.after_turn(turn, None, done=True) == []
    assert codec.after_turn(codec.encode("cut"), None, done=True) == []
    # No observation but the episode goes on: straight to the next generation prompt.
    assert codec.decode(codec.after_turn(turn, None)) == "\n<|im_start|>assistant\n"


def test_another_declared_eos_ends_a_turn_but_stays_in_its_text(codec: TurnCodec) -> None:
    turn = codec.encode("hi" + ENDOFTEXT)
    assert codec.turn_closed(turn) and codec.turn_text(turn) == "hi" + ENDOFTEXT
    assert codec.after_turn(turn, "x") == codec.observation_ids("x")


def test_a_replay_differs_at_the_first_turn_whose_observation_is_not_the_saved_one(codec: TurnCodec) -> None:
    segments = [Segment(kind="prompt", token_ids=codec.conversation_start("Q"))]
    for turn, (role, reply) in zip(["a", "b"], [("tool", "1"), ("user", "2")]):
        ids = closed(codec, turn)
        segments += [Segment(kind="policy", token_ids=ids), Segment(kind="tool", token_ids=codec.after_turn(
            ids, reply, role))]
    assert codec.first_replay_difference(segments, ["1", "2"]) is None
    assert codec.first_replay_difference(segments, ["1", "3"]) == 1
    assert codec.first_replay_difference(segments, ["0", "2"]) == 0
    assert codec.first_replay_difference(segments, ["1"]) == 1
    assert codec.first_replay_difference(segments, ["1", "2", "3"]) == 2
    assert codec.first_replay_difference(segments, ["1", None]) == 1


def test_a_template_file_is_read_and_named_templates_pick_default(tmp_path: Path, codec: TurnCodec) -> None:
    save_chat_tokenizer(tmp_path / "file", template_file=True)
    from_file = TurnCodec(tmp_path / "file")
    assert from_file.template_source == "chat_template.jinja"
    assert from_file.conversation_start("Q") == codec.conversation_start("Q")
    save_chat_tokenizer(tmp_path / "named")
    config_path = tmp_path / "named" / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "unused"},
                               {"name": "default", "template": QWEN_TEMPLATE}]
    config_path.write_text(json.dumps(config))
    assert TurnCodec(tmp_path / "named").conversation_start("Q") == codec.conversation_start("Q")


def test_a_template_that_refuses_a_role_names_it(tmp_path: Path) -> None:
    save_chat_tokenizer(tmp_path)
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = ("{% for m in messages %}{% if m['role'] == 'tool' %}"
                               "{{ raise_exception('no tool role here') }}{% endif %}"
                               "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                               "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    config_path.write_text(json.dumps(config))
    codec = TurnCodec(tmp_path)
    assert codec.decode(codec.after_turn(closed(codec, "a"), "b", "user")) == \
        "\n<|im_start|>user\nb<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ChatTemplateError, match="no tool role here") as err:
        codec.after_turn(closed(codec, "a"), "b", "tool")
    assert "'tool'" in str(err.value)


def test_a_template_without_the_assistants_content_is_refused(tmp_path: Path) -> None:
    save_chat_tokenizer(tmp_path)
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['role'] }}{% endfor %}"
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="assistant message's content"):
        TurnCodec(tmp_path)


# -- the made-up tiny model: its line protocol as a template ----------------------------


@pytest.fixture(scope="module")
def tiny_tok() -> Tokenizer:
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def tiny(tiny_tok: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> TurnCodec:
    return TurnCodec(save_tiny_dir(tmp_path_factory.mktemp("tiny"), tiny_tok))


def old_concatenation(tok: Tokenizer, question: str, turns: list[list[int]], replies: list[str | None]) -> list[int]:
    """What the agent loop built before chat templates: bos, the encoded prompt line, each turn's ids, each
    reply's encoded line."""
    ids = [special_ids(tok)["bos_token_id"]] + encode(tok, question + "\n")
    for turn, reply in zip(turns, replies, strict=True):
        ids += turn + (encode(tok, reply) if reply is not None else [])
    return ids


def test_the_tiny_models_template_ends_turns_at_the_newline(tiny: TurnCodec, tiny_tok: Tokenizer) -> None:
    newline, eos = tiny_tok.token_to_id("\n"), special_ids(tiny_tok)["eos_token_id"]
    assert tiny.template_source == "tokenizer_config.json"
    assert tiny.end_of_turn_ids == (newline,) and tiny.closing_ids == [newline]
    assert tiny.stop_ids == sorted([newline, eos])


def test_calc_conversations_keep_the_ids_of_the_line_protocol(tiny: TurnCodec, tiny_tok: Tokenizer) -> None:
    rng = random.Random(3)
    eos = special_ids(tiny_tok)["eos_token_id"]
    for _ in range(50):
        problem = sample_problem(TaskConfig(), rng)
        lines = synthetic_transcript(problem, rng, 0.5).splitlines(keepends=True)
        turns = [encode(tiny_tok, line) for line in lines[1:] if line.startswith(("C", "A"))]
        replies: list[str | None] = [line for line in lines[1:] if line.startswith("R")] + [None]
        if rng.random() < 0.3:  # a turn that ended on <eos>: ended, kept as generated (its text shows <eos>)
            turns[0] = turns[0][:-1] + [eos]
            replies[0] = "R ERR\n"
        ids = tiny.conversation_start(problem.question + "\n")
        for turn, reply in zip(turns, replies, strict=True):
            assert tiny.turn_text(turn) == tiny_tok.decode(turn, skip_special_tokens=False).removesuffix("\n")
            ids += turn + tiny.after_turn(turn, reply, "tool", done=reply is None)
        assert ids == old_concatenation(tiny_tok, problem.question, turns, replies)


def test_a_cut_tiny_turn_is_closed_with_a_newline(tiny: TurnCodec, tiny_tok: Tokenizer) -> None:
    cut = encode(tiny_tok, "C 12+3")
    assert tiny.after_turn(cut, "R 15\n") == encode(tiny_tok, "\nR 15\n")


def test_the_tiny_template_renders_the_transcript_in_transformers(tiny: TurnCodec, tiny_tok: Tokenizer,
                                                                   tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(save_tiny_dir(tmp_path, tiny_tok))
    messages = [{"role": "user", "content": "Q 37+48-12\n"}, {"role": "assistant", "content": "C 37+48"},
                {"role": "tool", "content": "R 85\n"}, {"role": "assistant", "content": "C 85-12"},
                {"role": "tool", "content": "R 73\n"}, {"role": "assistant", "content": "A 73"}]
    expected = "<bos>Q 37+48-12\nC 37+48\nR 85\nC 85-12\nR 73\nA 73\n"
    assert hf.apply_chat_template(messages, tokenize=False) == expected
    assert tiny.render(messages, add_generation_prompt=True) == expected


def test_no_template_falls_back_to_the_line_protocol(tiny_tok: Tokenizer, tmp_path: Path) -> None:
    tiny_tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps(special_ids(tiny_tok)))
    codec = TurnCodec(tmp_path)
    assert codec.template_source == LINE_SOURCE
    assert codec.conversation_start("Q 1+2\n") == [special_ids(tiny_tok)["bos_token_id"]] + encode(tiny_tok,
                                                                                                   "Q 1+2\n")
    assert codec.end_of_turn_ids == (tiny_tok.token_to_id("\n"),)


def test_no_template_needs_a_one_token_newline(tmp_path: Path) -> None:
    from tokenizers import models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="newline"):
        TurnCodec(tmp_path)
    assert "'\\n'" in LINE_TEMPLATE  # the line template's end of turn, written as a jinja string
