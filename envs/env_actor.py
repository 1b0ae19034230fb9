"""Ray actor that hosts the run's own environment server in its own process."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import ray

from turnkeep.envs.environment import EnvContext
from turnkeep.envs.kinds import EnvironmentFactory
from turnkeep.envs.server import EnvServer
from turnkeep.participants.http_server import ControlAuth
from turnkeep.primitives.audit_log import AUDIT_FILE, AuditLog
from turnkeep.primitives.control_token import token_path
from turnkeep.primitives.run_member import RunMember
from turnkeep.schemas.config import TurnkeepConfig


@ray.remote(num_cpus=0)
class EnvServerActor(RunMember):
    async def start(
        self, model_dir: str, policy_urls: list[str], cfg_json: str, control_token: str | None = None,
        incarnation: int | None = None,
    ) -> str:
        """Start the server; its agents' calls are routed over the policy engines at `policy_urls`;
        `control_token` guards its routes (None: they refuse every call).

        With `incarnation`, turn commits go to the run's audit log under that incarnation.
        """
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        cfg = TurnkeepConfig.model_validate_json(cfg_json)
        self._run_dir = cfg.run.run_dir
        control = ControlAuth(control_token, where=str(token_path(cfg.run.run_dir)))
        audit = None if incarnation is None else AuditLog(cfg.run.run_dir / AUDIT_FILE, incarnation)
        # Workspaces of a previous incarnation's episodes died with it: start from an empty folder.
        workspaces = cfg.run.run_dir / "env_workspaces"
        shutil.rmtree(workspaces, ignore_errors=True)
        factory = EnvironmentFactory.from_specs(cfg.environments, EnvContext(cfg.env.tool_latency_s, workspaces))
        journal = cfg.run.run_dir / "env_journal" / "env" if cfg.env.journal_turns else None
        self._server = EnvServer(factory, cfg.env, control, audit, group_size=cfg.rollout.group_size,
                                 journal_dir=journal)
        url = await self._server.start()
        self._server.attach_local(Path(model_dir), policy_urls, cfg.rollout_limits(), f"local:{incarnation}")
        return url

    async def set_engines(self, urls: list[str]) -> int:
        """The controller's routable policy engines now (after it replaced one); answers how many there are."""
        return self._server.set_engines(urls)

    async def fence(self, incarnation: int) -> dict:
        """A new controller took over: the dead one's agents and unACKed results are dropped (its controller will
        never collect them), the checkpoint it left prepared is aborted, and turn commits go to the audit log under
        the new incarnation."""
        audit = AuditLog(self._run_dir / AUDIT_FILE, incarnation)
        return await self._server.rebind_local(f"local:{incarnation}", audit)

    async def stop(self) -> None:
        await self._server.stop()
