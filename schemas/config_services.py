"""The config tables of the run's services: the policy server and the environment server, where Ray places them
(`[placement]`, `[ray]`), and the Temporal server the run talks to (`[temporal]`, with its TLS and API key)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from turnkeep.schemas.config_base import ConfigPath, StrictModel
from turnkeep.schemas.participant import FaultPlan


class PolicyServerConfig(StrictModel):
    host: str = "node"
    """Interface each engine's completions endpoint listens on. `node`: the address Ray knows the engine's node by
    (loopback on the run's own Ray; the node's address on a cluster, so environment servers on other nodes reach
    it); `0.0.0.0` listens everywhere and is advertised as the node's address."""
    port: int = Field(default=0, ge=0, le=65535)
    """Port (0: pick a free one)."""
    kv_cache_memory_bytes: int = Field(default=32 * 1024 * 1024, ge=1024 * 1024)
    """vLLM KV cache size; small models need only a few MiB."""
    max_model_len: int = Field(default=256, ge=32)
    """Longest prompt plus generation the engine accepts."""
    max_num_seqs: int = Field(default=128, ge=1)
    """Sequences vLLM batches together."""
    cpu_threads: int = Field(default=1, ge=1)
    """OpenMP threads for vLLM's CPU backend."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """Weights dtype in the engine (None: model.dtype). A refit casts the trainer's weights to it before sending."""
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    """On a GPU: the share of the device's memory vLLM may take (weights, activations, KV cache). None: size the
    KV cache by kv_cache_memory_bytes instead (the CPU backend always does)."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """GPUs the engine shards the model over (placement.policy_gpus must be at least this)."""
    enforce_eager: bool = True
    """Run the model eagerly; false lets vLLM capture CUDA graphs on a GPU (faster decoding, slower start)."""
    fault_injection: bool = False
    """Serve `/checkpoint/faults` so tests and benchmarks can make checkpoint calls fail or lag."""
    engines: int = Field(default=1, ge=1, le=256)
    """vLLM engines, each its own Ray actor with its own endpoint and Temporal worker (`<run_id>.policy.<k>`), each
    on `tensor_parallel_size` GPUs when placement.policy_gpus asks for GPUs. Agents' turns go to the engine with the
    fewest outstanding calls, sticky per rollout; a dead engine is replaced and its turns go elsewhere."""
    placement: Literal["spread", "pack"] = "spread"
    """Spread the engines over the cluster's nodes (one node going away loses few of them), or pack them onto as
    few nodes as Ray can."""
    no_engine_stop_s: float = Field(default=300.0, gt=0)
    """The run stops, with one line, when no engine has been live for this long (replacements kept failing)."""
    engine_restart_s: float = Field(default=5.0, ge=0)
    """Pause between starting replacements for an engine that keeps dying, so a broken node is not hammered."""
    hang_s: float | None = Field(default=60.0, gt=0)
    """An engine whose engine core generates no token for a one-token probe request within this long, or whose
    process does not answer the probe, is hung (a stuck kernel, a frozen process): its processes are killed by pid
    and it is replaced as a dead one is. Probed every quarter of it (at most every 10 s); a weight load that lasts
    this long counts as a hang too (set it above the longest refit). None: only deaths are noticed."""


class EnvServerConfig(StrictModel):
    host: str = "node"
    """Interface the run's environment server listens on. `node`: the address Ray knows its node by (loopback on
    the run's own Ray and for `turnkeep env-server`); `0.0.0.0` listens everywhere and is advertised as the node's
    address."""
    port: int = Field(default=0, ge=0, le=65535)
    """Port (0: pick a free one)."""
    tool_latency_s: float = Field(default=0.0, ge=0)
    """Added latency of each tool call (to mimic slow tools)."""
    fault_injection: bool = False
    """Serve `/checkpoint/faults` so tests and benchmarks can make checkpoint calls fail or lag."""
    absence_warn_s: float = Field(default=30.0, gt=0)
    """A warning names an environment server that has not answered for this long (its rollouts wait for it)."""
    startup_faults: FaultPlan | None = None
    """A fault plan in force from the start (needs fault_injection), e.g. `{"delay_s": {"prepare": 3}}`: a slow
    participant for `turnkeep bench wasted`."""
    journal_turns: bool = True
    """The run's own environment server journals every committed turn boundary (`<run_dir>/env_journal/`), so a
    restore from a trainer checkpoint without a snapshot still continues the agents that were running."""
    journal_flush_s: float = Field(default=0.05, gt=0)
    """Turn boundaries reach the disk in batches this often (a boundary lost to a crash costs only its turn)."""
    journal_keep_mib: int = Field(default=256, ge=1)
    """The turn journal keeps about this much of its newest segments; older boundaries are pruned."""
    journal_partial_tokens: int = Field(default=32, ge=1)
    """At rollout_recovery.target_level = "token", a turn's tokens are journaled while they stream, in chunks of
    this many tokens ..."""
    journal_partial_s: float = Field(default=0.25, gt=0)
    """... or of what streamed in this long, whichever comes first (a crash costs at most one chunk of a turn)."""
    replay_timeout_s: float = Field(default=60.0, gt=0)
    """A restored agent of a `stateless` or `replay` environment is rebuilt by replaying its journaled turns on a
    fresh instance; a replay that takes longer is given up and its sibling reruns from scratch (named in the log and
    the audit's `replay_checked`)."""
    stream_turns: bool = False
    """Stream every turn from the engine and audit its progress in those chunks, so the chaos figures count the
    tokens of turns a kill cut (measurement; the `token` level streams anyway). Costs a little throughput."""

    @model_validator(mode="after")
    def _faults_need_injection(self) -> "EnvServerConfig":
        if self.startup_faults is not None and not self.fault_injection:
            raise ValueError("env.startup_faults needs env.fault_injection = true")
        return self


class PlacementConfig(StrictModel):
    trainer_gpus: int = Field(default=0, ge=0)
    """GPUs Ray reserves for the trainer (0: it runs on the CPU)."""
    policy_gpus: int = Field(default=0, ge=0)
    """GPUs Ray reserves for each vLLM policy engine (0: vLLM's CPU backend)."""
    share_gpus: bool = False
    """Trainer and policy server share one GPU, half each (fractional GPUs; set policy.gpu_memory_utilization
    below 0.5 so vLLM leaves the trainer room). Needs trainer_gpus = policy_gpus = 1. False: separate GPUs."""

    def gpus_needed(self, engines: int = 1, ranks: int = 1) -> int:
        """GPUs the run reserves: `trainer_gpus` for each of the trainer's `ranks`, and `policy_gpus` for each of
        the `engines` policy engines."""
        if self.share_gpus:
            return max(self.trainer_gpus, self.policy_gpus)
        return self.trainer_gpus * ranks + self.policy_gpus * engines


class RayConfig(StrictModel):
    address: str | None = Field(default=None, min_length=1)
    """Join an existing Ray cluster at this address, with token authentication (None: start a local one in the run
    directory, listening on loopback only)."""
    num_cpus: int | None = Field(default=None, ge=1)
    """CPUs the local Ray reports (None: what the machine has)."""
    token_file: ConfigPath | None = None
    """Ray's authentication token (0600). Local Ray: made there if absent (None: `<run_dir>/ray_token`). Joining a
    cluster (address): the token the cluster was started with; the run refuses to start without it."""
    survive_controller_s: float = Field(default=300.0, ge=0, le=86_400)
    """How long the trainer, the engines and the environment server wait for a new controller after the controller
    process died alone; the same command started within it re-attaches to them instead of starting them again. On
    the run's own Ray its head's keeper watches the controller; on a cluster (`ray.address`) a detached warden actor
    that the controller beats does. 0: they die with the controller."""
    controller_hang_s: float | None = Field(default=120.0, gt=0)
    """On the run's own Ray: a controller whose heartbeat (beaten every second from its event loop) is this old is
    hung; the keeper kills it by pid and from then on it is a dead controller (above). A controller's loop is
    blocked for seconds at most (a longer block is logged). None: only its death is noticed. On a cluster
    (`ray.address`) the warden sees its beats stop and has a task on the controller's node kill it the same way."""


class TemporalSecurity(StrictModel):
    """How a client proves itself to a Temporal server we did not start (every process that connects uses it)."""

    tls: bool = False
    """Connect with TLS (implied by tls_cert or tls_ca; Temporal Cloud with an API key needs only this)."""
    tls_cert: ConfigPath | None = None
    """PEM client certificate for mutual TLS (with tls_key)."""
    tls_key: ConfigPath | None = None
    """PEM private key of tls_cert (keep it 0600)."""
    tls_ca: ConfigPath | None = None
    """PEM certificate of the CA that signed the server's certificate (None: the system's roots)."""
    tls_server_name: str | None = None
    """Name to check the server's certificate against (None: the address's host)."""
    api_key_file: ConfigPath | None = None
    """File holding an API key (Temporal Cloud), sent with every call; TLS is then on."""
    api_key_from_environment: bool = False
    """Set by the run, not by hand: the API key is the one Temporal's own environment configuration gives
    (`TEMPORAL_API_KEY`, or the `temporal.toml` profile), read again by every process that connects, so the key is
    never written into the run directory."""
    profile: str | None = None
    """Set by the run with api_key_from_environment: the `temporal.toml` profile it was read from."""

    @model_validator(mode="after")
    def _cert_with_key(self) -> "TemporalSecurity":
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("temporal.tls_cert and temporal.tls_key go together (a client certificate and its key)")
        return self

    def uses_tls(self) -> bool:
        return (self.tls or self.tls_cert is not None or self.tls_ca is not None or self.api_key_file is not None
                or self.api_key_from_environment)

    def files(self) -> dict[str, Path]:
        named = {"tls_cert": self.tls_cert, "tls_key": self.tls_key, "tls_ca": self.tls_ca,
                 "api_key_file": self.api_key_file}
        return {key: path for key, path in named.items() if path is not None}


class TemporalConfig(TemporalSecurity):
    """The run's Temporal: the embedded dev server, or a server you run (`address`, reached with the inherited
    TLS and API key settings)."""

    address: str | None = Field(default=None, min_length=1)
    """Temporal frontend `host:port` to use. None: Temporal's own environment configuration if it names a server
    (`TEMPORAL_ADDRESS`, `TEMPORAL_NAMESPACE`, `TEMPORAL_API_KEY`, the `TEMPORAL_TLS_*` paths, a `temporal.toml`
    profile chosen by `TEMPORAL_PROFILE`), else `temporal server start-dev` inside the run directory."""
    namespace: str = Field(default="default", min_length=1)
    """Temporal namespace of the run's workflows."""
    port: int = Field(default=7233, ge=0, le=65535)
    """Frontend port of the embedded dev server (0: pick a free one)."""
    ui_port: int = Field(default=8233, ge=0, le=65535)
    """Web UI port of the embedded dev server (0: pick a free one)."""
    ip: str = "127.0.0.1"
    """Interface the embedded dev server and its UI listen on."""
    hang_s: float | None = Field(default=30.0, gt=0)
    """The embedded dev server counts as hung when its health check has not answered for this long (checked every
    quarter of it, at most every 10 s): it is killed by pid and restarted as a dead one is. None: only its death is
    noticed. (A server you run is yours to watch.)"""

    @model_validator(mode="after")
    def _security_needs_an_address(self) -> "TemporalConfig":
        if self.address is None and self.uses_tls():
            raise ValueError("temporal TLS and API key settings apply to a server you run (temporal.address); the "
                             "embedded dev server listens on loopback without them")
        return self

    def security(self) -> TemporalSecurity:
        return TemporalSecurity(**self.model_dump(include=set(TemporalSecurity.model_fields)))
