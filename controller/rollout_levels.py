"""One recovery target level, lowered per environment from what it reports.

`rollout_recovery.target_level` says how much of an unfinished group a restore keeps;
`rollout_recovery.overrides` may only force a coarser level for a named environment.
Each environment then gets the finest level at or below that which its recovery mode
supports (a restart_only environment cannot continue a saved turn), with one warning per
lowered environment. Settings that cannot be honoured are refused before anything
starts, naming both settings and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from turnkeep.config.loader import ConfigError
from turnkeep.schemas.choices import RecoveryLevel, RecoveryMode
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.environments import FINEST_LEVEL, EnvironmentCapabilities, coarser
from turnkeep.schemas.participant import Capabilities

_WHY_LOWERED = {
    RecoveryMode.RESTART_ONLY: "its state cannot be saved, so a saved turn cannot be continued; unfinished siblings rerun "
                    "from scratch",
}


class RolloutLevelError(ConfigError):
    """A recovery setting that cannot be honoured; the message names both settings and the fix."""


@dataclass(frozen=True)
class RolloutLevelPlan:
    name: str
    kind: str
    recovery_mode: RecoveryMode
    level: RecoveryLevel
    group_scored: bool = False

    @property
    def continues_saved_turns(self) -> bool:
        return self.level in (RecoveryLevel.TOKEN, RecoveryLevel.TURN)

    @property
    def continues_partial_turns(self) -> bool:
        return self.level == RecoveryLevel.TOKEN

    @property
    def keeps_sealed_siblings(self) -> bool:
        return self.level != RecoveryLevel.PROMPT_GROUP

    @property
    def retries_whole_group(self) -> bool:
        """A live failure of one sibling reruns the whole group (its reward needs every sibling, or the level says so)."""
        return self.group_scored or self.level == RecoveryLevel.PROMPT_GROUP


def check_rollout_levels(cfg: TurnkeepConfig) -> None:
    """The checks the config alone decides; run before anything starts or is written."""
    target = cfg.rollout_recovery.target_level
    for name, level in sorted(cfg.rollout_recovery.overrides.items()):
        if name not in cfg.environments:
            raise RolloutLevelError(
                f"rollout_recovery.overrides names environment {name!r}, but [environments] configures only "
                f"{sorted(cfg.environments)}; fix the name or add [environments.{name}]"
            )
        if coarser(level, target) != level:
            raise RolloutLevelError(
                f"rollout_recovery.overrides.{name} = '{level}' is finer than rollout_recovery.target_level = "
                f"'{target}'; an override only forces a coarser level: remove it, or lower target_level and "
                "override the other environments instead"
            )
    wants_turns = [name for name in cfg.environments
                   if _configured_level(cfg, name) in (RecoveryLevel.TOKEN, RecoveryLevel.TURN)]
    # A restore continues turns from a parked snapshot or from the environment servers' turn journals (which
    # every trainer checkpoint restore reads); with neither there is nothing to continue.
    if wants_turns and not cfg.snapshot.enabled and not cfg.env.journal_turns:
        raise RolloutLevelError(
            f"rollout_recovery.target_level = '{target}' (environments {wants_turns}) continues turns saved by "
            "snapshots or turn journals, but snapshot.enabled = false and env.journal_turns = false keep none; set "
            "env.journal_turns = true (or snapshot.enabled = true), or rollout_recovery.target_level = 'sibling' "
            "(trainer checkpoints keep sealed siblings)"
        )
    wants_tokens = [name for name in cfg.environments if _configured_level(cfg, name) == RecoveryLevel.TOKEN]
    if wants_tokens and not cfg.env.journal_turns:
        raise RolloutLevelError(
            f"rollout_recovery.target_level = 'token' (environments {wants_tokens}) continues turns from the tokens "
            "the turn journals keep while they stream, but env.journal_turns = false keeps none; set "
            "env.journal_turns = true, or rollout_recovery.target_level = 'turn'"
        )
    for name, spec in sorted(cfg.environments.items()):
        if spec.group_size is not None and spec.group_size != cfg.rollout.group_size:
            raise _group_size_mismatch(name, spec.group_size, cfg.rollout.group_size)


def plan_levels(
    cfg: TurnkeepConfig, reported: list[EnvironmentCapabilities]
) -> tuple[dict[str, RolloutLevelPlan], list[str]]:
    """Each configured environment's level from its server's report; returns (plans, warnings)."""
    check_rollout_levels(cfg)
    by_name = {caps.name: caps for caps in reported}
    missing = sorted(set(cfg.environments) - set(by_name))
    if missing:
        raise RolloutLevelError(
            f"[environments] configures {missing}, but the environment server reports only {sorted(by_name)}; "
            "run an environment server that serves every configured environment"
        )
    plans, warnings = {}, []
    for name in sorted(cfg.environments):
        caps = by_name[name]
        if caps.group_scored and caps.group_size != cfg.rollout.group_size:
            raise _group_size_mismatch(name, caps.group_size, cfg.rollout.group_size)
        wanted = _configured_level(cfg, name)
        level = coarser(wanted, FINEST_LEVEL[caps.recovery_mode])
        if level != wanted:
            warnings.append(
                f"environment {name!r} ({caps.kind}, {caps.recovery_mode}): recovery level lowered from "
                f"'{wanted}' to '{level}': {_WHY_LOWERED.get(caps.recovery_mode, 'its recovery mode')}"
            )
        plans[name] = RolloutLevelPlan(name, caps.kind, caps.recovery_mode, level, caps.group_scored)
    return plans, warnings


def unjournaled_turns_warning(cfg: TurnkeepConfig, servers: list[Capabilities],
                             plans: dict[str, RolloutLevelPlan]) -> str | None:
    """With snapshots off, only the turn journals keep turns: an environment planned at 'turn' on a server that
    keeps no journal continues nothing after a restore. One warning naming those servers and the fixes, or None."""
    if cfg.snapshot.enabled:
        return None  # its snapshots keep the agents of a server without a journal (parked)
    lacking = {server.name: [caps.name for caps in server.environments
                             if caps.name in plans and plans[caps.name].continues_saved_turns]
               for server in servers if not server.journals_turns}
    lacking = {name: envs for name, envs in lacking.items() if envs}
    if not lacking:
        return None
    named = "; ".join(f"{server} ({', '.join(sorted(envs))})" for server, envs in sorted(lacking.items()))
    return (f"environment server(s) {named} keep no turn journal and snapshot.enabled = false: after a restore "
            "their unfinished siblings start over (the 'sibling' level, not 'turn'); start them with `--journal-dir "
            "DIR` (turnkeep env-server), or set snapshot.enabled = true")


def _configured_level(cfg: TurnkeepConfig, name: str) -> RecoveryLevel:
    target = cfg.rollout_recovery.target_level
    return coarser(target, cfg.rollout_recovery.overrides.get(name, target))


def _group_size_mismatch(name: str, scored: int | None, group_size: int) -> RolloutLevelError:
    return RolloutLevelError(
        f"environments.{name}.group_size = {scored} but rollout.group_size = {group_size}: a group-scored "
        f"environment scores exactly one whole group; set both to the same value"
    )
