"""The NeMo Gym resources server behind the `nemo_gym` adapter: found and described with the NeMo Gym venv's python,
started once per process (lazily, shared by every episode, dying with the process), and called over HTTP with one
session (cookie jar) per episode, as NeMo Gym's simple_agent calls it.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PYTHON = REPO / ".venvs" / "nemo_gym" / "bin" / "python"
"""The python of the venv `scripts/nemo_gym_venv.sh` makes."""
LAUNCHER = Path(__file__).with_name("nemo_gym_launch.py")
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ServerApp:
    """A resources server's app folder, its config file and the config's instance name."""

    folder: Path
    config: Path
    name: str
    agents: tuple[tuple[str, str], ...]
    """The config's agents: (instance name, agent type)."""


def python_of(python: str | None) -> Path:
    """The NeMo Gym venv's interpreter; ValueError naming the fix when it is missing."""
    path = Path(python).expanduser() if python else DEFAULT_PYTHON
    if not path.is_file():
        how = "set options.python to its bin/python" if python else f"run {REPO / 'scripts' / 'nemo_gym_venv.sh'}"
        raise ValueError(f"nemo_gym: no python at {path} (the venv where nemo-gym is installed); {how}")
    return path


@lru_cache(maxsize=32)
def describe(python: Path, server: str) -> ServerApp:
    """Where `server` (a bundled name, an app folder or a config) lives; ValueError when it cannot run here."""
    done = subprocess.run([str(python), str(LAUNCHER), "describe", server], capture_output=True, text=True,
                          timeout=120)
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"nemo_gym: {python} cannot describe resources server {server!r} ({last}); is nemo-gym "
                         f"installed there? (scripts/nemo_gym_venv.sh)") from None
    if "error" in found:
        raise ValueError(f"nemo_gym: {found['error']}")
    if found["refusal"]:
        raise ValueError(f"nemo_gym: {found['refusal']}")
    return ServerApp(Path(found["folder"]), Path(found["config"]), found["name"], tuple(found["agents"].items()))


def _die_with_parent(parent: int) -> None:
    """In the child before exec: SIGKILL when the process that started it dies, so no server outlives a run."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


class ResourcesServer:
    """One resources server process, started on first use by whoever needs it in this process."""

    _running: dict[tuple[Path, ServerApp], ResourcesServer] = {}
    _lock = threading.Lock()

    def __init__(self, python: Path, app: ServerApp) -> None:
        self.python, self.app = python, app
        self.log = Path(tempfile.gettempdir()) / f"turnkeep-nemo-gym-{os.getpid()}-{app.name}.log"
        self.url = ""
        self._proc: subprocess.Popen | None = None
        self._ready = False

    @classmethod
    def shared(cls, python: Path, app: ServerApp) -> ResourcesServer:
        with cls._lock:
            server = cls._running.get((python, app))
            if server is None:
                server = cls._running[(python, app)] = cls(python, app)
            server._start()
            return server

    def _start(self) -> None:
        """Popen from the calling thread (the parent-death signal follows that thread): the loop's, or the caller's."""
        if self._proc is not None and self._proc.poll() is None:
            return
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        parent = os.getpid()
        self._proc = subprocess.Popen(
            [str(self.python), str(LAUNCHER), "serve", str(self.app.folder), str(self.app.config), self.app.name,
             str(port)],
            stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=lambda: _die_with_parent(parent), env={**os.environ, "PYTHONUNBUFFERED": "1"},
            cwd=self.app.folder.parent.parent,
        )
        self.url, self._ready = f"http://127.0.0.1:{port}", False
        atexit.register(self.stop)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()

    def _check(self, started: float, timeout_s: float) -> bool:
        if self._ready:
            return True
        if self._proc is not None and self._proc.poll() is not None:
            raise RuntimeError(f"nemo_gym: resources server {self.app.name!r} exited with {self._proc.returncode} "
                               f"while starting; see {self.log}")
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"nemo_gym: resources server {self.app.name!r} was not up after {timeout_s:.0f} s; "
                               f"see {self.log}")
        return False

    async def ready(self, timeout_s: float) -> str:
        """The server's URL once it answers (its liveness route)."""
        started = time.monotonic()
        async with aiohttp.ClientSession() as http:
            while not self._check(started, timeout_s):
                try:
                    async with http.get(self.url + "/", timeout=aiohttp.ClientTimeout(total=2)) as response:
                        self._ready = response.status == 200
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    await asyncio.sleep(0.2)
        return self.url


class Session:
    """One episode's session on a resources server: its cookie jar carries NeMo Gym's session id."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self._http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True),  # 127.0.0.1 sets the cookie
                                           timeout=aiohttp.ClientTimeout(total=timeout_s))

    async def post_text(self, route: str, body: dict[str, Any]) -> tuple[int, str]:
        """The route's status and body text (a tool's reply is its body as is, whatever the status, as simple_agent
        feeds it back)."""
        async with self._http.post(f"{self.url}/{route}", json=body) as response:
            return response.status, await response.text()

    async def post_json(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        status, text = await self.post_text(route, body)
        if status != 200:
            raise RuntimeError(f"nemo_gym: /{route} answered HTTP {status}: {text[:300]}")
        return json.loads(text) if text.strip() else {}

    async def close(self) -> None:
        await self._http.close()
