"""`turnkeep env try`: play a few episodes of one environment class alone, before any run.

The class is loaded as a run loads it (`envs/loading.py`: the entry, its `Options` checked against `--options`),
the prompts file is read as a run reads it (`controller/state/prompt_files.py`: every record checked, each one
becoming the `Problem` the dataloader builds: `prompt` -> `question`, `answer`, `env`, the other fields ->
`metadata`), and `--episodes` episodes are played: each turn is printed (the prompt, the policy's turn, the
observation), then the reward. The policy is

- `scripted` (the default): the turns of `--turns FILE`, one policy turn per line as the environment receives it
  (without the end-of-turn text; a line that starts with `"` is a JSON string, for a turn of several lines); a
  blank line starts the next episode's turns, and they repeat when the file has fewer than `--episodes`. Without
  a file, the class's `demonstrations()` when it offers them: episode i plays the policy lines of demonstration i,
  which was written for a problem of its own (its prompt is printed), so another prompt may score 0.
- `model`: turns sampled from the model of `--config` / `--set` (the made-up tiny model, made once and cached
  like `turnkeep make-model` does, or `model.path`) with transformers on the CPU, through the model's chat
  template (`envs/codec.py`), at `rollout.temperature` and `rollout.max_tokens_per_turn`; it needs the
  trainer's packages (`pip install 'turnkeep[trainer]'`).

Records whose `env` names another environment than `--name` (default: the class's `kind`) are skipped, as a run
would hand them to that environment. Bad input (an entry that does not load, options the class refuses, a prompts
file with a bad record, an unreadable turns file) is one line and exit 2; an exception the class raises while it
plays is printed with its traceback, exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import orjson

from turnkeep.config.loader import ConfigError
from turnkeep.controller.state.prompt_files import load_prompt_file
from turnkeep.envs.environment import EnvContext, Environment, StepResult
from turnkeep.envs.loading import EnvironmentLoadError, LoadedEnvironment, load_environment
from turnkeep.schemas.config import RolloutConfig
from turnkeep.schemas.rollout import Problem, PromptRecord

PROG = "turnkeep env try"


class EnvTryError(ValueError):
    """Input `turnkeep env try` cannot use; the message is one line with the fix."""


class TurnPolicy(Protocol):
    """Where the policy's turns come from: `begin` an episode, then one turn after each step (None: no more)."""

    def begin(self, episode: int, env: Environment) -> None: ...

    def next_turn(self, previous: StepResult | None) -> str | None: ...


def add_env_parser(sub) -> None:
    env = sub.add_parser("env", help="work on an environment class alone, before any run (env try)")
    commands = env.add_subparsers(dest="env_command", required=True)
    parser = commands.add_parser("try", help="play a few episodes of an environment class and print its rewards",
                                 description=__doc__.split("\n\n")[0])
    parser.add_argument("--entry", required=True, help="package.module:ClassName of an Environment subclass")
    parser.add_argument("--prompts", type=Path, required=True, help="prompts file (.jsonl or .parquet), as data.train")
    parser.add_argument("--options", default="{}", help="the class's options as JSON (checked by its Options)")
    parser.add_argument("--episodes", type=_positive, default=3, help="episodes to play (default 3)")
    parser.add_argument("--policy", choices=("scripted", "model"), default="scripted",
                        help="scripted: --turns or the class's demonstrations; model: sample the run's model")
    parser.add_argument("--turns", type=Path, default=None,
                        help="scripted turns: one per line, a blank line between episodes")
    parser.add_argument("--name", default=None,
                        help="the [environments.<name>] this class would be (default: its kind); records whose "
                             "env names another are skipped")
    parser.add_argument("--max-turns", type=_positive, default=None,
                        help=f"policy turns per episode (default: rollout.max_turns, {RolloutConfig().max_turns})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the demonstrations and of the model's sampling")
    parser.add_argument("--config", type=Path, default=None,
                        help="--policy model: the config whose model samples (default: configs/tiny.toml)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="--policy model: override a config key (model.path=..., rollout.temperature=...)")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: give 1 or more")
    return value


