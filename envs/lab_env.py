"""The calc task with a live tool: the calculator is a long-lived child process.

A process's in-memory state cannot be exported or rebuilt by replay, so this environment
exercises the `restart_only` recovery path: after a failure its episode can only start
over. The child is a real separate process (not a coroutine) so that tests and fault
injection see what a real live resource does: it holds a pid, it can die on its own, and
it must be killed on close.
"""

from __future__ import annotations

import asyncio
import sys
from asyncio.subprocess import PIPE, Process

from turnkeep.envs.calc_env import CalcEnvironment
from turnkeep.envs.calc_task import CalcCall
from turnkeep.envs.environment import EnvContext
from turnkeep.schemas.rollout import Problem

REPL_CODE = """
import sys
served = 0
while True:
    line = sys.stdin.readline()
    if not line:
        break
    a, op, b = line.split()
    a, b = int(a), int(b)
    served += 1
    if op == "+":
        result = a + b
    elif op == "-":
        result = a - b
    elif op == "*":
        result = a * b
    else:
        result = "ERR"
    print(served, result)
"""
"""The child's loop: reads `a op b` lines, prints `<calls served so far> <result>` lines."""


class LabEnvironment(CalcEnvironment):
    """Calc whose calculator runs in one child process per episode, started on the first call."""

    kind = "lab"
    recovery_mode = "restart_only"

    def __init__(self, problem: Problem, ctx: EnvContext = EnvContext()) -> None:
        super().__init__(problem, ctx)
        self._proc: Process | None = None
        self.calls_served = 0
        """Calls the child has served, as the child itself reported (its in-process state)."""

    async def _call_tool(self, call: CalcCall) -> str:
        return f"R {await self._ask(call)}\n"

    async def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            try:
                proc.kill()
            except ProcessLookupError:  # it exited between the check and the kill
                pass
            await proc.wait()

    @property
    def pid(self) -> int | None:
        """The child's pid (None before the first call and after close)."""
        return self._proc.pid if self._proc is not None else None

    async def _ask(self, call: CalcCall) -> str:
        proc = await self._process()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(f"{call.a} {call.op} {call.b}\n".encode())
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            await self._raise_died(proc)
        line = await proc.stdout.readline()
        if not line:
            await self._raise_died(proc)
        served, result = line.decode().split()
        self.calls_served = int(served)
        return result

    async def _process(self) -> Process:
        if self._proc is None:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-S", "-u", "-c", REPL_CODE, stdin=PIPE, stdout=PIPE
            )
        elif self._proc.returncode is not None:
            await self._raise_died(self._proc)
        return self._proc

    async def _raise_died(self, proc: Process) -> None:
        code = await proc.wait()
        raise RuntimeError(f"lab calculator process {proc.pid} died unexpectedly (exit code {code})")
