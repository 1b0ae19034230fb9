"""`turnkeep status` asks Temporal about a live run: the run workflow's status query and the attempts still
open with their phase (a real dev server; the attempt's activities are stand-ins, one parks for good)."""

from __future__ import annotations

import asyncio
import time

from tests.workflows.test_run_workflow import _dev_server, _run_input
from tests.workflows.test_ui_conventions import RUN, Participants
from turnkeep.cli.status_temporal import temporal_view
from turnkeep.schemas.names import controller_queue, run_workflow_id
from turnkeep.workflows.run_workflow import RunWorkflow


def test_a_live_run_shows_its_snapshot_state_and_the_open_attempt_with_its_phase(tmp_path):
    async def scenario():
        async with await _dev_server() as env:
            parts = Participants()
            client = env.client
            async with parts.workers(client):
                run = await client.start_workflow(RunWorkflow.run, _run_input(attempt_interval_s=600),
                                                  id=run_workflow_id(RUN), task_queue=controller_queue(RUN))
                await run.signal(RunWorkflow.snapshot_now)
                await asyncio.wait_for(parts.preparing.wait(), 30)
                deadline = time.monotonic() + 20
                while True:  # the list is eventually consistent
                    view = await temporal_view(tmp_path, RUN, env.client.service_client.config.target_host,
                                               "default")
                    if view["answered"] and view["open_attempts"] or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.2)
                await run.signal(RunWorkflow.stop, "test over")
                await run.cancel()
        return view

    view = asyncio.run(scenario())
    assert view["answered"], view
    assert view["running_attempt"] == "r.snapshot.4.1" and not view["paused"]
    assert view["open_attempts"] == [{"id": "r.snapshot.4.1", "phase": "gym_prepare",
                                      "started": view["open_attempts"][0]["started"]}]


def test_a_temporal_that_does_not_answer_is_named_not_raised(tmp_path):
    view = asyncio.run(temporal_view(tmp_path, RUN, "127.0.0.1:9", "default"))
    assert not view["answered"] and view["why"].startswith("the server at 127.0.0.1:9:"), view
