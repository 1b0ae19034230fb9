"""A host that only serves environments installs turnkeep without the trainer and engine extras (no torch, Ray,
vLLM or transformers) and runs `turnkeep env-server` from that install."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import pytest

from tests.run_command import wait_until
from tests.test_wheel import REPO, build_wheel

TRAINER_PACKAGES = ("torch", "ray", "vllm", "transformers")
"""What the `trainer`, `cpu` and `gpu` extras bring and an environment server must do without."""

ENTRY = "turnkeep.envs.calc_env:CalcEnvironment"


def test_the_env_server_command_loads_no_trainer_package() -> None:
    """In the full install too: `turnkeep env-server` loads only its own modules (cli/main.py loads the command's)."""
    code = (
        "import sys\n"
        "from turnkeep.cli.main import COMMANDS, _build_parser, _load\n"
        "_build_parser(['env-server'])\n"
        "_load(COMMANDS['env-server'][1])\n"
        "from turnkeep.envs.loading import load_environment\n"
        f"load_environment({ENTRY!r}, {{}})\n"
        f"print(sorted({{name.split('.')[0] for name in sys.modules}} & set({TRAINER_PACKAGES!r})))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _install_without_extras(root: Path) -> Path:
    """A fresh venv with the wheel and its own dependencies only (from the package registry); its bin folder."""
    wheel = build_wheel(root)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return venv / "bin"


def _importable(python: Path, names: tuple[str, ...]) -> list[str]:
    code = ("import importlib.util, json\n"
            f"print(json.dumps([n for n in {names!r} if importlib.util.find_spec(n) is not None]))")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return orjson.loads(done.stdout)


def _get(url: str, token: str | None = None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as answer:
        return answer.status, orjson.loads(answer.read())


@pytest.mark.integration
def test_an_env_server_runs_from_an_install_without_the_trainer(tmp_path: Path) -> None:
    started = time.monotonic()
    bin_dir = _install_without_extras(tmp_path)
    installed_s = time.monotonic() - started
    assert _importable(bin_dir / "python", TRAINER_PACKAGES) == []
    assert _importable(bin_dir / "python", ("turnkeep", "temporalio", "aiohttp")) == ["turnkeep", "temporalio",
                                                                                      "aiohttp"]
    port, token_file, log = _free_port(), tmp_path / "env_token", tmp_path / "env-server.log"
    # From a folder of its own: nothing of the repository on its path, only what the venv installed.
    server = subprocess.Popen(
        [str(bin_dir / "turnkeep"), "env-server", "--entry", ENTRY, "--port", str(port), "--token-file",
         str(token_file)],
        cwd=tmp_path, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True,
        env={key: value for key, value in os.environ.items() if key != "PYTHONPATH"} | {"PYTHONUNBUFFERED": "1"},
    )
    try:
        wait_until(lambda: "serving" in log.read_text(), 60, "the env-server", server)
        status, health = _get(f"http://127.0.0.1:{port}/health")
        assert status == 200 and health["running"] == 0, health
        assert _get(f"http://127.0.0.1:{port}/auth", token_file.read_text().strip()) == (200, {"token": "accepted"})
    finally:
        server.send_signal(signal.SIGTERM)  # by its pid: SIGTERM is its clean stop
        code = server.wait(timeout=30)
    assert code == 0, log.read_text()[-3000:]
    _run_names_the_extras(bin_dir / "turnkeep", tmp_path)
    _env_try_plays_scripted_turns(bin_dir / "turnkeep", tmp_path)
    print(f"install without extras {installed_s:.1f}s, whole test {time.monotonic() - started:.1f}s")


def _run_names_the_extras(turnkeep: Path, root: Path) -> None:
    """`turnkeep run` there stops before it starts anything, in one line that names the extras to install."""
    done = subprocess.run([str(turnkeep), "run", "--config", str(REPO / "configs" / "tiny.toml"), "--run-dir",
                           str(root / "run"), "--steps", "1"], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    assert "pip install 'turnkeep[cpu]'" in done.stderr.strip().splitlines()[-1], done.stderr[-3000:]
    assert "Traceback" not in done.stderr


def _env_try_plays_scripted_turns(turnkeep: Path, root: Path) -> None:
    """`turnkeep env try` with scripted turns needs no trainer package either (README, "Install"), and says what a
    model policy would need."""
    (root / "turns.txt").write_text("C 89-25\nC 64+53\nA 117\n")
    prompts = str(REPO / "configs" / "prompts" / "calc_sample.jsonl")
    args = ["env", "try", "--entry", ENTRY, "--prompts", prompts, "--episodes", "1"]
    done = subprocess.run([str(turnkeep), *args, "--turns", str(root / "turns.txt")], cwd=root, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "  reward 1.0\n" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
    model = subprocess.run([str(turnkeep), *args, "--policy", "model"], cwd=root, capture_output=True, text=True,
                           timeout=120)
    assert model.returncode == 2 and "this install has no" in model.stderr.strip().splitlines()[-1], model.stderr
