"""SIGTERM (what a cluster scheduler sends before it kills a job): save, then stop cleanly.

The first SIGTERM or SIGINT asks the run workflow for one final snapshot (trigger
`preemption`) and waits up to `snapshot.preemption_grace_s` for its outcome; then the
pumps stop and the run exits 0, saying what it saved. With snapshots off it writes a
trainer checkpoint at the current step instead. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
from pathlib import Path

import psutil
from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError

from turnkeep.controller.runtime import Controller
from turnkeep.controller.stores.trainer_checkpoint import published_steps
from turnkeep.primitives.pid_files import live_pids
from turnkeep.primitives.process_tree import kill_tree
from turnkeep.schemas.choices import Outcome
from turnkeep.schemas.snapshot import SnapshotNowSignal
from turnkeep.workers.temporal.controller_worker import SnapshotRuntime

log = logging.getLogger("turnkeep.preemption")
EXIT_AT_ONCE = 143
SHUTDOWN_AFTER_SAVE_S = 3.0
"""Once the final snapshot is published and the audit log ends, the processes' orderly stop gets this long before
they are killed: a scheduler's grace before SIGKILL is short (Slurm's is 30 s), and nothing left is worth keeping
(the run is crash-only: the next start restores from what is on disk)."""


class PreemptionHandler:
    def __init__(self, controller: Controller, snapshots: SnapshotRuntime | None, grace_s: float) -> None:
        self._controller = controller
        self._snapshots = snapshots
        self._grace_s = grace_s
        self._task: asyncio.Task | None = None
        self.saved: str | None = None
        """What the final save left behind, in words (set once the run stops for a preemption)."""

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signum)

    def uninstall(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
            if self._task is not None:
                # Preempted and shutting down: a second signal still exits at once and says so, never by the
                # signal's default action (a CI run's second SIGTERM landed after the final save, exit -15).
                signal.signal(signum, lambda received, _frame: self._on_signal(received))

    def exit_soon(self, step: int) -> None:
        """The run was preempted and everything it keeps is on disk: if the orderly stop of its processes (vLLM, Ray,
        Temporal) outlasts `SHUTDOWN_AFTER_SAVE_S`, kill them and exit 0 with the usual last line."""
        timer = threading.Timer(SHUTDOWN_AFTER_SAVE_S, self._exit_now, (step,))
        timer.daemon = True
        timer.start()

    def _exit_now(self, step: int) -> None:
        print(f"\n{preempted_line(step, self.saved or '')} (The processes did not stop within "
              f"{SHUTDOWN_AFTER_SAVE_S:g}s of the save and were killed.)", flush=True)
        try:
            _kill_children(self._controller.cfg.run.run_dir)
        finally:
            os._exit(0)

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self._task is not None:
            print(f"turnkeep: second {name}: exiting at once; the newest published snapshot stays authoritative",
                  file=sys.stderr, flush=True)
            _kill_children(self._controller.cfg.run.run_dir)
            os._exit(EXIT_AT_ONCE)
        print(f"turnkeep: {name}: taking a final snapshot (at most snapshot.preemption_grace_s = "
              f"{self._grace_s:g}s); send it again to exit at once", file=sys.stderr, flush=True)
        self._task = asyncio.get_running_loop().create_task(self._save_and_stop(name))

    async def _save_and_stop(self, name: str) -> None:
        self._controller.training.freeze()
        try:
            self.saved = await asyncio.wait_for(self._final_save(), self._grace_s)
        except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):  # the update, cancelled at the grace's end
            self.saved = self._nothing(f"within snapshot.preemption_grace_s = {self._grace_s:g}s")
        except Exception as err:  # noqa: BLE001 - the run must still stop and say why
            log.exception("final snapshot failed")
            self.saved = self._nothing(f"the final snapshot failed ({err})")
        self._controller.request_stop(f"preempted ({name})")

    async def _final_save(self) -> str:
        if self._snapshots is None:
            return await self._final_checkpoint()
        from turnkeep.workflows.run_workflow import RunWorkflow

        # The run workflow answers with what it saved; it asks again itself when the trainer outran an attempt.
        result = await self._snapshots.handle.execute_update(
            RunWorkflow.snapshot_and_wait, SnapshotNowSignal(reason="preemption (SIGTERM)", preemption=True)
        )
        if result.outcome in (Outcome.PUBLISHED, Outcome.PUBLISHED_RELEASE_PENDING):
            return f"snapshot {result.snapshot_dir} ({saved_agents(result)}, {result.data_plane_rows} finished rows)"
        return self._nothing(f"the final snapshot ended {result.outcome} ({result.reason})")

    def _nothing(self, why: str) -> str:
        """What the last line says was saved when the final save saved nothing: why, and where the next start begins."""
        return f"nothing ({why}); {next_start(self._controller.cfg.run.run_dir)}"

    async def _final_checkpoint(self) -> str:
        training = self._controller.training
        training.request_checkpoint("preemption")
        while not training.has_checkpoint_of_current_step():
            await asyncio.sleep(0.1)
        return (f"trainer checkpoint checkpoints/step_{training.step} "
                "(its data plane; running agents continue from the turn journals)")


def next_start(run_dir: Path) -> str:
    """Where the next start of the run begins, from what is on disk (said when the final save saved nothing)."""
    steps = published_steps(run_dir)
    if not steps:
        return "no trainer checkpoint is on disk, so the next start begins at step 0"
    return (f"the next start begins at step {steps[-1]} (trainer checkpoint step_{steps[-1]} and the newest snapshot "
            "filed under it)")


def preempted_line(step: int, saved: str) -> str:
    """The last line of a preempted run, however it exits."""
    return (f"turnkeep: preempted at step {step}; saved {saved}. Run the same command again (same --run-dir) to "
            "continue.")


def saved_agents(result) -> str:
    """What a published snapshot kept of the running agents, in the words of its mode."""
    kept = []
    if result.journaled_agents:
        kept.append(f"{result.journaled_agents} running agents kept in the turn journals")
    if result.parked_agents:
        kept.append(f"{result.parked_agents} parked agents")
    return f"step {result.anchor_step}, {' and '.join(kept) or 'no running agents to keep'}"


def _kill_children(run_dir: Path) -> None:
    """Ray, vLLM and the Temporal dev server must not outlive a run that exits at once, also when an earlier
    controller started them (its pid files name them)."""
    children = psutil.Process().children(recursive=True)
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(children, timeout=10)
    for pid in live_pids(run_dir).values():
        if pid != os.getpid():
            try:
                kill_tree(pid, timeout_s=10)
            except TimeoutError:
                pass
