"""The OpenEnv side of turnkeep's `openenv` adapter: the servers it starts, and one WebSocket session per episode.

OpenEnv's HTTP `/reset` and `/step` build a fresh environment for every request (no episode spans two calls), so
each episode holds its own session on `/ws` through OpenEnv's `GenericEnvClient`. Every session of this process
lives on one event loop in a thread of its own (`LOOP`): the adapter's `prompt()` is synchronous, so it waits on a
reset started in the episode's constructor, which must run on a loop other than the environment server's.

A server the adapter starts (`options.app`) is one uvicorn process per app per process, started on the first
episode, on a free loopback port; it dies with the process that started it (a parent-death signal, its own
process group killed at exit), and its output goes to a log file named in every error about it.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Coroutine, TypeVar

from openenv.core.generic_client import GenericEnvClient
from websockets.exceptions import ConnectionClosed

T = TypeVar("T")

_SERVE = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: die with the starting thread\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(0)  # the parent died before prctl\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'uvicorn', *sys.argv[2:]])\n"
)
"""Runs in the child: the parent-death signal survives exec, so uvicorn dies with the thread that started it."""


class SessionLoop:
    """One event loop in a daemon thread for every OpenEnv session of this process (a thread that lives as long as
    the process, so the servers it starts keep their parent-death signal armed)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._started())

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Wait for `coro` from a thread that is not the loop's own."""
        return self.submit(coro).result(timeout_s)

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="turnkeep-openenv", daemon=True).start()
                self._loop = loop
            return self._loop


LOOP = SessionLoop()


class SessionError(RuntimeError):
    """The server answered a message with an error: its OpenEnv code and message."""

    def __init__(self, code: str, message: str, data: dict[str, Any]) -> None:
        super().__init__(f"{message} ({code})")
        self.code = code
        self.data = data


class _Client(GenericEnvClient):
    """OpenEnv's generic client, its error replies raised with their code and details (the policy is told what was
    wrong with an action, as the environment's validation said it)."""

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        await self._send(message)
        response = await self._receive()
        if response.get("type") == "error":
            data = response.get("data", {})
            raise SessionError(str(data.get("code", "UNKNOWN")), str(data.get("message", "unknown error")), data)
        return response

    async def disconnect(self) -> None:
        # The server closes the socket after a close message; closing it first ourselves makes the server's own
        # close fail, a traceback in its log for every episode.
        if self._ws is None:
            return
        ws, self._ws = self._ws, None
        try:
            await ws.send(json.dumps({"type": "close"}))
            await asyncio.wait_for(ws.wait_closed(), CLOSE_WAIT_S)
        except Exception:  # already closed, or slow to: closed below either way
            pass
        await ws.close()


CLOSE_WAIT_S = 5.0
"""Seconds a closing session waits for the server to close its socket."""


@dataclass
class Session:
    """One episode's session: its client and the server's URL."""

    client: _Client
    url: str

    async def reset(self, seed: int) -> dict[str, Any]:
        return _payload(await self.client.reset(seed=seed))

    async def step(self, action: dict[str, Any]) -> dict[str, Any]:
        return _payload(await self.client.step(action))

    async def close(self) -> None:
        await self.client.close()


def _payload(result: Any) -> dict[str, Any]:
    return {"observation": dict(result.observation or {}), "reward": result.reward, "done": bool(result.done)}


async def open_session(url: str, seed: int, wait_s: float, message_timeout_s: float) -> tuple[Session, dict]:
    """A new session reset with `seed`, and the reset's payload; a server at its session limit is asked again
    until `wait_s` (its sessions end with their episodes)."""
    deadline = time.monotonic() + wait_s
    while True:
        client = _Client(base_url=url, message_timeout_s=message_timeout_s)
        session = Session(client, url)
        try:
            return session, await session.reset(seed)
        except (SessionError, ConnectionClosed) as err:
            await client.close()
            # A server at its limit answers the new session with CAPACITY_REACHED and closes it, often before
            # the reset is sent: a closed connection is asked again too.
            if isinstance(err, SessionError) and err.code != "CAPACITY_REACHED":
                raise RuntimeError(f"the OpenEnv server at {url} refused reset(seed={seed}): {err}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the OpenEnv server at {url} stayed at its session limit (or closed new sessions) for "
                    f"{wait_s:.0f} s; serve it with max_concurrent_envs of at least the group size") from None
            await asyncio.sleep(0.2)
        except BaseException:
            await client.close()
            raise


async def fetch_json(url: str, timeout_s: float = 10.0) -> Any:
    def get() -> Any:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            return json.loads(reply.read())

    return await asyncio.to_thread(get)


@dataclass
class _Started:
    url: str
    process: subprocess.Popen
    log: Path


class Servers:
    """The uvicorn servers this process started, by app (one each); call only on `LOOP`."""

    def __init__(self) -> None:
        self._started: dict[str, _Started] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        atexit.register(self.stop_all)

    async def url_of(self, app: str, timeout_s: float) -> str:
        """The URL of `app`'s server, started (and waited for) the first time it is asked for."""
        async with self._locks.setdefault(app, asyncio.Lock()):
            started = self._started.get(app)
            if started is not None and started.process.poll() is None:
                return started.url
            if started is not None:
                raise RuntimeError(f"the OpenEnv server of {app} exited with {started.process.returncode}; see "
                                   f"its log {started.log}")
            started = _start(app)
            self._started[app] = started
            await _wait_healthy(started, app, timeout_s)
            return started.url

    def running(self, app: str) -> bool:
        started = self._started.get(app)
        return started is not None and started.process.poll() is None

    def stop_all(self) -> None:
        for app in list(self._started):
            self.stop(app)

    def stop(self, app: str) -> None:
        started = self._started.pop(app, None)
        if started is not None:
            _kill(started.process)
            if started.log.exists() and started.log.stat().st_size == 0:  # nothing to read: leave no file
                started.log.unlink(missing_ok=True)


def _start(app: str) -> _Started:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = LOG_DIR / f"{app.replace(':', '.')}.{os.getpid()}.{port}.log"
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", _SERVE, str(os.getpid()), app, "--host", "127.0.0.1", "--port", str(port),
             "--log-level", "warning"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    return _Started(f"http://127.0.0.1:{port}", process, log)


async def _wait_healthy(started: _Started, app: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if started.process.poll() is not None:
            raise RuntimeError(f"the OpenEnv server of {app} exited with {started.process.returncode} at start; "
                               f"see its log {started.log}")
        try:
            if (await fetch_json(f"{started.url}/health", 1.0)).get("status") == "healthy":
                return
        except OSError:
            pass
        await asyncio.sleep(0.2)
    _kill(started.process)
    raise RuntimeError(f"the OpenEnv server of {app} was not healthy within {timeout_s:.0f} s "
                       f"(options.start_timeout_s); see its log {started.log}")


def _kill(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(5)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)
    except ProcessLookupError:
        pass


LOG_DIR = Path(tempfile.gettempdir()) / "turnkeep-openenv"
"""Where the servers' logs go (`<app>.<pid>.<port>.log`); an empty one is removed when its server is stopped."""
SERVERS = Servers()
