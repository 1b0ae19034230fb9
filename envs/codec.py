"""Text <-> token ids for the agent loop, read from the policy's own model directory.

Conversations are built by concatenating separately encoded lines, so `encode` never
adds special tokens; the beginning-of-sequence token is prepended once per conversation.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer


class TurnCodec:
    def __init__(self, model_dir: Path) -> None:
        self._tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        config = json.loads((model_dir / "config.json").read_text())
        self.bos_id: int | None = config.get("bos_token_id")
        newline = self._tokenizer.encode("\n", add_special_tokens=False).ids
        if len(newline) != 1:
            raise ValueError(
                f"the tokenizer in {model_dir} encodes a newline as {newline}; turns end at a newline, "
                "so it must be a single token"
            )
        self.newline_id = newline[0]

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        # Specials stay in, so a turn that emits <eos> parses as malformed instead of silently clean.
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def conversation_start(self, prompt_line: str) -> list[int]:
        prefix = [self.bos_id] if self.bos_id is not None else []
        return prefix + self.encode(prompt_line)
