"""The scripted player turnkeep's OpenEnv adapter plays the game with to write the tiny model's demonstrations
(`options.demonstrator`): it halves the range after each answer, and with `rng` sometimes guesses at random
(now and then out of range, so the environment's refusal appears in the demonstrations too)."""

from __future__ import annotations

import random
import re
from typing import Any

from turnkeep_example_openenv_guess.server import HIGH, LOW

_HINT = re.compile(r"(\d+) is too (low|high)")


def play(history: list[dict[str, Any]], rng: random.Random) -> dict[str, Any] | None:
    """The next action's fields after the observations so far (the reset's first), or None to stop."""
    low, high = LOW, HIGH
    for observation in history[1:]:
        hint = _HINT.match(observation.get("message", ""))
        if hint is not None:
            number, side = int(hint.group(1)), hint.group(2)
            low, high = (max(low, number + 1), high) if side == "low" else (low, min(high, number - 1))
    draw = rng.random()
    if draw < 0.05:  # out of range: the environment's refusal is in the demonstrations too
        return {"number": rng.choice([LOW - 1, HIGH + 1])}
    if draw < 0.35 or low > high:
        return {"number": rng.randint(LOW, HIGH)}
    return {"number": (low + high) // 2}
