"""Where the made-up tiny model's conversations come from: the calculator, or an environment's demonstrations.

The tokenizer is trained on a corpus of whole conversations (its base alphabet is the
characters they use), and the supervised warm start samples batches of them. Both read a
`TranscriptSource`:

- `CalcTranscripts` (the default): generated calculator questions written out by
  `envs.calc_task.synthetic_transcript`, exactly as before sources existed (same
  random draws, same alphabet, same cache key: it adds nothing to the recipe).
- `DemoSource` (`[model.tiny] demonstrations = "<env name>"`): the conversations of an
  environment class's `demonstrations(rng, count, options)`. The tokenizer's alphabet is
  every character of its corpus, so each character the environment can send must occur
  in its demonstrations. The recipe names it by the class's entry, its options and a
  digest of the corpus, so changing the environment's text makes a new model.

Which lines are trained on: the policy's own. Calculator lines are told by their tag
("C ...", "A ..."); a demonstration follows the line protocol of the environment server
(the prompt line, then each policy turn followed by its observation line, the last
policy turn without one), so its odd-numbered lines are the policy's.

`demonstration_source(cfg)` turns a run's config into the source to pass to
`ensure_tiny_model` (None when the run uses the calculator's transcripts).
"""

from __future__ import annotations

import hashlib
import json
import random
from abc import ABC, abstractmethod
from typing import Any

from pydantic import BaseModel

from envs.calc_task import ALPHABET, sample_problem, synthetic_transcript
from envs.environment import Environment
from schemas.config import TaskConfig, TurnkeepConfig

TOKENIZER_CORPUS = 2000
"""Conversations the tokenizer is trained on."""
CALC_EXTRA_LINES = ["R ERR\n"] * 8
"""Lines the calculator's transcripts never contain but its environment sends."""
CALC_POLICY_TAGS = ("C", "A")
"""Calculator lines the policy writes (trained on); the rest is context."""


class DemonstrationsError(ValueError):
    """`[model.tiny] demonstrations` cannot be used; the message names the problem and the fix."""


class TranscriptSource(ABC):
    """Whole conversations in the tiny model's line protocol (every line ends in "\\n")."""

    name: str
    """For logs: "calc", or the environment's name."""
    calc_eval: bool = False
    """True when the calculator's built-in evaluation (`rollout_reward`) can measure the warm-started model."""

    @abstractmethod
    def tokenizer_corpus(self, seed: int) -> list[str]:
        """The texts the tokenizer is trained on (deterministic in `seed`)."""

    @abstractmethod
    def alphabet(self, seed: int) -> str:
        """The tokenizer's base alphabet: every character the run's conversations may hold."""

    @abstractmethod
    def batch(self, rng: random.Random, count: int, error_rate: float) -> list[str]:
        """`count` conversations for one warm-start step."""

    @abstractmethod
    def is_policy_line(self, index: int, line: str) -> bool:
        """Whether line `index` (0: the prompt) of a conversation is the policy's (a training target)."""

    @abstractmethod
    def recipe(self, seed: int) -> dict[str, Any] | None:
        """What of the source shapes the model, for the cache key (None: nothing beyond [task])."""

    def check_covered(self, texts: list[str], seed: int) -> None:
        """Refuse conversations with a character the tokenizer (trained with `seed`) does not know."""


class CalcTranscripts(TranscriptSource):
    """The generated calculator transcripts, `[task]`'s problems with `error_rate` deliberate mistakes."""

    name = "calc"
    calc_eval = True

    def __init__(self, task: TaskConfig) -> None:
        self.task = task

    def tokenizer_corpus(self, seed: int) -> list[str]:
        rng = random.Random(f"turnkeep-tokenizer-{seed}")
        return self.batch(rng, TOKENIZER_CORPUS, 0.5) + CALC_EXTRA_LINES

    def alphabet(self, seed: int) -> str:
        return ALPHABET

    def batch(self, rng: random.Random, count: int, error_rate: float) -> list[str]:
        # One problem then its transcript, in turn: the draws (and so the bytes) of every model made so far.
        return [synthetic_transcript(sample_problem(self.task, rng), rng, error_rate) for _ in range(count)]

    def is_policy_line(self, index: int, line: str) -> bool:
        return line.startswith(CALC_POLICY_TAGS)

    def recipe(self, seed: int) -> None:
        return None


