"""Starting one policy engine: its Ray actor (placed on its own GPU bundle, or spread over the nodes), its vLLM
engine and endpoint, its pid file and its stamp; the Temporal worker is started by whoever runs the workflows."""

from __future__ import annotations

import os
from dataclasses import dataclass

import ray

from turnkeep.controller.engines.engine_pool import Engine, EngineState
from turnkeep.gpu_workers.policy_actor import PolicyActor
from turnkeep.primitives.pid_files import write_pid_file
from turnkeep.primitives.token_tally import tally_dir
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.names import engine_name
from turnkeep.workers.ray_cluster.gpu_placement import actor_options


def engine_pid_role(index: int) -> str:
    """Engine 0 keeps the `policy` pid file a one-engine run always had (chaos and tests find it so)."""
    return "policy" if index == 0 else engine_name(index)


@dataclass
class EngineStarter:
    """Everything it takes to start engine k, now or as a replacement later."""

    cfg: TurnkeepConfig
    model_dir: str
    control_token: str
    gpus: object | None
    """The placement group holding the engines' GPU bundles (None: no GPUs)."""
    identity: dict | None
    """The run's stamp: engines are detached actors that outlive the controller."""
    incarnation: int | None = None
    """The run's incarnation: each engine counts its tokens for it (`primitives.token_tally`); None: no count."""

    def create(self, index: int):
        """The actor, not yet started (its process starts and imports vLLM meanwhile)."""
        return create_engine(self.cfg, self.gpus, self.identity, index)

    async def begin(self, index: int, actor, restarts: int = 0) -> Engine:
        """Start the created actor's engine and endpoint; it takes no turns until it is live."""
        policy_cfg = self.cfg.policy.model_copy(update={"dtype": self.cfg.policy.dtype or self.cfg.model.dtype})
        lora = self.cfg.train.lora
        served = lora.model_dump_json() if lora.rank and lora.refit == "adapters" else None
        url = await actor.start.remote(self.model_dir, policy_cfg.model_dump_json(), self.cfg.run.seed,
                                       self.control_token, served)
        write_pid_file(self.cfg.run.run_dir, engine_pid_role(index), await actor.__ray_call__.remote(_pid_of), url=url)
        if self.incarnation is not None:
            await actor.tally_tokens.remote(str(tally_dir(self.cfg.run.run_dir)), self.incarnation)
        if self.identity is not None:
            await actor.stamp.remote({**self.identity, "model_dir": self.model_dir, "url": url, "engine": index})
        return Engine(index, actor, url, state=EngineState.STARTING, restarts=restarts)

    async def spawn(self, index: int, restarts: int) -> Engine:
        """A replacement for engine `index`. The dead one is killed for good first: when its node went away, Ray
        keeps its name taken until it notices the node is gone (seconds to a minute)."""
        _kill_named(engine_name(index))
        return await self.begin(index, self.create(index), restarts)


def create_engine(cfg: TurnkeepConfig, gpus, identity: dict | None, index: int):
    """Engine `index`'s actor, not yet started: a run's start creates every one before its model is there."""
    detached = {"lifetime": "detached"} if identity is not None else {}
    options = actor_options(cfg.placement, gpus, "policy", engine=index, engines=cfg.policy.engines,
                            spread=cfg.policy.placement == "spread", ranks=cfg.train.ranks)
    return PolicyActor.options(name=engine_name(index), num_cpus=0, **detached, **options).remote(index)


def _kill_named(name: str) -> None:
    try:
        ray.kill(ray.get_actor(name), no_restart=True)
    except Exception:  # noqa: BLE001 - no such actor any more, or its node is gone: nothing to free
        pass


def _pid_of(actor) -> int:
    return os.getpid()
