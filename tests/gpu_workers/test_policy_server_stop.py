"""The policy server's stop: vLLM's output handler is cancelled before the engine stops, so a clean exit logs no
EngineDeadError traceback (vLLM itself stops the engine core first and cancels the handler after)."""

from __future__ import annotations

import asyncio

from turnkeep.gpu_workers.policy_server import PolicyServer


class _Engine:
    """Stands in for AsyncLLM: an output handler task, and a shutdown that notes whether it was still running."""

    def __init__(self) -> None:
        self.output_handler = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
        self.handler_running_at_shutdown: bool | None = None

    def shutdown(self) -> None:
        self.handler_running_at_shutdown = not self.output_handler.done()


def test_the_output_handler_is_cancelled_before_the_engine_shuts_down():
    async def scenario() -> _Engine:
        server = PolicyServer()
        engine = server._engine = _Engine()
        await server.stop()
        return engine

    engine = asyncio.run(scenario())
    assert engine.handler_running_at_shutdown is False
    assert engine.output_handler.cancelled()
