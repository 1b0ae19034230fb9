"""The servers and sessions of the `openenv` adapter (`envs/adapters/openenv_session.py`): a server at its session
limit, an episode waiting for a session without blocking the loop, servers that fail to start or die with the
process that started them, and the environment server's warm-up starting them early."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.envs.adapters.openenv_games import APP, EXAMPLE, episode, example_importable, guess, play, secret_of
from turnkeep.envs.adapters.openenv_session import SERVERS
from turnkeep.envs.environment import StepResult

__all__ = ["example_importable"]  # an autouse fixture of these tests too

ONE_SESSION = """
from openenv.core.env_server import create_app
from turnkeep_example_openenv_guess.server import GuessAction, GuessEnvironment, GuessObservation

app = create_app(GuessEnvironment, GuessAction, GuessObservation, max_concurrent_envs=1)
"""


def test_a_server_at_its_session_limit_is_waited_for_then_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "openenv_one_session.py").write_text(ONE_SESSION)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    app = "openenv_one_session:app"

    async def group() -> list[list[StepResult]]:
        envs = [episode(seed, app=app) for seed in range(3)]  # one at a time: each waits for the one before to close
        return await asyncio.gather(*(play(env, [guess(secret_of(seed))]) for seed, env in enumerate(envs)))

    try:
        assert all(steps[0].done for steps in asyncio.run(group()))
        holder = episode(0, app=app)
        holder.prompt()
        waiting = episode(1, app=app, session_wait_s=1)
        with pytest.raises(RuntimeError, match="stayed at its session limit .* serve it with max_concurrent_envs of at least"):
            waiting.prompt()
        asyncio.run(holder.close())
        asyncio.run(waiting.close())
    finally:
        log = SERVERS._started[app].log
        SERVERS.stop(app)
        log.unlink(missing_ok=True)  # OpenEnv's tracebacks of the sessions it refused


def test_an_episode_waiting_for_a_session_leaves_the_servers_loop_running(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`begin()` waits for the session on the environment server's loop without blocking it (a `prompt()` that
    blocked it once stalled every other episode, and the server's /health, until the session wait ran out)."""
    (tmp_path / "openenv_one_session.py").write_text(ONE_SESSION)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    app = "openenv_one_session:app"

    async def go() -> tuple[int, str]:
        holder = episode(0, app=app)
        await holder.begin()
        waiting, ticks = episode(1, app=app), [0]

        async def tick() -> None:
            while True:
                ticks[0] += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        opened = asyncio.create_task(waiting.begin())
        await asyncio.sleep(0.5)
        during_the_wait = ticks[0]
        await holder.close()
        await opened
        ticker.cancel()
        prompt = waiting.prompt()
        await waiting.close()
        return during_the_wait, prompt

    try:
        during_the_wait, prompt = asyncio.run(go())
        assert during_the_wait >= 10 and prompt
    finally:
        log = SERVERS._started[app].log
        SERVERS.stop(app)
        log.unlink(missing_ok=True)


# Servers the adapter starts.

def test_a_server_that_does_not_start_is_named_with_its_log() -> None:
    env = episode(app="json:no_such_app", start_timeout_s=20)  # the module imports, the app is not there
    with pytest.raises(RuntimeError, match=r"the OpenEnv server of json:no_such_app exited with \d+ at start; see its "
                                           r"log /\S+json\.no_such_app\.\d+\.\d+\.log") as err:
        env.prompt()
    asyncio.run(env.close())
    log = Path(str(err.value).rsplit(" ", 1)[1])
    assert 'Attribute "no_such_app" not found' in log.read_text()
    log.unlink()


CHILD = f"""
import sys
sys.path.insert(0, {str(EXAMPLE / 'src')!r})
from turnkeep.envs.adapters.openenv_session import LOOP, SERVERS
LOOP.run(SERVERS.url_of({APP!r}, 60), 70)
print(SERVERS._started[{APP!r}].process.pid, SERVERS._started[{APP!r}].log, flush=True)
sys.stdin.read()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.mark.parametrize("ending", ["exit", "sigkill"])
def test_the_server_dies_with_the_process_that_started_it(ending: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        pid, log = child.stdout.readline().split()
        server_pid = int(pid)
        assert _alive(server_pid)
        if ending == "exit":
            child.stdin.close()  # atexit stops it
        else:
            os.kill(child.pid, signal.SIGKILL)  # no atexit: the parent-death signal kills it
        child.wait(30)
        deadline = time.monotonic() + 15
        while _alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server_pid)
        Path(log).unlink(missing_ok=True)  # left by a killed process (no atexit)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)


# Demonstrations: games the package's scripted player plays through the server.
