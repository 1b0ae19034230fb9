"""After a controller crash: the trainer, the policy server and the run's environment server
that the dead controller left running in the run's own Ray (`workers.ray_cluster.head`),
re-attached instead of started again.

They are reused only when every one the config needs is there, answers within
`IDENTITY_TIMEOUT_S`, carries this run's id and was started with this very config
(`controller.fingerprint.process_digest`), and the restore will load a trainer checkpoint
into them (a run with none starts afresh, and fresh processes hold the initial weights).
Otherwise whatever is left is stopped, and the run starts its processes anew.

A reused process is fenced before anything else reaches it: the dead controller's
Temporal workers, holds, prepared checkpoint, agents and unACKed results go. What it
held of the run's state is then replaced by the restore, exactly as for new processes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from pathlib import Path

import ray

from turnkeep.controller.engines.engine_pool import Engine, EnginePool
from turnkeep.controller.processes import EnvServerEndpoint, Processes
from turnkeep.envs.kinds import local_environments
from turnkeep.gpu_workers.rank_copies import newest_complete_step
from turnkeep.primitives.control_token import create_control_token
from turnkeep.primitives.token_tally import tally_dir
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.names import engine_name
from turnkeep.workers.local_env_server import LocalEnvServer
from turnkeep.workers.process_watch import dead_reason, death_reason
from turnkeep.workers.ray_cluster.engines import EngineStarter
from turnkeep.workers.ray_cluster.gpu_placement import on_head_node
from turnkeep.workers.ray_cluster.survivors import STOP_TIMEOUT_S, Found, find_survivors, get_gpu_group, stop_survivors
from turnkeep.workers.ray_cluster.trainer_start import create_trainer, setup_trainer
from turnkeep.workers.trainer_rebuilds import TrainerDiedAtStart

log = logging.getLogger("turnkeep.run")

IDENTITY_TIMEOUT_S = 10.0
FENCE_TIMEOUT_S = 120.0
"""The trainer's fence waits out a train step the dead controller left running."""


async def reattach(cfg: TurnkeepConfig, stamp: dict, incarnation: int, restorable: bool) -> Processes | None:
    """What an earlier controller left running, fenced for `incarnation`; or None, and then none of it is left
    running. `restorable`: the restore will load a trainer checkpoint (a resumed run that has one)."""
    found = find_survivors()
    if not found.handles():
        return None
    found, replaced_trainer = await _without_a_dead_trainer(found)
    identities, problem = await _identities(found, cfg, stamp, trainer_needed=not replaced_trainer)
    if problem is None and not restorable and not (replaced_trainer and await _copies_complete(cfg)):
        problem = "the run has no trainer checkpoint yet, so it starts from fresh processes"
    if problem is not None:
        log.warning("not re-attaching the processes an earlier controller left running (%s); stopping them", problem)
        await stop_survivors(found)
        return None
    if replaced_trainer:
        model_dir = next(identity["model_dir"] for identity in identities.values())
        found, identities = await _with_a_new_trainer(found, identities, cfg, stamp, model_dir)
    else:
        await asyncio.wait_for(found.trainer.fence.remote(), FENCE_TIMEOUT_S)
    fenced = await asyncio.gather(*(asyncio.wait_for(actor.fence.remote(), FENCE_TIMEOUT_S)
                                    for actor in found.engines.values()))
    log.info("policy engines fenced: %s", fenced)
    await asyncio.gather(*(actor.tally_tokens.remote(str(tally_dir(cfg.run.run_dir)), incarnation)
                           for actor in found.engines.values()))
    token = create_control_token(cfg.run.run_dir)
    model_dir = Path(identities["trainer"]["model_dir"])
    pool = EnginePool([Engine(k, actor, identities[engine_name(k)]["url"])
                       for k, actor in sorted(found.engines.items())])
    env, env_url, servers = None, None, []
    if found.env is not None:
        log.info("environment server fenced: %s", await asyncio.wait_for(found.env.fence.remote(incarnation),
                                                                        FENCE_TIMEOUT_S))
        env_url = identities["env"]["url"]
        env = LocalEnvServer(cfg, model_dir, pool.routable_urls, token, incarnation, identity=stamp,
                             placement=on_head_node)
        env.adopt(found.env, env_url, found.env_restarts)
        servers.append(EnvServerEndpoint("env", env_url, token, sorted(local_environments(cfg.environments))))
    starter = EngineStarter(cfg, str(model_dir), token, get_gpu_group(), stamp, incarnation)
    return Processes(found.trainer, pool, env, model_dir, env_url, token, servers, reused=True,
                     new_trainer=replaced_trainer, spawn_engine=starter.spawn)


