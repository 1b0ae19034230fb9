"""The run's configuration: one pydantic tree loaded from TOML.

Every model forbids unknown keys, so a typo stops the run before anything starts
instead of silently falling back to a default. Every float must be finite (TOML has
`inf` and `nan`; a timeout or a weight of `inf` would otherwise fail much later), and
every value that the run would refuse later is bounded here, so the config is refused
at load, before anything starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from turnkeep.schemas.choices import ADAPTER_KINDS, OPTIONS_KINDS, AgentsMode, Device, EnvironmentKind, RecoveryLevel
from turnkeep.schemas.config_algorithm import AlgorithmConfig
from turnkeep.schemas.config_base import ConfigPath, ModelPath, StrictModel
from turnkeep.schemas.config_eval import EvalConfig
from turnkeep.schemas.config_services import (
    EnvServerConfig,
    PlacementConfig,
    PolicyServerConfig,
    RayConfig,
    TemporalConfig,
)
from turnkeep.schemas.config_train import TrainConfig
from turnkeep.schemas.environments import RolloutLimits, coarser

CALC_OPERATORS = "+-*"
"""Operators the calculator task supports (mirrors envs/calc_task.SUPPORTED_OPERATORS, which imports this module)."""
MAX_SEED = 2**32 - 1
"""Largest run.seed: vLLM seeds numpy with it, which takes 0 .. 2**32 - 1."""


class RunConfig(StrictModel):
    run_dir: ConfigPath = Path("runs/tiny")
    """Directory that receives metrics, checkpoints, logs and Ray's temp files."""
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    """Seed for the dataloader, sampling and the trainer's RNG (0 .. 2**32 - 1)."""
    steps: int | None = Field(default=None, ge=1)
    """Stop after this many train steps (None: run until stopped). `--steps` overrides it."""


class TinyModelConfig(StrictModel):
    hidden_size: int = Field(default=128, ge=32)
    """Width of the made-up Llama model."""
    num_layers: int = Field(default=2, ge=1)
    """Decoder layers."""
    num_heads: int = Field(default=4, ge=1)
    """Attention (query) heads."""
    num_kv_heads: int | None = Field(default=None, ge=1)
    """Key/value heads (grouped-query attention, as Qwen-style models have); None: as many as num_heads."""
    head_dim: int = Field(default=32, ge=32)
    """Per-head width; vLLM's CPU attention needs 32 or more."""
    intermediate_size: int = Field(default=512, ge=32)
    """MLP width."""
    max_position_embeddings: int = Field(default=256, ge=64)
    """Longest sequence the model is made for."""
    warm_start_steps: int = Field(default=800, ge=0)
    """Supervised steps on synthetic transcripts before RL (copying operands needs ~800)."""
    warm_start_batch_size: int = Field(default=32, ge=1)
    """Transcripts per supervised step."""
    warm_start_lr: float = Field(default=3e-3, gt=0)
    """Learning rate of the supervised warm start."""
    warm_start_error_rate: float = Field(default=0.5, ge=0, le=1)
    """Share of warm-start transcripts with a deliberate mistake, so RL starts often wrong."""
    demonstrations: str | None = None
    """An [environments] name of kind "python", or an import path `package.module:ClassName` (for a remote
    environment), whose class offers `demonstrations()`: the tokenizer and the warm start learn from its
    conversations instead of the calculator's (None: the generated calculator transcripts)."""

    @model_validator(mode="after")
    def _heads_fit(self) -> "TinyModelConfig":
        if self.num_heads * self.head_dim != self.hidden_size:
            raise ValueError(
                f"num_heads * head_dim must equal hidden_size "
                f"({self.num_heads} * {self.head_dim} != {self.hidden_size})"
            )
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads must be a multiple of num_kv_heads ({self.num_heads} % {self.num_kv_heads} != 0)")
        return self


class ModelConfig(StrictModel):
    path: ModelPath | None = None
    """A Hugging Face model folder, a hub id `org/name` (fetched once into the Hugging Face cache), a `.gguf` file or
    a packaged model's name ("smollm2-135m-instruct"; `turnkeep model list`; converted once under `cache_dir`), made
    a folder before the run starts. None: make the tiny model."""
    revision: str | None = None
    """With a hub id in `path`: the branch, tag or commit to use (None: the repository's default branch). Ignored
    for a local folder."""
    cache_dir: ConfigPath = Path("~/.cache/turnkeep/models")
    """Where the tiny model is cached (keyed by its settings and seed), and GGUF files' folders (by their sha256)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights dtype in both trainer and policy server."""
    tiny: TinyModelConfig = TinyModelConfig()
    """Shape and warm start of the made-up model (ignored when `path` is set)."""


