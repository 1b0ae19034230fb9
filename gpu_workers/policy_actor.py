"""The policy server as a Ray actor, so Ray can place it and move weights to it.

An async actor: every method runs on the actor's one event loop, which is also
where the PolicyServer's HTTP endpoint and gate live, so no locking is needed.
vLLM spawns its engine processes from inside the actor; they import
`gpu_workers.*` by package path, which works because the project is installed.
The config travels as JSON so the actor needs no pickled pydantic objects.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import ray

from turnkeep.primitives.run_member import RunMember
from turnkeep.schemas.config_services import PolicyServerConfig
from turnkeep.schemas.config_train import LoraConfig


@ray.remote
class PolicyActor(RunMember):
    """Owns one PolicyServer (vLLM engine + completions endpoint): engine `engine` of the run."""

    def __init__(self, engine: int = 0) -> None:
        from turnkeep.gpu_workers import engine_forkserver

        forkserver = engine_forkserver.wanted()
        if forkserver:
            engine_forkserver.start()  # imports vLLM's engine core beside this process's own import of vLLM
        # Imported in the actor's process only: the controller holds this class (to start the actor, or a handle
        # to re-attach to it) without importing vLLM, which takes seconds.
        from turnkeep.gpu_workers.policy_server import PolicyServer

        if forkserver:
            engine_forkserver.use_for_engines()

        self._engine = engine
        self._server = PolicyServer(engine)
        self._worker = None

    async def start(self, model_dir: str, cfg_json: str, seed: int = 0, control_token: str | None = None,
                    lora_json: str | None = None) -> str:
        """Start engine and endpoint; return the base URL agents call.

        `control_token` guards the checkpoint routes (None: they refuse every call); `lora_json`: `[train.lora]`
        when the policy is served as LoRA adapters (refits carry them alone).
        """
        cfg = PolicyServerConfig.model_validate_json(cfg_json)
        lora = LoraConfig.model_validate_json(lora_json) if lora_json else None
        return await self._server.start(model_dir, cfg, seed=seed, control_token=control_token, lora=lora)

    async def load_weights(self, blob: bytes, version: int) -> dict[str, float]:
        """Load safetensors bytes as `version`; the seconds admission was closed, the bytes loaded, and this engine's
        tokens generated so far (the run's per-engine tokens/s, at no extra call)."""
        closed_s = await self._server.load_weights(blob, version)
        return {"admission_closed_s": closed_s, "bytes": len(blob), "engine": self._engine,
                "tokens_generated": self._server.tokens_generated}

    async def health(self) -> dict[str, Any]:
        return self._server.health()

    async def liveness(self, timeout_s: float) -> float | None:
        """The engine core's answer time to a one-token probe (`PolicyServer.engine_answers`)."""
        return await self._server.engine_answers(timeout_s)

    async def tally_tokens(self, folder: str, incarnation: int) -> str:
        """Count every token the engine generates into a file of `folder` for this run incarnation from now on
        (`gpu_workers.token_tally`); returns its path."""
        return self._server.tally_tokens(Path(folder), incarnation)

    async def kill_engine_processes(self) -> int:
        """SIGKILL every process this actor started (vLLM's engine core and its fork server): a hung engine core
        cannot be stopped by asking it. Returns how many were killed."""
        from turnkeep.primitives.process_tree import kill_children  # late: only a hang needs it

        return kill_children(os.getpid())

    async def close_admission(self, holder: str, lease_s: float | None = None) -> bool:
        return self._server.close_admission(holder, lease_s=lease_s)

    async def open_admission(self, holder: str) -> bool:
        return self._server.open_admission(holder)

    async def admission_leases(self) -> list[tuple[str, float | None]]:
        """Every admission holder with its remaining lease (for the controller's audit log)."""
        return [(h.name, h.lease_remaining_s) for h in self._server.gate.holds.snapshot()]

    async def drain(self, timeout_s: float | None = None) -> int:
        return await self._server.drain(timeout_s)

    async def start_temporal_worker(
        self, address: str, namespace: str, run_id: str, incarnation: int = 1, security=None
    ) -> None:
        """The engine's own worker on `<run_id>.policy.<k>`: its fence, drain, resume and weight loads."""
        from turnkeep.activities.policy_activities import PolicyActivities
        from turnkeep.primitives.temporal_client import connect, start_worker, step_activities
        from turnkeep.schemas.names import policy_queue
        from turnkeep.schemas.steps import Runs

        client = await connect(address, namespace, security)
        trainer = ray.get_actor("trainer")

        async def trainer_weights() -> bytes:
            [shared] = await trainer.shared_weights.remote()  # one object for every engine of a restore
            return await shared

        acts = PolicyActivities(self._server, self._server.faults, incarnation, trainer_weights)
        self._worker, _task = start_worker(
            client, policy_queue(run_id, self._engine),
            activities=step_activities(acts, runs=[Runs.POLICY]),
        )

    async def stop_temporal_worker(self) -> None:
        if self._worker is not None:
            await self._worker.shutdown()
            self._worker = None

    async def fence(self) -> dict[str, Any]:
        """A new controller took over: the dead one's Temporal worker goes, the checkpoint it left prepared is
        aborted and its admission holds are released (the restore closes admission again under its own)."""
        await self.stop_temporal_worker()
        self._server.expect_restore()
        abandoned = self._server.participant.abandon()
        holders = sorted(self._server.gate.holders())
        for holder in holders:
            self._server.open_admission(holder)
        return {"aborted_checkpoint": abandoned, "released_holders": holders}

    async def stop(self) -> None:
        await self.stop_temporal_worker()
        await self._server.stop()