async def _without_a_dead_trainer(found: Found) -> tuple[Found, bool]:
    """`found` without its trainer when the trainer (or one of its ranks, which takes it along) died, and whether
    it did: the rest is then re-attached and a new trainer started beside it (`train.max_rebuilds`)."""
    # A hung trainer is not a dead one: the identity check names it.
    if found.trainer is not None and await dead_reason("trainer", found.trainer, IDENTITY_TIMEOUT_S) is None:
        return found, False
    if not found.engines and found.env is None:
        return found, False
    return replace(found, trainer=None), True


async def _copies_complete(cfg: TurnkeepConfig) -> bool:
    """The dead trainer's ranks left copies of one step for every shard: a new trainer can go on from there even
    before the run's first checkpoint."""
    if not cfg.train.rank_copies:
        return False
    step, _ = await asyncio.to_thread(newest_complete_step, cfg.train.ranks)
    return step is not None


async def _with_a_new_trainer(found: Found, identities: dict, cfg: TurnkeepConfig, stamp: dict,
                              model_dir: str) -> tuple[Found, dict]:
    began = time.monotonic()
    deadline = began + STOP_TIMEOUT_S
    while True:
        try:
            trainer = create_trainer(cfg, get_gpu_group(), stamp)
            break
        except ValueError:  # the dead trainer's name is free once Ray has marked it dead, moments after
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    await setup_trainer(trainer, model_dir, cfg, stamp, get_gpu_group())
    log.info("a new trainer (%d rank(s)) started beside the surviving engines and environment server in %.1fs",
             cfg.train.ranks, time.monotonic() - began)
    if cfg.train.rank_copies:
        loaded = time.monotonic()
        try:
            copies = await trainer.restore_copies.remote()
        except ray.exceptions.RayActorError as err:  # died as it loaded them: another rebuild, as for its setup
            raise TrainerDiedAtStart(death_reason("trainer", err)) from None
        if "step" in copies:
            log.info("the new trainer's %d rank(s) loaded their shards' copies of train step %d in %.1fs",
                     cfg.train.ranks, copies["step"], time.monotonic() - loaded)
        else:
            log.warning("the new trainer starts from a checkpoint, not its ranks' copies: %s", copies["why"])
    return replace(found, trainer=trainer), {**identities, "trainer": {**stamp, "model_dir": model_dir}}


async def _identities(found: Found, cfg: TurnkeepConfig, stamp: dict,
                      trainer_needed: bool = True) -> tuple[dict[str, dict], str | None]:
    wanted = {"trainer": found.trainer} if trainer_needed else {}
    wanted.update({engine_name(k): found.engines.get(k) for k in range(cfg.policy.engines)})
    if local_environments(cfg.environments):
        wanted["env"] = found.env
    missing = sorted(name for name, handle in wanted.items() if handle is None)
    if missing:
        return {}, f"{', '.join(missing)} not running"
    identities = {}
    for name, handle in wanted.items():
        try:
            identity = await asyncio.wait_for(handle.identity.remote(), IDENTITY_TIMEOUT_S)
        except Exception as err:  # noqa: BLE001 - dead, hung or another class: not reusable either way
            return {}, f"{name} does not answer ({type(err).__name__})"
        if not identity or identity.get("run_id") != stamp["run_id"]:
            return {}, f"{name} belongs to another run"
        if identity.get("digest") != stamp["digest"]:
            return {}, f"{name} was started with other settings"
        identities[name] = identity
    return identities, None
