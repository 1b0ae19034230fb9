"""The OpenEnv guessing game, served by OpenEnv's own FastAPI app (`uvicorn turnkeep_example_openenv_guess.server:app`).

`reset(seed)` draws the secret from 1 to 8 with `random.Random(seed)`; each `step(GuessAction(number=n))` answers
too low / too high / right; the episode ends on the right number or after 4 guesses. The step reward is given on
the right guess only: 1.0 at the first try, 0.75 at the second, 0.5, 0.25. Deterministic given the seed and the
guesses, so turnkeep replays its episodes after a crash.
"""

from __future__ import annotations

import random
from typing import Any, Optional
from uuid import uuid4

from openenv.core.env_server import Action, Environment, Observation, State, create_app
from pydantic import Field

LOW, HIGH, TRIES = 1, 8, 4


class GuessAction(Action):
    number: int = Field(ge=LOW, le=HIGH, description=f"The guess, from {LOW} to {HIGH}")


class GuessObservation(Observation):
    message: str = Field(description="What the game says")
    tries_left: int = Field(default=TRIES, description="Guesses left")


class GuessState(State):
    secret: int = 0


class GuessEnvironment(Environment[GuessAction, GuessObservation, GuessState]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = GuessState()
        self._tries_left = TRIES

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> GuessObservation:
        self._state = GuessState(episode_id=episode_id or str(uuid4()), secret=random.Random(seed).randint(LOW, HIGH))
        self._tries_left = TRIES
        return GuessObservation(message=f"Guess my number from {LOW} to {HIGH} in {TRIES} tries.", tries_left=TRIES)

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        if self._tries_left == 0:
            return GuessObservation(message="No tries left.", tries_left=0, done=True, reward=0.0)
        self._state.step_count += 1
        self._tries_left -= 1
        secret, number = self._state.secret, action.number
        if number == secret:
            return GuessObservation(message=f"{number} is right!", tries_left=self._tries_left, done=True,
                                    reward=(self._tries_left + 1) / TRIES)
        message = f"{number} is too {'low' if number < secret else 'high'}."
        if self._tries_left == 0:
            return GuessObservation(message=f"{message} It was {secret}.", tries_left=0, done=True, reward=0.0)
        return GuessObservation(message=message, tries_left=self._tries_left, reward=0.0)

    @property
    def state(self) -> GuessState:
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=64)