@dataclass(frozen=True)
class Episode:
    number: int
    record: int
    """The record's position in the prompts file (from 1)."""
    problem: Problem


def run_env(args: argparse.Namespace) -> int:
    """`turnkeep env <command>`: only `try` so far."""
    try:
        loaded, episodes, policy, max_turns = _prepare(args)
    except (EnvTryError, EnvironmentLoadError, ConfigError) as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    print(f"{PROG}: {args.entry} ({loaded.cls.kind}, {loaded.cls.recovery_mode}), {len(episodes)} episode(s) of "
          f"{args.prompts}")
    try:
        rewards = asyncio.run(_play_all(loaded, episodes, policy, max_turns))
    except Exception:  # noqa: BLE001 - whatever the user's class raises is shown whole: finding it is the point
        traceback.print_exc()
        print(f"{PROG}: {loaded.cls.__name__} raised while playing (the traceback above)", file=sys.stderr)
        return 1
    print(f"mean reward {sum(rewards) / len(rewards):.4g} over {len(rewards)} episode(s)")
    return 0


def _prepare(args: argparse.Namespace) -> tuple[LoadedEnvironment, list[Episode], TurnPolicy, int]:
    loaded = load_environment(args.entry, _options(args.options), where="--entry")
    episodes = _episodes(args.prompts, args.name or loaded.cls.kind, args.episodes)
    if args.policy == "model":
        if args.turns is not None:
            raise EnvTryError("--turns is for --policy scripted; --policy model samples its turns")
        from turnkeep.cli.env_try_model import model_policy

        policy, config_turns = model_policy(args.config, args.set, args.seed)
        return loaded, episodes, policy, args.max_turns or config_turns
    if args.turns is not None:
        policy = ScriptedPolicy(read_turns_file(args.turns))
    else:
        policy = demonstration_policy(loaded, args.episodes, args.seed)
    return loaded, episodes, policy, args.max_turns or RolloutConfig().max_turns


def _options(text: str) -> dict:
    try:
        options = orjson.loads(text)
    except orjson.JSONDecodeError as err:
        raise EnvTryError(f"--options is not JSON ({err}); give a JSON object, e.g. '{{\"size\": 4}}'") from None
    if not isinstance(options, dict):
        raise EnvTryError(f"--options {text!r}: give a JSON object, e.g. '{{\"size\": 4}}'")
    return options


class _AnyName(frozenset):
    """Every environment name is configured: the records' `env` fields are checked for their type here, and
    matched against `--name` afterwards (a run checks them against its config's [environments])."""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str)


def _episodes(path: Path, name: str, count: int) -> list[Episode]:
    """The first `count` records of the file for environment `name` (from the start again when fewer)."""
    records = load_prompt_file(path, _AnyName())
    mine = [(position, record) for position, record in enumerate(records, start=1) if record.env in (None, name)]
    if not mine:
        others = sorted({record.env for record in records if record.env is not None})
        raise EnvTryError(f"{path}: no record is for environment {name!r} (the records name {', '.join(others)}); "
                          "pass --name with one of them")
    return [Episode(n + 1, *_problem(*mine[n % len(mine)], name)) for n in range(count)]


def _problem(position: int, record: PromptRecord, name: str) -> tuple[int, Problem]:
    """The record as the run's dataloader hands it to an environment (controller/state/dataloader.py)."""
    return position, Problem(question=record.prompt, answer=record.answer, env=record.env or name,
                             metadata=record.metadata)


class ScriptedPolicy:
    """Fixed turns per episode, repeating when there are fewer scripts than episodes."""

    def __init__(self, scripts: list[list[str]], notes: list[str] | None = None) -> None:
        self._scripts = scripts
        self._notes = notes
        self._turns: list[str] = []

    def begin(self, episode: int, env: Environment) -> None:
        index = (episode - 1) % len(self._scripts)
        self._turns = list(self._scripts[index])
        if self._notes is not None:
            print(f"  (turns of {self._notes[index]})")

    def next_turn(self, previous: StepResult | None) -> str | None:
        return self._turns.pop(0) if self._turns else None


