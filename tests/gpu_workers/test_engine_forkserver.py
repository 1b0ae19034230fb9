"""The engine core's forkserver: its children start with the environment the policy actor has when it starts
them, not the one the forkserver started with; vLLM's launcher is pointed at it only where it has the attribute."""

from __future__ import annotations

import multiprocessing
import os
import sys
import types
from pathlib import Path

from turnkeep.gpu_workers import engine_forkserver


def _write_variable_and_title(path: str) -> None:
    import setproctitle

    setproctitle.setproctitle("VLLM::EngineCore")  # what vLLM's engine core does first
    title = Path(f"/proc/{os.getpid()}/cmdline").read_text().split("\0")[0].strip()
    Path(path).write_text(f"{os.environ.get('TURNKEEP_TEST_VARIABLE', '<unset>')}|{title}")


def test_a_child_takes_the_variables_set_after_the_forkserver_started_and_can_retitle_itself(tmp_path,
                                                                                              monkeypatch) -> None:
    monkeypatch.delenv("TURNKEEP_TEST_VARIABLE", raising=False)
    multiprocessing.forkserver.ensure_running()  # started without the variable
    monkeypatch.setenv("TURNKEEP_TEST_VARIABLE", "set by vLLM before its engine core starts")
    out = tmp_path / "seen"
    child = engine_forkserver.EnvironmentCarryingProcess(target=_write_variable_and_title, args=(str(out),))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    # The title is how the run's memory figures tell the engine core from the other processes.
    assert out.read_text() == "set by vLLM before its engine core starts|VLLM::EngineCore"


def test_vllms_launcher_gets_the_forkserver_only_where_it_reads_its_context(monkeypatch) -> None:
    launcher = types.ModuleType("vllm.v1.engine.utils")
    launcher.get_mp_context = lambda: multiprocessing.get_context("spawn")
    monkeypatch.setitem(sys.modules, "vllm.v1.engine.utils", launcher)
    assert engine_forkserver.use_for_engines()
    context = launcher.get_mp_context()
    assert context.get_start_method() == "forkserver"
    assert isinstance(context.Process(target=print), engine_forkserver.EnvironmentCarryingProcess)

    moved = types.ModuleType("vllm.v1.engine.utils")
    monkeypatch.setitem(sys.modules, "vllm.v1.engine.utils", moved)
    assert not engine_forkserver.use_for_engines()


def test_a_child_applies_the_variables_torch_read_when_the_forkserver_imported_it(monkeypatch) -> None:
    import torch
    import torch._dynamo

    monkeypatch.setattr(torch._dynamo.config, "disable", False)
    threads = torch.get_num_threads()
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    try:
        engine_forkserver._apply_variables_read_at_import()
        assert torch._dynamo.config.disable and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


def test_an_eager_cpu_engine_runs_vllms_sampler_ops_uncompiled() -> None:
    from turnkeep.gpu_workers.vllm_engine import engine_env
    from turnkeep.schemas.config_services import PolicyServerConfig

    assert engine_env(PolicyServerConfig(enforce_eager=True))["TORCHDYNAMO_DISABLE"] == "1"
    assert "TORCHDYNAMO_DISABLE" not in engine_env(PolicyServerConfig(enforce_eager=False))
