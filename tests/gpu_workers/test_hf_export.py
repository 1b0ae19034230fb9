"""A checkpoint's weights fitted to the model's own weight files: the model's names kept and cast, a tied copy left
out, and a missing name, another shape or a weight the model has not refused as foreign."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from turnkeep.gpu_workers.hf_export import ForeignWeights, fit_to_model, set_config_dtype

MODEL = Path("/models/tiny")


def _state() -> dict[str, torch.Tensor]:
    embed = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    return {"embed.weight": embed, "head.weight": embed.clone(), "norm.weight": torch.ones(3)}


def test_the_models_names_are_kept_in_its_dtype_and_a_tied_copy_is_left_out():
    fitted = fit_to_model(_state(), {"embed.weight": (4, 3), "norm.weight": (3,)}, "bfloat16", MODEL)
    assert list(fitted) == ["embed.weight", "norm.weight"]
    assert {tensor.dtype for tensor in fitted.values()} == {torch.bfloat16}
    assert list(fit_to_model(_state(), None, "float32", MODEL)) == ["embed.weight", "head.weight", "norm.weight"]


@pytest.mark.parametrize(("shapes", "change", "words"), [
    ({"embed.weight": (4, 3), "lm.weight": (4, 3)}, None, "it lacks lm.weight, which the model at /models/tiny has"),
    ({"embed.weight": (4, 4), "norm.weight": (3,)}, None, "embed.weight (4, 3) (the model's: (4, 4))"),
    ({"embed.weight": (4, 3), "norm.weight": (3,)}, "head.weight", "it holds head.weight, which the model at"),
])
def test_weights_that_are_not_the_models_are_foreign(shapes, change, words):
    state = _state()
    if change:
        state[change] = state[change] + 1  # no longer a tied copy
    with pytest.raises(ForeignWeights) as refused:
        fit_to_model(state, shapes, "float32", MODEL)
    assert words in str(refused.value)


def test_the_config_names_the_dtype_under_the_key_it_uses(tmp_path):
    config = tmp_path / "config.json"
    config.write_text('{"torch_dtype": "float32", "hidden_size": 8}')
    set_config_dtype(config, "bfloat16")
    assert config.read_text().count("bfloat16") == 1 and '"torch_dtype": "bfloat16"' in config.read_text()
