"""Every `temporal` command of the README's "Operators" block runs as written (address, run id and attempt
filled in) against a dev server that runs the real run and attempt workflows (their activities are stand-ins,
the attempt parks in gym.prepare), and does what the README says it does."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import subprocess
from pathlib import Path

from temporalio.api.enums.v1 import WorkflowExecutionStatus

from tests.workflows.test_run_workflow import _dev_server, _run_input
from tests.workflows.test_ui_conventions import RUN, Participants
from turnkeep.schemas.names import controller_queue, run_workflow_id
from turnkeep.workers.temporal.dev_server import temporal_binary
from turnkeep.workflows.run_workflow import RunWorkflow

README = Path(__file__).resolve().parents[1] / "docs" / "operations.md"


def readme_commands() -> list[str]:
    section = README.read_text().split("## Operators", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.startswith("temporal ")]


def _filled(command: str, address: str) -> list[str]:
    text = (command.replace("127.0.0.1:7233", address).replace("<run_id>", RUN).replace("<step>", "4")
            .replace("<n>", "1"))
    argv = shlex.split(text)
    return [temporal_binary(), *argv[1:]]


def test_every_operator_command_in_the_readme_works_as_written():
    commands = readme_commands()
    assert len(commands) >= 8 and any(" cancel " in c for c in commands)

    async def scenario():
        async with await _dev_server() as env:
            address = env.client.service_client.config.target_host
            parts = Participants()
            client = env.client
            async with parts.workers(client):
                run = await client.start_workflow(RunWorkflow.run, _run_input(attempt_interval_s=600),
                                                  id=run_workflow_id(RUN), task_queue=controller_queue(RUN))
                outputs = {}
                for command in commands:
                    done = await asyncio.to_thread(subprocess.run, _filled(command, address), capture_output=True,
                                                   text=True, timeout=60)
                    assert done.returncode == 0, (command, done.stderr)
                    outputs[command] = done.stdout
                    if "snapshot_now" in command:  # the attempt the cancel below aborts
                        await asyncio.wait_for(parts.preparing.wait(), 30)
                    if " cancel " in command:
                        while not parts.records:
                            await asyncio.sleep(0.05)
                    if "evaluate_now" in command:  # the controller is asked for an evaluation, as an operator
                        while not parts.evaluations:
                            await asyncio.sleep(0.05)
                attempt = await client.get_workflow_handle(f"{RUN}.snapshot.4.1").describe()
                status = await run.query(RunWorkflow.status)
                await run.signal(RunWorkflow.stop, "test over")
                await run.result()
        return outputs, attempt, status, parts

    outputs, attempt, status, parts = asyncio.run(scenario())
    query = next(out for cmd, out in outputs.items() if " query " in cmd)
    assert json.loads(query[query.index("{"):])["run_id"] == RUN  # the status query answers
    assert not status.paused  # paused, then resumed, as written
    assert attempt.status == WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_CANCELED
    assert parts.records[0].result.outcome == "aborted" and "gym.abort" in parts.calls
    assert parts.evaluations == ["operator"]