class DemoSource(TranscriptSource):
    """An environment class's `demonstrations(rng, count, options)`.

    The class decides its own share of wrong conversations (through its options, if it
    wants one), so `[model.tiny] warm_start_error_rate` does not apply.
    """

    def __init__(self, name: str, entry: str, cls: type[Environment], options: BaseModel) -> None:
        self.name = name
        self.entry = entry
        self.cls = cls
        self.options = options
        self._corpora: dict[int, list[str]] = {}

    def tokenizer_corpus(self, seed: int) -> list[str]:
        if seed not in self._corpora:
            self._corpora[seed] = self.batch(random.Random(f"turnkeep-tokenizer-{seed}"), TOKENIZER_CORPUS, 0.0)
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
        return {
            "entry": self.entry,
            "options": self.options.model_dump(mode="json"),
            "digest": hashlib.sha256(json.dumps(corpus).encode()).hexdigest(),
        }

    def check_covered(self, texts: list[str], seed: int) -> None:
        unknown = set("".join(texts)) - set(self.alphabet(seed))
        if unknown:
            raise DemonstrationsError(
                f"{self.entry}: a demonstration holds {''.join(sorted(unknown))!r}, which none of the first "
                f"{TOKENIZER_CORPUS} demonstrations (the tokenizer's corpus) used; make every character the "
                "environment can send occur in its demonstrations often enough"
            )


def source_for(task: TaskConfig, demonstrations: DemoSource | None) -> TranscriptSource:
    return demonstrations if demonstrations is not None else CalcTranscripts(task)


def demonstration_source(cfg: TurnkeepConfig) -> DemoSource | None:
    """The source `[model.tiny] demonstrations` names (None when unset: the calculator's transcripts).

    The name is an `[environments.<name>]` of kind "python" (its entry and options), or an
    import path `package.module:ClassName` (a remote environment's class, with its default
    options). The class is imported (its package must be installed where the model is made)
    and must offer demonstrations; `DemonstrationsError` names the problem otherwise.
    """
    from envs.loading import EnvironmentLoadError, load_environment

    name = cfg.model.tiny.demonstrations
    if name is None:
        return None
    where = f"model.tiny.demonstrations = {name!r}"
    entry, options = _entry_and_options(cfg, name, where)
    try:
        loaded = load_environment(entry, options, "entry")
    except EnvironmentLoadError as err:
        raise DemonstrationsError(f"{where}: {err}") from None
    if getattr(loaded.cls.demonstrations, "__func__", None) is Environment.demonstrations.__func__:
        raise DemonstrationsError(
            f"{where}: {entry} offers no demonstrations; implement the classmethod demonstrations(rng, count, "
            "options), or unset model.tiny.demonstrations to warm-start on the calculator"
        )
    return DemoSource(name, entry, loaded.cls, loaded.options)


def _entry_and_options(cfg: TurnkeepConfig, name: str, where: str) -> tuple[str, dict]:
    if ":" in name:
        return name, {}
    spec = cfg.environments.get(name)
    if spec is None:
        raise DemonstrationsError(f"{where}: there is no [environments.{name}] (configured: "
                                  f"{', '.join(sorted(cfg.environments))}); name one of them")
    if spec.kind != "python" or spec.entry is None:
        raise DemonstrationsError(
            f"{where}: [environments.{name}] is kind = {spec.kind!r}; demonstrations come from a class loaded by "
            'entry (kind = "python"). For a remote server, name its class instead: demonstrations = '
            '"package.module:ClassName" (installed where the model is made)'
        )
    return spec.entry, spec.options