class TaskConfig(StrictModel):
    name: Literal["calc"] = "calc"
    """The default task: arithmetic where every operation goes through a calculator tool."""
    num_operands: int = Field(default=3, ge=2, le=6)
    """Operands per question; the agent needs num_operands - 1 tool calls, then answers."""
    max_operand: int = Field(default=99, ge=2)
    """Largest operand."""
    operators: str = "+-"
    """Operators questions may use: a non-empty subset of "+-*"."""

    @field_validator("operators")
    @classmethod
    def _supported_operators(cls, operators: str) -> str:
        unsupported = sorted(set(operators) - set(CALC_OPERATORS))
        if unsupported or not operators:
            named = f"{''.join(unsupported)!r} is not supported" if unsupported else "no operator given"
            raise ValueError(f"{named}; use a non-empty subset of {CALC_OPERATORS!r} (e.g. operators = \"+-\")")
        return operators


RESERVED_ENVIRONMENT_NAMES = ("env", "policy", "trainer")
"""Participant names of the run's own processes: a remote environment server is a participant under its name."""


class EnvironmentSpec(StrictModel):
    kind: EnvironmentKind = EnvironmentKind.CALC
    """calc: the stateless calculator task; workspace: a calculator that keeps a tape file in a workspace folder
    (its state is exported and restored); lab: a calculator in a live subprocess whose state cannot be saved
    (restart_only); judge: the calculator scored by a pairwise judge over all siblings of a group (group-scored);
    tool_chat: a task in the model's own tool format (`<tool_call>` JSON through its chat template), from
    reasoning-gym (`options.reasoning_gym`) or the prompts file, scored by a verifier (state exported); python: your
    own environment class, loaded by `entry` in the run's environment server; remote: an environment server you run
    yourself (`turnkeep env-server`), reached at `url`; verifiers, nemo_gym, openenv: an environment written for that
    ecosystem, through its adapter (docs/environments.md)."""
    weight: float = Field(default=1.0, gt=0)
    """Share of prompt groups that go to this environment (relative to the other environments' weights)."""
    group_size: int | None = Field(default=None, ge=2)
    """Group-scored environments only: how many siblings it scores together (None: rollout.group_size; any other
    value is refused)."""
    entry: str | None = None
    """python only: `package.module:ClassName` of a `turnkeep.Environment` subclass, importable where the
    environment server runs."""
    options: dict[str, Any] = {}
    """python, tool_chat and the ecosystems' adapters (verifiers, nemo_gym, openenv): keyword options handed to the
    class (checked by its `Options` model at start-up)."""
    url: str | None = None
    """remote only: `http://host:port` of a `turnkeep env-server`."""
    token_file: ConfigPath | None = None
    """remote only: file holding the bearer token the server was started with (`--token-file`); keep it 0600."""

    @model_validator(mode="after")
    def _fields_fit_kind(self) -> "EnvironmentSpec":
        if self.group_size is not None and self.kind not in (EnvironmentKind.JUDGE, EnvironmentKind.PYTHON,
                                                             EnvironmentKind.REMOTE):
            raise ValueError(f"group_size applies to group-scored environments (kind = \"judge\", or your own), "
                             f"not '{self.kind}'")
        if self.kind == EnvironmentKind.PYTHON and not self.entry:
            raise ValueError('kind = "python" needs entry = "package.module:ClassName"')
        if self.kind != EnvironmentKind.PYTHON and self.entry is not None:
            raise ValueError(f"entry applies to kind = \"python\", not '{self.kind}'")
        if self.kind not in OPTIONS_KINDS and self.options:
            raise ValueError(f"options apply to kinds {', '.join(sorted(OPTIONS_KINDS))}, not '{self.kind}'")
        if self.kind == EnvironmentKind.REMOTE and (not self.url or self.token_file is None):
            raise ValueError('kind = "remote" needs url = "http://host:port" and token_file = "<the token the '
                             'server was started with>"')
        if self.kind != EnvironmentKind.REMOTE and (self.url is not None or self.token_file is not None):
            raise ValueError(f"url and token_file apply to kind = \"remote\", not '{self.kind}'")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url = {self.url!r}: use http://host:port")
        return self


class DataConfig(StrictModel):
    train: ConfigPath | None = None
    """Prompts file (`.jsonl`, or `.parquet`), one record per prompt: `prompt` (text), optional `answer`, optional
    `env` (an [environments] name), any other fields go to the environment as `problem.metadata`. Relative paths
    are relative to the working directory. None: generated calculator problems ([task])."""
    shuffle: bool = True
    """Shuffle the prompts each epoch by run.seed (the order is reproducible and survives restores)."""


