"""A tiny BPE tokenizer for the made-up model, trained locally on calc transcripts (or demonstrations).

Conventions (the environment, the warm start and the trainer all rely on them):
- `encode(tok, text)` never adds special tokens. A conversation is `[bos_id]` followed
  by the ids of its lines, each encoded on its own; the caller prepends bos once.
- Encoding is compositional across lines: for any `a` ending in "\\n",
  `encode(a + b) == encode(a) + encode(b)`, because the pre-tokenizer isolates "\\n"
  and no merge can cross a pre-token boundary. So the ids the environment builds turn
  by turn equal the ids of the whole transcript the warm start trained on.
- Every digit is its own token (merging digits makes arithmetic harder to learn),
  "\\n" is its own token (`newline_id`: policy turns stop on it), and a line's leading
  tag with its space ("C ", "R ", ...) is one token.
- `decode(encode(s)) == s` for transcript text, spaces and newlines included.

Saved as a Hugging Face tokenizer (tokenizer.json + tokenizer_config.json) so both
`transformers.AutoTokenizer` and vLLM load it; with no post-processor, they add no
special tokens either. Its `chat_template` is the one-line protocol
(handed in by the transcript source: `envs.codec.LINE_TEMPLATE` writes bos, then each
message's content as is, an assistant turn ended by "\\n", an empty generation prompt), so the agent loop renders conversations of
this model as of any chat model, and its end-of-turn token (what the template writes after
an assistant's content) is the newline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIAL_TOKENS = [PAD, BOS, EOS]  # ids 0, 1, 2
NEWLINE = "\n"
VOCAB_LIMIT = 64
"""Upper bound on the vocabulary; training stops earlier when no pair is left to merge."""

# One digit, one newline, a run of capitals with an optional trailing space (a line
# tag like "C " or "ERR"), or any other single character.
_PIECE = Regex(r"\d|\n|[A-Z]+ ?|[^\dA-Z\n]")


def train_tokenizer(texts: Iterable[str], alphabet: str, added_tokens: tuple[str, ...] = ()) -> Tokenizer:
    """Train the BPE on transcripts; the tokenizers BPE trainer is deterministic.

    `alphabet`: the base characters, each its own token (the source's). The
    vocabulary holds VOCAB_LIMIT tokens, or more for a large alphabet (room for its tags).
    `added_tokens`: strings kept whole (matched before the pre-tokenizer, so encoding stays compositional
    across lines), given the ids after the BPE's.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Split(_PIECE, behavior="isolated")
    tok.decoder = decoders.Fuse()
    base = sorted(set(alphabet))
    trainer = trainers.BpeTrainer(
        vocab_size=max(VOCAB_LIMIT, len(SPECIAL_TOKENS) + len(base) + 16),
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=base,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if added_tokens:
        tok.add_tokens(list(added_tokens))
    return tok


def encode(tok: Tokenizer, text: str) -> list[int]:
    """Token ids of `text`, never with special tokens (see the module docstring)."""
    return tok.encode(text, add_special_tokens=False).ids


def decode(tok: Tokenizer, ids: list[int]) -> str:
    """Text of `ids`, special tokens dropped."""
    return tok.decode(ids, skip_special_tokens=True)


def newline_id(tok: Tokenizer) -> int:
    """Id of "\\n": the stop token of every policy turn."""
    return _token_id(tok, NEWLINE)


def special_ids(tok: Tokenizer) -> dict[str, int]:
    """`bos_token_id`, `eos_token_id` and `pad_token_id`, as model configs name them."""
    return {
        "bos_token_id": _token_id(tok, BOS),
        "eos_token_id": _token_id(tok, EOS),
        "pad_token_id": _token_id(tok, PAD),
    }


def save_tokenizer(tok: Tokenizer, directory: Path, model_max_length: int, chat_template: str) -> None:
    """Write tokenizer.json and tokenizer_config.json (with the conversations' chat template) into `directory`."""
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": False,
        "add_eos_token": False,
        # The default cleanup would rewrite spaces before punctuation; transcripts need
        # an exact round trip.
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": chat_template,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def load_tokenizer(directory: Path) -> Tokenizer:
    """The tokenizer saved in a model directory."""
    return Tokenizer.from_file(str(directory / "tokenizer.json"))


def _token_id(tok: Tokenizer, token: str) -> int:
    token_id = tok.token_to_id(token)
    if token_id is None:
        raise ValueError(f"token {token!r} is not in the vocabulary")
    return token_id
