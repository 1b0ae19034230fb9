"""Which process a chaos run kills, and when: the moments (`--at`) and the kill schedule.

A moment is a named phase, where the product waits at a hook (`primitives.chaos_points`),
or `training` / `random`, a moment some seconds after a train step with no hook at all.
The schedule pairs every target with every moment over a long run, from one seed.
"""

from __future__ import annotations

import random

from turnkeep.controller.snapshot.periodic_attempts import PARKED_INTERVAL_S
from turnkeep.primitives.chaos_points import POINTS
from turnkeep.schemas.config import TurnkeepConfig

TRAINING = "training"
"""A random moment a few seconds after a train step (no hook in the code)."""
RANDOM = "random"
"""Any moment once the incarnation trains (no hook, no step to wait for after the first)."""
ALL_POINTS = (TRAINING, *POINTS)
ALL_MOMENTS = (RANDOM, *ALL_POINTS)
FRESH_START_SKIPS = ("restore",)
"""Points a first start never reaches (it has nothing to restore), so round 1 avoids them."""
RANDOM_MIN_DELAY_S = 0.5
"""After a train step of the incarnation, the random moment falls at least this many seconds later ..."""
RANDOM_MIN_SPAN_S = 12.0
"""... and at most `random_max_delay_s` later: two snapshot intervals, never less than this."""


def parse_points(text: str) -> list[str]:
    points = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in points if p not in ALL_MOMENTS]
    if unknown or not points:
        raise ValueError(f"--at {text!r}: unknown {unknown}; choose from {', '.join(ALL_MOMENTS)}")
    return list(dict.fromkeys(points))


def random_max_delay_s(config: TurnkeepConfig) -> float:
    """Kills that always land before the first snapshot of an incarnation would only ever test fresh
    restores: the window spans two snapshot intervals, so some incarnations publish and some do not."""
    # Unset, a run with journaled agents takes attempts at its trainer checkpoints only; the parked default's 40 s
    # window holds about one checkpoint of the built-in task (every 20 steps, ~35 s) and is the one earlier chaos
    # runs used.
    interval = (config.snapshot.attempt_interval_s or PARKED_INTERVAL_S) if config.snapshot.enabled else 0.0
    return max(RANDOM_MIN_SPAN_S, 2.0 * interval)


def kill_schedule(targets: list[str], points: list[str], kills: int, rng: random.Random) -> list[tuple[str, str]]:
    """(target, moment) per kill: every target in turn (shuffled each cycle), each with the next moment of a
    shuffled cycle of moments, so every pair comes up over a long run."""
    moments = point_schedule(points, kills, rng)
    chosen: list[str] = []
    while len(chosen) < kills:
        cycle = list(targets)
        rng.shuffle(cycle)
        chosen += cycle
    return list(zip(chosen[:kills], moments, strict=True))


def point_schedule(points: list[str], kills: int, rng: random.Random) -> list[str]:
    """Every point once, in a shuffled order, before any repeats; reshuffled each cycle so
    a point is not always killed right after the same one."""
    schedule: list[str] = []
    while len(schedule) < kills:
        cycle = list(points)
        rng.shuffle(cycle)
        if not schedule:
            # The first start is fresh: a point it cannot reach would only burn the phase timeout.
            reachable = [i for i, p in enumerate(cycle) if p not in FRESH_START_SKIPS]
            if reachable:
                first = reachable[0]
                cycle[0], cycle[first] = cycle[first], cycle[0]
        schedule += cycle
    return schedule[:kills]