class RolloutRecoveryConfig(StrictModel):
    target_level: RecoveryLevel = RecoveryLevel.TURN
    """What a restore (and a live failure) keeps: token = as turn, and a turn cut mid-generation goes on from its
    journaled tokens (needs env.journal_turns); turn = sealed siblings and every saved turn; sibling = sealed
    siblings, unfinished ones rerun from scratch; prompt_group = nothing of an unfinished group, it reruns whole.
    Each environment gets the finest level at or below this that it supports (a warning names each lowered one)."""
    overrides: dict[str, RecoveryLevel] = {}
    """Environment name -> a coarser level for that environment only. Naming an environment that is not in
    [environments], or a level finer than target_level, is refused at start-up."""
    keep_after_cut: bool = True
    """A restore reads the controller's journal on past its cut, to the last whole record: rows sealed, groups
    admitted and agents' turns committed after the cut are kept (whichever policy version made them), and the
    trainer steps after the cut, lost with the trainer, train the same groups again, first and in their order.
    false: restore exactly the cut (a snapshot with parked agents always does)."""


class RolloutConfig(StrictModel):
    group_size: int = Field(default=8, ge=2)
    """Siblings per prompt group (GRPO's N)."""
    max_turns: int = Field(default=6, ge=1)
    """Policy turns per rollout before it is ended as too long."""
    max_tokens_per_turn: int = Field(default=16, ge=1)
    """Tokens the policy may generate in one turn."""
    temperature: float = Field(default=1.0, gt=0)
    """Sampling temperature (1.0 keeps generation logprobs on-policy)."""
    rollout_timeout_s: float = Field(default=120.0, gt=0)
    """Wall-clock budget of one rollout attempt; the clock pauses while its deadline registry is held."""
    max_attempts: int = Field(default=3, ge=1)
    """Attempts per sibling (a failure or timeout retries it); after that it is dropped with a reason."""
    max_inflight_groups: int | None = Field(default=None, ge=1)
    """Groups admitted and not yet trained (None: prompts_per_step * (max_staleness + 1))."""


class SnapshotConfig(StrictModel):
    enabled: bool = True
    """Take rollout snapshots (needs Temporal); off runs the bare training loop."""
    attempt_interval_s: float | None = Field(default=None, gt=0)
    """Seconds between periodic snapshot attempts; every trainer checkpoint is a snapshot besides. Unset: 20 s when
    the agents are parked, none when they are journaled (the journals keep everything after the newest snapshot, so
    a periodic attempt would only add a trainer checkpoint each time; `controller/snapshot/periodic_attempts.py`)."""
    prepare_timeout_s: float = Field(default=60.0, gt=0)
    """How long participants may take to park and drain before the attempt fails."""
    phase_timeout_s: float = Field(default=60.0, gt=0)
    """Start-to-close timeout of every other attempt phase (commit, cut, publish, resume)."""
    lease_s: float = Field(default=30.0, gt=0, le=3600)
    """Lease of every hold an attempt takes; a dead coordinator's holds expire after this (at most an hour:
    the participants grant no longer)."""
    max_consecutive_failures: int = Field(default=3, ge=1)
    """Failed attempts in a row that stop the run."""
    keep_latest_k: int = Field(default=2, ge=1)
    """Published snapshots kept per trainer checkpoint."""
    trainer_hold: bool = True
    """Hold the optimizer step from before the Gym phase until the cut (off: the peer's behaviour, for benchmarks)."""
    agents: AgentsMode = AgentsMode.AUTO
    """Where a snapshot keeps its running agents. `journal`: nothing stops; the snapshot records the
    environment servers' turn journal positions and a restore continues each running agent from its newest
    journaled boundary (needs `env.journal_turns`, and `--journal-dir` on a remote env-server). `parked`:
    admission closes, every agent parks at its next turn boundary and the environment servers save them.
    `auto`: `journal` when every environment server journals its turns, else `parked` with one warning."""
    checkpoint_on_demand: bool = True
    """A periodic or operator attempt with no trainer checkpoint at the current step asks for one (written between
    steps) instead of being skipped; turn off for models whose checkpoints are expensive (then save_period rules)."""
    preemption_grace_s: float = Field(default=60.0, gt=0)
    """On SIGTERM (a scheduler's preemption) the run takes one final snapshot within this many seconds, then exits 0;
    set it below the scheduler's kill grace period. With snapshots off it writes a trainer checkpoint instead."""


