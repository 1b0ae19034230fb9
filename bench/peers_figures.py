"""The figures of one run of `turnkeep bench peers`, from its step lines (either framework's, as `peers.step_lines`
gives them): wall time from the command to a fixed reward, the reward at a fixed wall time, generated tokens/s,
train steps/min and peak memory."""

from __future__ import annotations

import statistics

WINDOW = 5
"""Steps in the moving mean of the reward (one step's reward over 16 prompts is noisy)."""


def moving_rewards(lines: list[dict]) -> list[float]:
    rewards = [line["reward_mean"] for line in lines]
    return [statistics.fmean(rewards[max(0, i + 1 - WINDOW):i + 1]) for i in range(len(rewards))]


def target_reward(runs: dict[str, list[dict]]) -> float:
    """95% of the lower of the two frameworks' best moving reward: a reward both reach."""
    best = [max(max(moving_rewards(found["lines"])) for found in found_runs) for found_runs in runs.values()]
    return round(0.95 * min(best), 3)


def side_figures(found: dict, target: float) -> dict:
    lines, started = found["lines"], found["started"]
    moving = moving_rewards(lines)
    reached = next((line["t"] - started for line, reward in zip(lines, moving) if reward >= target), None)
    span = lines[-1]["t"] - lines[0]["t"]
    if "tokens" in lines[0]:
        tokens_per_s = sum(line["tokens"] for line in lines[1:]) / span if span else 0.0
    else:
        tokens_per_s = statistics.fmean(line["tokens_per_s"] for line in lines[1:])
    return {"wall_s": round(found["ended"] - started, 1), "first_step_s": round(lines[0]["t"] - started, 1),
            "to_target_s": round(reached, 1) if reached is not None else None,
            "elapsed": [round(line["t"] - started, 1) for line in lines], "moving_reward": [round(r, 3) for r in moving],
            "reward_last5": round(moving[-1], 3), "tokens_per_s": round(tokens_per_s, 1),
            "steps_per_min": round((len(lines) - 1) / span * 60, 2) if span else 0.0,
            "peak_rss_mib": max(line["rss_mib"] for line in lines)}


def reward_at(figures: dict, seconds: float) -> float | None:
    """The moving reward at the last step done `seconds` after the command (None: no step by then)."""
    done = [reward for elapsed, reward in zip(figures["elapsed"], figures["moving_reward"]) if elapsed <= seconds]
    return done[-1] if done else None
