"""A rank's shard copy round-trips its weights, AdamW moments and RNG bit for bit (the next step after a load is
the step the original would have made); a copy of another model is refused by name."""

import random

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions

from turnkeep.gpu_workers.shard_state import ShardMismatch, load_shard_bytes, shard_bytes

OPTIONS = StateDictOptions()
CPU = torch.device("cpu")


def _model_and_optimizer(width: int = 8):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _step(model, optimizer) -> None:
    model(torch.randn(4, model[0].in_features)).pow(2).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_a_copy_loads_weights_moments_and_rng_exactly():
    model, optimizer = _model_and_optimizer()
    for _ in range(3):
        _step(model, optimizer)
    blob = shard_bytes(model, optimizer, OPTIONS, CPU, {"step": 3, "groups": ["g1"]})
    python_draw = random.random()
    _step(model, optimizer)  # the original goes on one step (its RNG draws the input)
    after = {name: p.detach().clone() for name, p in model.named_parameters()}

    fresh, fresh_optimizer = _model_and_optimizer()  # a rebuilt rank: the initial weights, no moments
    meta = load_shard_bytes(fresh, fresh_optimizer, OPTIONS, OPTIONS, CPU, blob)
    assert meta == {"step": 3, "groups": ["g1"]}
    assert fresh_optimizer.state_dict()["state"][0]["step"] == 3
    _step(fresh, fresh_optimizer)  # the same RNG draws the same input; the same moments make the same update
    for name, parameter in fresh.named_parameters():
        assert torch.equal(parameter, after[name]), name
    assert random.random() == python_draw  # Python's RNG came along too: its next draw is the original's


def test_a_copy_of_another_model_is_refused_by_name():
    model, optimizer = _model_and_optimizer(width=8)
    _step(model, optimizer)
    blob = shard_bytes(model, optimizer, OPTIONS, CPU, {"step": 1})
    other, other_optimizer = _model_and_optimizer(width=6)
    _step(other, other_optimizer)
    with pytest.raises(ShardMismatch, match=r"the shard copy's model\.0\.weight has shape \(8, 8\), this rank's \(6, 6\)"):
        load_shard_bytes(other, other_optimizer, OPTIONS, OPTIONS, CPU, blob)
