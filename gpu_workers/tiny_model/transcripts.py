"""Where the made-up tiny model's conversations come from: a `TranscriptSource` handed in by the caller.

The tokenizer is trained on a corpus of whole conversations (its base alphabet is the
characters they use), and the supervised warm start samples batches of them. The maker
never names a task: the default task's transcripts (`envs.calc_transcripts.CalcTranscripts`)
and an environment's demonstrations (`DemoSource`, `[model.tiny] demonstrations`) are two
sources of the same shape, chosen by `workers.model_maker`.

`DemoSource` reads an environment class's `demonstrations(rng, count, options)`. The
tokenizer's alphabet is every character of its corpus, so each character the environment
can send must occur in its demonstrations. The recipe names it by the class's entry, its
options and a digest of the corpus, so changing the environment's text makes a new model.
A demonstration follows the line protocol of the environment server (the prompt line, then
each policy turn followed by its observation line, the last policy turn without one), so
its odd-numbered lines are the policy's.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any, Protocol

from pydantic import BaseModel

TOKENIZER_CORPUS = 2000
"""Conversations the tokenizer is trained on."""


class DemonstrationsError(ValueError):
    """`[model.tiny] demonstrations` cannot be used; the message names the problem and the fix."""


class Episodes(Protocol):
    """How to play a source's conversations turn by turn, to measure a model's starting reward."""

    def prompts(self, rng: random.Random, count: int) -> list[tuple[str, Any]]:
        """`count` (first line without its "\\n", problem) pairs."""

    def reply(self, turn: str) -> str | None:
        """The observation line after the policy's `turn`; None when the turn ends the episode."""

    def score(self, problem: Any, turns: list[str]) -> float:
        """The episode's reward from the policy's turns."""


class TranscriptSource(Protocol):
    """Whole conversations in the tiny model's line protocol (every line ends in "\\n")."""

    name: str
    """For logs: "calc", or the environment's name."""
    chat_template: str
    """The tokenizer's chat template: how the environment server renders these conversations."""
    added_tokens: tuple[str, ...]
    """Strings the tokenizer keeps whole (a tool format's tags); empty for the line protocol."""
    error_rate_applies: bool
    """Whether `[model.tiny] warm_start_error_rate` shapes the conversations (and so the recipe)."""
    episodes: Episodes | None
    """How to play them, to measure the starting reward (None: it is not measured)."""

    def tokenizer_corpus(self, seed: int, count: int) -> list[str]:
        """The texts the tokenizer is trained on (deterministic in `seed`)."""

    def alphabet(self, seed: int) -> str:
        """The tokenizer's base alphabet: every character the run's conversations may hold."""

    def batch(self, rng: random.Random, count: int, error_rate: float) -> list[str]:
        """`count` conversations for one warm-start step."""

    def is_policy_line(self, index: int, line: str) -> bool:
        """Whether line `index` (0: the prompt) of a conversation is the policy's (a training target)."""

    def recipe(self, seed: int) -> dict[str, Any]:
        """What of the source shapes the model, merged into the cache key's recipe."""

    def check_covered(self, texts: list[str], seed: int) -> None:
        """Refuse conversations with a character the tokenizer (trained with `seed`) does not know."""


class DemoSource:
    """An environment class's `demonstrations(rng, count, options)`.

    The class decides its own share of wrong conversations (through its options, if it
    wants one), so `[model.tiny] warm_start_error_rate` does not apply.
    """

    error_rate_applies = False
    episodes = None

    def __init__(self, name: str, entry: str, cls: type, options: BaseModel, chat_template: str,
                 added_tokens: tuple[str, ...] = ()) -> None:
        """`cls`: an environment class of the public API (`envs.environment.Environment`) that overrides
        `demonstrations`; `chat_template`: the class's `demonstration_template`, else the line protocol's
        (`envs.codec.LINE_TEMPLATE`); `added_tokens`: its `demonstration_tokens`."""
        self.name = name
        self.entry = entry
        self.cls = cls
        self.options = options
        self.chat_template = chat_template
        self.added_tokens = tuple(added_tokens)
        self._corpora: dict[int, list[str]] = {}

    def tokenizer_corpus(self, seed: int, count: int = TOKENIZER_CORPUS) -> list[str]:
        if seed not in self._corpora:
            self._corpora[seed] = self.batch(random.Random(f"turnkeep-tokenizer-{seed}"), count, 0.0)
        return self._corpora[seed]

    def alphabet(self, seed: int) -> str:
        return "".join(sorted(set("".join(self.tokenizer_corpus(seed)))))

    def batch(self, rng: random.Random, count: int, error_rate: float) -> list[str]:
        texts = self.cls.demonstrations(rng, count, self.options)
        if not isinstance(texts, list) or len(texts) != count:
            got = f"{len(texts)} items" if isinstance(texts, list) else type(texts).__name__
            raise DemonstrationsError(f"{self.entry}: demonstrations(rng, {count}, options) returned {got}; "
                                      f"return a list of {count} conversations")
        for text in texts:
            if not isinstance(text, str) or not text.endswith("\n") or "\n" not in text[:-1]:
                raise DemonstrationsError(
                    f"{self.entry}: a demonstration is not a whole conversation ({text!r:.80}); return text "
                    "of two or more lines (the prompt, then the turns and observations), each ending in \"\\n\""
                )
        return texts

    def is_policy_line(self, index: int, line: str) -> bool:
        return index % 2 == 1

    def recipe(self, seed: int) -> dict[str, Any]:
        corpus = self.tokenizer_corpus(seed)
        own_format = {"template": self.chat_template, "tokens": list(self.added_tokens)} \
            if getattr(self.cls, "demonstration_template", None) is not None or self.added_tokens else {}
        return {"demonstrations": {
            "entry": self.entry,
            "options": self.options.model_dump(mode="json"),
            "digest": hashlib.sha256(json.dumps(corpus).encode()).hexdigest(),
            **own_format,
        }}

    def check_covered(self, texts: list[str], seed: int) -> None:
        unknown = set("".join(texts)) - set(self.alphabet(seed))
        if unknown:
            raise DemonstrationsError(
                f"{self.entry}: a demonstration holds {''.join(sorted(unknown))!r}, which none of the first "
                f"{TOKENIZER_CORPUS} demonstrations (the tokenizer's corpus) used; make every character the "
                "environment can send occur in its demonstrations often enough"
            )
