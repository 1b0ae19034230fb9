"""A trainer death during an incarnation of the run: the incarnation ends with `TrainerLost` when
`train.max_rebuilds` permits a rebuild, keeping the run's other processes for the next incarnation
(`workers.run_session`), or with the run's one stop line when it does not."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

from turnkeep.controller.errors import RunStopped
from turnkeep.controller.processes import Processes
from turnkeep.workers.process_watch import dead_reason
from turnkeep.workers.trainer_rebuilds import TrainerLost, TrainerRebuilds


async def rebuild_on_trainer_death(err: BaseException | None, processes: Processes, terms: "RebuildTerms",
                                    survives: bool) -> bool:
    """Turn the incarnation's end into `TrainerLost` when its trainer is dead and `train.max_rebuilds` permits a
    rebuild, or into the run's one stop line when it does not; any other end passes through."""
    if not isinstance(err, Exception) or isinstance(err, TrainerLost):
        return False
    reason = await dead_reason("trainer", processes.trainer)
    if reason is None:
        return False
    controller = terms.progress.get("controller")
    lose_trainer(reason, (controller.metrics.steps_trained or 0) if controller is not None else 0, terms.rebuilds,
                 terms.kept, survives)


def lose_trainer(reason: str, steps_trained: int, rebuilds: TrainerRebuilds, kept: "KeptForRebuild",
                 survives: bool) -> NoReturn:
    """`TrainerLost` when `train.max_rebuilds` permits a rebuild, keeping the run's other processes for it (with
    Ray inside this process they go with it, and the next incarnation starts them anew); else the stop line."""
    if not rebuilds.permits(steps_trained):
        raise RunStopped(rebuilds.refusal(reason)) from None
    kept.keep(survives)
    raise TrainerLost(reason, steps_trained) from None


class KeptForRebuild:
    """Set when the incarnation ends for a trainer rebuild: the run's Ray, processes and Temporal stay up for the
    next incarnation, which re-attaches to them."""

    on = False

    def keep(self, processes_survive: bool) -> None:
        """The incarnation ends for a rebuild: everything stays up when the processes outlive this one (with Ray
        inside this process they go with it whatever is kept)."""
        self.on = processes_survive

    def unless(self, stop, *args) -> None:
        if not self.on:
            stop(*args)

    async def unless_async(self, stop, *args) -> None:
        if not self.on:
            await stop(*args)


@dataclass(frozen=True)
class RebuildTerms:
    """What a trainer death at any point of the incarnation is judged by: the rebuilds left, what stays up for the
    next incarnation, and `progress["controller"]` once the controller is built (its steps trained count)."""

    rebuilds: TrainerRebuilds
    kept: KeptForRebuild
    progress: dict
