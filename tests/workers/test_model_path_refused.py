"""A model.path that holds no model, or a model without its tokenizer.json, is named in one line before anything
starts (a run with its own Ray: the path is on this machine), by `turnkeep run` and by `turnkeep make-model`
alike. (On a cluster, `ray.address`, the node that loads the model checks it: `workers/ray_cluster/placement.py`.)"""

from __future__ import annotations

import pytest

from turnkeep.cli.main import main


@pytest.mark.parametrize("command", ["run", "make-model"])
def test_a_model_path_without_a_model_or_its_tokenizer_is_one_line_before_anything_starts(
        command, tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    model = tmp_path / "model"
    model.mkdir()
    assert main([command, "--set", f"run.run_dir={run_dir}", "--set", f"model.path={model}"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == (f"turnkeep: model.path = '{model}' holds no config.json and no tokenizer.json. Point model.path "
                    "at a Hugging Face model directory (config.json, weights, tokenizer.json), or remove model.path "
                    "to use the made-up tiny model."), line
    (model / "config.json").write_text("{}")
    assert main([command, "--set", f"run.run_dir={run_dir}", "--set", f"model.path={model}"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "holds no tokenizer.json." in line and "config.json and" not in line, line
    assert not run_dir.exists()
