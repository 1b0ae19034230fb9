"""The tiny model's tokenizer: digits and newline alone, exact and compositional encoding."""

import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from turnkeep.envs.calc_task import ALPHABET, sample_problem, synthetic_transcript
from turnkeep.envs.codec import LINE_TEMPLATE
from turnkeep.gpu_workers.tiny_model.tokenizer import (
    decode,
    encode,
    load_tokenizer,
    newline_id,
    save_tokenizer,
    special_ids,
    train_tokenizer,
)
from turnkeep.schemas.config import TaskConfig


def _transcripts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    task = TaskConfig(operators="+-*")
    return [synthetic_transcript(sample_problem(task, rng), rng, 0.5) for _ in range(n)]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return train_tokenizer(_transcripts(300, 0) + ["R ERR\n"] * 4, ALPHABET)


def test_vocabulary_is_small_with_specials_first(tok: Tokenizer) -> None:
    assert tok.get_vocab_size() < 64
    assert special_ids(tok) == {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def test_every_digit_and_the_newline_are_single_tokens(tok: Tokenizer) -> None:
    for digit in "0123456789":
        assert len(encode(tok, digit)) == 1
    assert encode(tok, "\n") == [newline_id(tok)]
    ids = encode(tok, "R 1234567890\n")
    assert [tok.id_to_token(i) for i in ids] == ["R ", *"1234567890", "\n"]


def test_round_trip_is_exact(tok: Tokenizer) -> None:
    for text in _transcripts(100, 1) + ["R ERR\n", "C  1 +2\n\n", "A -0\n", " \n "]:
        assert decode(tok, encode(tok, text)) == text


def test_encode_never_adds_special_tokens(tok: Tokenizer) -> None:
    assert set(encode(tok, "Q 1+2\n")).isdisjoint(special_ids(tok).values())


def test_encoding_lines_separately_equals_encoding_the_transcript(tok: Tokenizer) -> None:
    assert encode(tok, "Q 1+2\n") + encode(tok, "C 1+2\n") == encode(tok, "Q 1+2\nC 1+2\n")
    for text in _transcripts(100, 2):
        pieces = [i for line in text.splitlines(keepends=True) for i in encode(tok, line)]
        assert pieces == encode(tok, text)


def test_training_is_deterministic(tok: Tokenizer) -> None:
    again = train_tokenizer(_transcripts(300, 0) + ["R ERR\n"] * 4, ALPHABET)
    assert again.to_str() == tok.to_str()


def test_saved_files_load_in_transformers(tok: Tokenizer, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    save_tokenizer(tok, tmp_path, model_max_length=256, chat_template=LINE_TEMPLATE)
    text = _transcripts(1, 3)[0]
    assert load_tokenizer(tmp_path).to_str() == tok.to_str()
    hf = AutoTokenizer.from_pretrained(tmp_path)
    assert hf(text)["input_ids"] == encode(tok, text)
    assert hf.decode(encode(tok, text)) == text
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (1, 2, 0)
