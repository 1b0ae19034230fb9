"""A Temporal server started outside turnkeep: an unreachable one is named in one line before anything
starts. (A whole run on one that restarts mid-run: tests/workers/test_preemption.py.)"""

from __future__ import annotations

from turnkeep.cli.main import main
from turnkeep.workers.temporal.ports import free_port


def test_an_unreachable_temporal_is_named_in_one_line_and_nothing_is_written(tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    config = tmp_path / "run.toml"
    port = free_port("127.0.0.1")
    config.write_text(f'[run]\nrun_dir = "{run_dir}"\n[temporal]\naddress = "127.0.0.1:{port}"\n')
    assert main(["run", "--config", str(config)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert f"temporal.address = '127.0.0.1:{port}': no Temporal server answers" in line
    assert "docker compose up -d" in line
    assert not run_dir.exists()


def test_a_missing_tls_file_is_named(tmp_path, capsys) -> None:
    config = tmp_path / "run.toml"
    config.write_text(f'[run]\nrun_dir = "{tmp_path / "run"}"\n[temporal]\naddress = "127.0.0.1:1"\n'
                      f'tls_cert = "{tmp_path / "client.pem"}"\ntls_key = "{tmp_path / "client.key"}"\n')
    assert main(["run", "--config", str(config)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "temporal.tls_cert" in line and "cannot be read" in line

