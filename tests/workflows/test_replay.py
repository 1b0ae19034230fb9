"""Replays recorded workflow histories, so a code change that breaks determinism fails here.

Histories are recorded by running the snapshot tests with TURNKEEP_RECORD_HISTORIES=1. The replay runs in the SDK's
sandbox with its default restrictions, which the controller's workflow thread does without for speed
(`workers.temporal.workflow_thread.WORKFLOW_RUNNER`): a workflow that calls the clock, random, a file or the network fails
here even where its commands would replay.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from turnkeep.workflows.run_workflow import RunWorkflow
from turnkeep.workflows.snapshot_attempt import SnapshotAttemptWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def test_recorded_histories_exist_for_both_workflows():
    kinds = {path.name.split("-", 1)[0] for path in HISTORIES}
    assert {"TurnkeepRun", "SnapshotAttempt"} <= kinds, kinds


def test_recorded_histories_replay_without_nondeterminism():
    async def replay():
        replayer = Replayer(workflows=[RunWorkflow, SnapshotAttemptWorkflow], data_converter=pydantic_data_converter,
                            workflow_runner=SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default))
        for path in HISTORIES:
            workflow_id = path.stem.split("-", 1)[1]
            history = WorkflowHistory.from_json(workflow_id, path.read_text())
            await replayer.replay_workflow(history)

    asyncio.run(replay())