def read_turns_file(path: Path) -> list[list[str]]:
    """Each episode's turns: one per line, a blank line between episodes; a line starting with `"` is JSON."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EnvTryError(f"--turns {path}: no such file; write one policy turn per line") from None
    except (OSError, UnicodeDecodeError) as err:
        raise EnvTryError(f"--turns {path}: cannot be read ({err}); give a UTF-8 text file") from None
    scripts: list[list[str]] = [[]]
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            if scripts[-1]:
                scripts.append([])
            continue
        scripts[-1].append(_turn(line, path, number))
    scripts = [script for script in scripts if script]
    if not scripts:
        raise EnvTryError(f"--turns {path}: holds no turn; write one policy turn per line")
    return scripts


def _turn(line: str, path: Path, number: int) -> str:
    if not line.startswith('"'):
        return line
    try:
        turn = json.loads(line)
    except json.JSONDecodeError as err:
        raise EnvTryError(f"--turns {path} line {number}: starts with '\"' but is not a JSON string ({err.msg}); "
                          "write the turn as one JSON string, e.g. \"line one\\nline two\"") from None
    if not isinstance(turn, str):
        raise EnvTryError(f"--turns {path} line {number}: not a JSON string; write the turn as one")
    return turn


def demonstration_policy(loaded: LoadedEnvironment, count: int, seed: int) -> ScriptedPolicy:
    """The policy lines of the class's demonstrations (odd lines of the line protocol: 1, 3, 5, ...)."""
    cls = loaded.cls
    if getattr(cls.demonstrations, "__func__", None) is Environment.demonstrations.__func__:
        raise EnvTryError(f"{cls.__name__} offers no demonstrations; give the policy's turns with --turns FILE "
                          "(one turn per line), or sample them with --policy model")
    demonstrations = cls.demonstrations(random.Random(seed), count, loaded.options)
    lines = [demo.removesuffix("\n").split("\n") for demo in demonstrations]
    scripts = [demo[1::2] for demo in lines]
    if not any(scripts):
        raise EnvTryError(f"{cls.__name__}.demonstrations() gave no policy turn; give --turns FILE instead")
    notes = [f"demonstration {n}, written for the prompt {demo[0]!r}" for n, demo in enumerate(lines, start=1)]
    return ScriptedPolicy(scripts, notes)


async def _play_all(loaded: LoadedEnvironment, episodes: list[Episode], policy: TurnPolicy,
                    max_turns: int) -> list[float]:
    rewards = []
    for episode in episodes:
        print(f"episode {episode.number} (record {episode.record}): question {episode.problem.question!r}, "
              f"answer {episode.problem.answer!r}, env {episode.problem.env!r}")
        env = loaded.cls(episode.problem, EnvContext(options=loaded.options))
        try:
            rewards.append(await _play(env, policy, episode.number, max_turns))
        finally:
            await env.close()
    return rewards


async def _play(env: Environment, policy: TurnPolicy, number: int, max_turns: int) -> float:
    """One episode as the agent loop plays it: prompt, then turn and step until done; the reward."""
    await env.begin()
    print(f"  prompt  {env.prompt()!r}")
    policy.begin(number, env)
    step: StepResult | None = None
    for turn in range(1, max_turns + 1):
        text = policy.next_turn(step)
        if text is None:
            print(f"  no turn {turn}: the policy has no more (the episode is not done)")
            break
        print(f"  policy  {text!r}")
        step = await env.step(text)
        if step.observation is not None:
            print(f"  {step.role:<7} {step.observation!r}")
        if step.done:
            print(f"  done after {turn} turn(s)")
            break
    else:
        print(f"  not done after max turns ({max_turns}): a run ends it as truncated")
    reward = env.reward()
    note = " (group-scored: score_group decides the run's reward)" if env.group_scored else ""
    print(f"  reward {reward}{note}")
    return reward