class MetricsConfig(StrictModel):
    tensorboard: bool = False
    """Also write metrics.jsonl's numbers as TensorBoard event files in `<run_dir>/tensorboard/` (snapshot outcomes and
    restores as text): `tensorboard --logdir <run_dir>/tensorboard`."""
    wandb: bool = False
    """Also send metrics.jsonl's numbers to Weights & Biases (needs `pip install 'turnkeep[wandb]'`): one W&B run per
    turnkeep run, named by its run id, its files in `<run_dir>/wandb/`."""
    wandb_project: str = Field(default="turnkeep", min_length=1)
    """The W&B project."""
    wandb_entity: str | None = None
    """The W&B team or user (None: your default entity)."""
    wandb_mode: Literal["auto", "online", "offline"] = "auto"
    """`auto`: online when this machine has W&B credentials (`WANDB_API_KEY`, or `wandb login`), else offline (upload
    later with `wandb sync <run_dir>/wandb/offline-run-*`)."""


class WatchdogConfig(StrictModel):
    stall_s: float = Field(default=600.0, gt=0)
    """Warn when no train step finished and no turn was committed for this long, snapshot pauses not counted
    (a pause stops the clock, as it stops rollout deadlines); set it above the slowest train step."""
    check_every_s: float = Field(default=10.0, gt=0)
    """How often the watchdog looks (it asks the environment servers for their turn counters)."""


