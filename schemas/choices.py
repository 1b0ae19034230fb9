"""Every choice the run makes among a few named values, spelled once.

The config, the workflows, the metrics and `turnkeep status` all compare against these
members; their values are what TOML, metrics.jsonl, the audit log and recorded workflow
histories hold (a `StrEnum` member equals its string, so files written before still read).
"""

from __future__ import annotations

from enum import StrEnum


class AgentsMode(StrEnum):
    """`snapshot.agents`: how a snapshot keeps the agents that are running."""

    AUTO = "auto"
    """journal when every environment server keeps a turn journal, else parked."""
    PARKED = "parked"
    """Admission closes and agents park at their next turn boundary; their state is saved in the snapshot."""
    JOURNAL = "journal"
    """Nothing stops: the environment servers' turn journals hold the agents, a snapshot records their positions."""


class AgentsFrom(StrEnum):
    """Where a restore's running agents came from."""

    SNAPSHOT = "snapshot"
    JOURNAL = "journal"


class RecoveryLevel(StrEnum):
    """How much of an unfinished group a restore (and a live failure) keeps, finest first."""

    TOKEN = "token"
    """As `turn`, and a turn cut mid-generation goes on from its journaled partial tokens."""
    TURN = "turn"
    """Sealed siblings, and unfinished ones resume from their saved turn."""
    SIBLING = "sibling"
    """Sealed siblings; unfinished ones rerun from scratch."""
    PROMPT_GROUP = "prompt_group"
    """Nothing of an unfinished group: it reruns whole."""


class RecoveryMode(StrEnum):
    """How an environment's episode comes back after a restore."""

    STATELESS = "stateless"
    """Replaying the saved policy turns rebuilds it (its steps are a pure function of the turns)."""
    REPLAY = "replay"
    """Deterministic given the rollout's seed and its actions: a fresh instance made with the seed replays the
    journaled turns, each observation checked against the journaled one (a difference reruns the sibling)."""
    EXPORTED = "exported"
    """It exports and restores its own state."""
    RESTART_ONLY = "restart_only"
    """Its state cannot be saved: an episode can only start over."""


class EnvironmentKind(StrEnum):
    """`[environments.<name>] kind`."""

    CALC = "calc"
    WORKSPACE = "workspace"
    LAB = "lab"
    JUDGE = "judge"
    TOOL_CHAT = "tool_chat"
    """A task in the model's own tool format (`<tool_call>` JSON), reasoning-gym's or your prompts file's."""
    VERIFIERS = "verifiers"
    """An installed verifiers environment (`options.env_id`), through its dataset, tools and rubric."""
    NEMO_GYM = "nemo_gym"
    """A NeMo Gym resources server (started from its config, or at `options.url`), through its own routes."""
    OPENENV = "openenv"
    """An OpenEnv environment (started from its package, or at `options.url`): reset, step, its reward."""
    PYTHON = "python"
    """Your own environment class, loaded by `entry` in the run's environment server."""
    REMOTE = "remote"
    """An environment server you run yourself (`turnkeep env-server`)."""


ADAPTER_KINDS = frozenset({EnvironmentKind.VERIFIERS, EnvironmentKind.NEMO_GYM, EnvironmentKind.OPENENV})
"""Environments written for another ecosystem, run through turnkeep's adapter for it (`envs/adapters/`)."""
OPTIONS_KINDS = frozenset({EnvironmentKind.PYTHON, EnvironmentKind.TOOL_CHAT, *ADAPTER_KINDS})
"""The kinds whose `[environments.<name>] options` go to their class's `Options`."""


class Trigger(StrEnum):
    """What started a snapshot attempt."""

    PERIODIC = "periodic"
    TRAINER_CHECKPOINT = "trainer_checkpoint"
    OPERATOR = "operator"
    PREEMPTION = "preemption"


class Outcome(StrEnum):
    """How a snapshot attempt ended."""

    PUBLISHED = "published"
    PUBLISHED_RELEASE_PENDING = "published_release_pending"
    SKIPPED = "skipped"
    FAILED = "failed"
    ABORTED = "aborted"

    def counts_as_failure(self) -> bool:
        return self is Outcome.FAILED

    def published(self) -> bool:
        """The snapshot is on disk and valid (its release may still be pending)."""
        return self in (Outcome.PUBLISHED, Outcome.PUBLISHED_RELEASE_PENDING)


class CutKind(StrEnum):
    """What a consistent cut of the controller's state was taken for."""

    SNAPSHOT = "snapshot"
    TRAINER_CHECKPOINT = "trainer_checkpoint"


class HoldChange(StrEnum):
    """What happened to a holder of a hold set (the audit log's `hold_changed`)."""

    TAKEN = "taken"
    RENEWED = "renewed"
    RELEASED = "released"


class Device(StrEnum):
    """`train.device`."""

    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


class MetricsKind(StrEnum):
    """The `kind` of a line of metrics.jsonl."""

    TRAIN_STEP = "train_step"
    SNAPSHOT = "snapshot"
    """One snapshot attempt's result."""
    RECOVERY = "recovery"
    """A restart's restore."""
    MEMORY = "memory"
    """Peak memory per process role."""
    ENV_RESTART = "env_restart"
    """The run started its own environment server again."""
    ENGINE_RESTART = "engine_restart"
    """A policy engine died and the run started a replacement (or an operator scaled the engines)."""
    TEMPORAL_RESTART = "temporal_restart"
    """The run started its embedded Temporal server again."""
    TRAINER_REBUILD = "trainer_rebuild"
    """The trainer (or one of its ranks) died and the run rebuilds the group and restores into it."""
    LOCAL_ACTIVITY = "local_activity"
    """One local activity's own clocks (`turnkeep bench orchestration`)."""
    STARTUP = "startup"
    """Where an incarnation's start went: seconds from its process's start to each piece being up."""
    EVAL = "eval"
    """One held-out evaluation's result (`controller/pumps/eval_pump.py`)."""
    HANG = "hang"
    """A process that stopped answering its liveness probe, killed by pid and repaired as a dead one is."""
