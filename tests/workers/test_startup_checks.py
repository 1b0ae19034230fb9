"""A run that cannot start says why in one line, and writes nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from turnkeep.cli.main import main
from turnkeep.workers.temporal.ports import free_port


def _config(tmp_path: Path, body: str) -> tuple[Path, Path]:
    run_dir = tmp_path / "run"
    config = tmp_path / "run.toml"
    config.write_text(f'[run]\nrun_dir = "{run_dir}"\n{body}')
    return config, run_dir


def _remote_config(tmp_path: Path, port: int, token_file: Path) -> tuple[Path, Path]:
    return _config(tmp_path, f'[environments.far]\nkind = "remote"\nurl = "http://127.0.0.1:{port}"\n'
                             f'token_file = "{token_file}"\n')


def _one_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_malformed_prompts_file_is_named_by_file_and_line(tmp_path, capsys) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Q 1+2", "answer": 3}\n\n{"prompt": ""}\n')
    config, run_dir = _config(tmp_path, f'[data]\ntrain = "{prompts}"\n')
    assert main(["run", "--config", str(config)]) == 2
    line = _one_line(capsys)
    assert f"{prompts} line 3" in line and "prompt" in line
    assert not run_dir.exists()


def test_a_remote_server_that_does_not_answer_is_named(tmp_path, capsys) -> None:
    port = free_port("127.0.0.1")  # nothing listens there
    token = tmp_path / "token"
    token.write_text("secret\n")
    token.chmod(0o600)
    config, run_dir = _remote_config(tmp_path, port, token)
    assert main(["run", "--config", str(config)]) == 2
    line = _one_line(capsys)
    assert "environments.far" in line and f"127.0.0.1:{port} does not answer" in line and "turnkeep env-server" in line
    assert not run_dir.exists()


def test_demonstrations_from_an_environment_without_any_are_refused(tmp_path, capsys) -> None:
    config, run_dir = _config(tmp_path, '[model.tiny]\ndemonstrations = "calc"\n')
    assert main(["run", "--config", str(config)]) == 2
    assert "model.tiny.demonstrations = 'calc'" in _one_line(capsys)
    assert not run_dir.exists()


def test_a_run_directory_that_is_a_file_or_cannot_be_made_is_named_and_nothing_is_made(tmp_path, capsys) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for run_dir, problem in ((a_file, "is a file, not a directory"), (a_file / "run", "a file, not a directory"),
                             (Path("/sys/kernel/turnkeep-run"), "cannot write there")):
        config = tmp_path / "run.toml"
        config.write_text(f'[run]\nrun_dir = "{run_dir}"\n')
        assert main(["run", "--config", str(config)]) == 2
        line = _one_line(capsys)
        assert line.startswith(f"turnkeep: run.run_dir (--run-dir) = {run_dir}") and problem in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "run.toml"]


def test_a_model_cache_that_cannot_be_written_is_named(tmp_path, capsys) -> None:
    config, run_dir = _config(tmp_path, '[model]\ncache_dir = "/sys/kernel/turnkeep-models"\n')
    assert main(["run", "--config", str(config)]) == 2
    assert "model.cache_dir = /sys/kernel/turnkeep-models: cannot write there" in _one_line(capsys)
    assert not run_dir.exists()


@pytest.mark.integration  # a real `turnkeep env-server` process
def test_a_remote_server_that_refuses_the_token_is_named_before_anything_starts(tmp_path, capsys) -> None:
    port = free_port("127.0.0.1")
    log = tmp_path / "env-server.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "turnkeep", "env-server", "--entry", "turnkeep.envs.calc_env:CalcEnvironment",
         "--port", str(port), "--token-file", str(tmp_path / "server_token")],
        stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 60
        while "serving" not in log.read_text():
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        wrong = tmp_path / "wrong_token"
        wrong.write_text("not-the-servers-token\n")
        wrong.chmod(0o600)
        config, run_dir = _remote_config(tmp_path, port, wrong)
        assert main(["run", "--config", str(config)]) == 2
        line = _one_line(capsys)
        assert f"environments.far: the server at http://127.0.0.1:{port} refuses the token in {wrong}" in line, line
        assert not run_dir.exists()
        config, run_dir = _remote_config(tmp_path, port, tmp_path / "no_such_token")
        assert main(["run", "--config", str(config)]) == 2
        line = _one_line(capsys)
        assert "environments.far.token_file" in line and "no_such_token" in line, line
        assert not run_dir.exists()
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