class TurnkeepConfig(StrictModel):
    run: RunConfig = RunConfig()
    """Where the run lives and how long it goes."""
    model: ModelConfig = ModelConfig()
    """Which policy model to train."""
    task: TaskConfig = TaskConfig()
    """The generated calculator problems (used when data.train is not set)."""
    data: DataConfig = DataConfig()
    """Prompts from a file instead of generated problems."""
    environments: dict[str, EnvironmentSpec] = {"calc": EnvironmentSpec()}
    """The environments prompt groups are spread over, by name (`[environments.<name>]`); a run can mix kinds.
    At least one (leave the table out for the default calculator)."""
    rollout: RolloutConfig = RolloutConfig()
    """How rollouts are generated and retried."""
    rollout_recovery: RolloutRecoveryConfig = RolloutRecoveryConfig()
    """How much of an unfinished group a restore or a live failure keeps."""
    train: TrainConfig = TrainConfig()
    """GRPO and the trainer."""
    policy: PolicyServerConfig = PolicyServerConfig()
    """The vLLM policy server."""
    env: EnvServerConfig = EnvServerConfig()
    """The environment server."""
    placement: PlacementConfig = PlacementConfig()
    """GPUs for the trainer and the policy server (environment servers always run on CPUs)."""
    ray: RayConfig = RayConfig()
    """The Ray cluster the processes are placed on."""
    temporal: TemporalConfig = TemporalConfig()
    """Where snapshot workflows run."""
    snapshot: SnapshotConfig = SnapshotConfig()
    """Rollout snapshots."""
    watchdog: WatchdogConfig = WatchdogConfig()
    """The stall warning."""
    metrics: MetricsConfig = MetricsConfig()
    """Where metrics go besides metrics.jsonl."""
    eval: EvalConfig = EvalConfig()
    """Held-out evaluation during the run."""
    algorithm: AlgorithmConfig = AlgorithmConfig()
    """The advantage estimator and the policy loss."""

    @field_validator("environments")
    @classmethod
    def _some_environment(cls, environments: dict[str, EnvironmentSpec]) -> dict[str, EnvironmentSpec]:
        if not environments:
            raise ValueError('at least one environment is needed: declare one as a table, e.g. [environments.calc] '
                             'with kind = "calc", or remove the empty [environments] table for the default calculator')
        return environments

    @model_validator(mode="after")
    def _inflight_fits_a_step(self) -> "TurnkeepConfig":
        limit, step = self.rollout.max_inflight_groups, self.train.prompts_per_step
        if limit is not None and limit < step:
            raise ValueError(f"rollout.max_inflight_groups = {limit} is below train.prompts_per_step = {step}: a step "
                             f"would never get its groups; raise it to at least {step}, or leave it out")
        return self

    @model_validator(mode="after")
    def _journal_snapshots_have_journals(self) -> "TurnkeepConfig":
        if self.snapshot.agents == AgentsMode.JOURNAL and not self.env.journal_turns:
            raise ValueError('snapshot.agents = "journal" keeps the running agents in the environment servers\' turn '
                             'journals, but env.journal_turns = false; turn it on, or set snapshot.agents = "parked"')
        return self

    @model_validator(mode="after")
    def _eval_has_prompts(self) -> "TurnkeepConfig":
        heldout = any(spec.kind == EnvironmentKind.TOOL_CHAT and spec.options.get("reasoning_gym") is not None
                      or spec.kind in ADAPTER_KINDS for spec in self.environments.values())
        if (self.eval.every_steps or self.eval.before_training) and self.eval.prompts is None and not heldout:
            raise ValueError("[eval] has no held-out prompts: set eval.prompts = \"FILE.jsonl\", or use a tool_chat "
                             "environment with reasoning_gym tasks (their held-out seeds) or an adapted one, or set "
                             "eval.every_steps = 0")
        return self

    @model_validator(mode="after")
    def _environment_names(self) -> "TurnkeepConfig":
        for name, spec in self.environments.items():
            if spec.kind == EnvironmentKind.REMOTE and name in RESERVED_ENVIRONMENT_NAMES:
                raise ValueError(f"[environments.{name}]: a remote environment may not be called {name!r} (the run's "
                                 f"own processes use {list(RESERVED_ENVIRONMENT_NAMES)}); rename it")
            if not name.replace("_", "").replace("-", "").isalnum():
                raise ValueError(f"[environments.{name}]: use letters, digits, '-' and '_' in environment names")
        return self

    @model_validator(mode="after")
    def _gpus_fit(self) -> "TurnkeepConfig":
        placement = self.placement
        if self.train.device == Device.CUDA and placement.trainer_gpus == 0:
            raise ValueError('train.device = "cuda" needs placement.trainer_gpus >= 1 (Ray hides GPUs from an actor '
                             'that reserved none); set placement.trainer_gpus or train.device = "auto"')
        if self.train.ranks > 1 and placement.share_gpus:
            raise ValueError(f"train.ranks = {self.train.ranks} with placement.share_gpus = true: one GPU shared by "
                             "the trainer and the policy engine has no room for more ranks; give each its own GPUs "
                             "(share_gpus = false) or train with one rank")
        if placement.policy_gpus and self.policy.tensor_parallel_size > placement.policy_gpus:
            raise ValueError(f"policy.tensor_parallel_size = {self.policy.tensor_parallel_size} needs as many GPUs, "
                             f"but placement.policy_gpus = {placement.policy_gpus}; raise policy_gpus or lower it")
        if self.policy.port and self.policy.engines > 1:
            raise ValueError(f"policy.port = {self.policy.port} with policy.engines = {self.policy.engines}: engines "
                             "on one node cannot share a port; set policy.port = 0 (each picks a free one)")
        if placement.share_gpus and self.policy.engines > 1:
            raise ValueError(f"placement.share_gpus = true puts the trainer and one policy engine on one GPU, but "
                             f"policy.engines = {self.policy.engines}; give each engine its own GPUs "
                             "(share_gpus = false) or run one engine")
        if placement.share_gpus and (placement.trainer_gpus, placement.policy_gpus) != (1, 1):
            raise ValueError("placement.share_gpus = true puts the trainer and the policy server on one GPU, half "
                             "each: set placement.trainer_gpus = 1 and placement.policy_gpus = 1, or turn it off")
        return self

    def algorithm_settings(self) -> AlgorithmConfig:
        """`[algorithm]` with its defaults filled from [train] and [rollout] (what the trainer runs)."""
        return self.algorithm.resolved(self.train.clip_eps, self.rollout.max_turns * self.rollout.max_tokens_per_turn)

    def inflight_group_limit(self) -> int:
        if self.rollout.max_inflight_groups is not None:
            return self.rollout.max_inflight_groups
        return self.train.prompts_per_step * (self.train.max_staleness + 1)

    def rollout_limits(self) -> RolloutLimits:
        """One agent's limits as the environment servers apply them; partial turns are journaled only where a
        restore may continue them (target_level = "token")."""
        recovery = self.rollout_recovery
        tokens = [name for name in self.environments if coarser(
            recovery.target_level, recovery.overrides.get(name, recovery.target_level)) == RecoveryLevel.TOKEN]
        return RolloutLimits(max_turns=self.rollout.max_turns, max_tokens_per_turn=self.rollout.max_tokens_per_turn,
                             max_model_len=self.policy.max_model_len, temperature=self.rollout.temperature,
                             stream_turns=self.env.stream_turns, partial_turn_environments=tokens,
                             partial_every_tokens=self.env.journal_partial_tokens,
                             partial_every_s=self.env.journal_partial_s, replay_timeout_s=self.env.replay_timeout_s)
