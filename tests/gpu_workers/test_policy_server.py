"""The policy server against a real (tiny, random) vLLM engine, shared by all tests.

The refit test is the one that matters most: after new weights are loaded, the
server's logprobs must equal the trainer's (plain transformers, log_softmax of the
logits) for the same tokens. It catches the CPU backend's stale prepacked lm_head
for tied embeddings, and a prefix cache that kept KV from the old weights.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch

from turnkeep.gpu_workers.weights_blob import pack_state_dict
from turnkeep.primitives.token_tally import read_tally

pytestmark = pytest.mark.integration

# Longer than one CPU KV block (128 tokens), so the prefix cache holds it.
LONG_PROMPT = [1] + [4 + (i * 7) % 30 for i in range(149)]


async def _post(url: str, body: Any, raw: bool = False) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s:
        kwargs = {"data": body} if raw else {"json": body}
        async with s.post(f"{url}/v1/completions", **kwargs) as r:
            return r.status, await r.json()


async def _health(url: str) -> dict:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{url}/health") as r:
            return await r.json()


def trainer_logprobs(
    model: torch.nn.Module, prompt: list[int], tokens: list[int], temperature: float = 1.0
) -> list[float]:
    """What the trainer computes: log_softmax of the logits (divided by the temperature)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return [logprobs[len(prompt) - 1 + i, t].item() for i, t in enumerate(tokens)]


def perturbed_model(model_dir: Path, seed: int) -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    return model


def test_completion_returns_tokens_logprobs_and_version(policy_server, loop) -> None:
    stops = [2, 10, 11, 12, 13]  # </s> and a few digits
    body = {"prompt": [1, 5, 6, 7], "max_tokens": 8, "temperature": 1.0, "seed": 3, "stop_token_ids": stops}
    status, resp = loop.run(_post(policy_server.url, body))
    assert status == 200, resp
    choice = resp["choices"][0]
    assert 1 <= len(choice["token_ids"]) <= 8
    if choice["finish_reason"] == "stop":
        assert choice["token_ids"][-1] in stops
    assert len(choice["logprobs"]["token_logprobs"]) == len(choice["token_ids"])
    assert all(lp <= 0 for lp in choice["logprobs"]["token_logprobs"])
    assert choice["finish_reason"] in ("stop", "length")
    assert isinstance(choice["text"], str)
    assert resp["policy_version"] == 0
    health = loop.run(_health(policy_server.url))
    assert health.pop("tokens_generated") >= len(choice["token_ids"])  # the fixture's server may have served more
    assert health == {"policy_version": 0, "inflight": 0, "admission_open": True, "holders": [], "weights_ok": True,
                      "warm_up_error": None, "engine": 0}


def test_the_engine_tallies_every_token_it_generates_to_a_file_probes_apart(policy_server, loop, tmp_path) -> None:
    """Counted from vLLM's per-step stats into a memory-mapped file (`primitives.token_tally`): the completion's
    tokens exactly, and a liveness probe's one token in both slots."""
    path = Path(policy_server.tally_tokens(tmp_path / "tokens", 7))
    assert path.name.startswith("inc7-engine0-pid") and read_tally(path) == {"generated": 0, "probes": 0}
    status, resp = loop.run(_post(policy_server.url, {"prompt": [1, 5, 6], "max_tokens": 12, "seed": 1}))
    assert status == 200, resp
    generated = len(resp["choices"][0]["token_ids"])
    assert read_tally(path) == {"generated": generated, "probes": 0}
    assert loop.run(policy_server.engine_answers(30.0)) is not None
    assert read_tally(path) == {"generated": generated + 1, "probes": 1}


def test_refit_logprobs_match_trainer(policy_server, loop, tiny_model_dir) -> None:
    # Fill the prefix cache with the old weights' KV for the long prompt.
    assert loop.run(_post(policy_server.url, {"prompt": LONG_PROMPT, "max_tokens": 4}))[0] == 200
    for version in (policy_server.policy_version + 1, policy_server.policy_version + 2):
        model = perturbed_model(tiny_model_dir, seed=version)
        loop.run(policy_server.load_weights(pack_state_dict(model.state_dict()), version))
        assert loop.run(_health(policy_server.url))["policy_version"] == version
        for seed, prompt in enumerate([[1, 5, 6, 7], [1, 9, 20, 11, 12, 30], LONG_PROMPT]):
            body = {"prompt": prompt, "max_tokens": 12, "temperature": 1.0, "seed": seed}
            status, resp = loop.run(_post(policy_server.url, body))
            assert status == 200, resp
            assert resp["policy_version"] == version
            choice = resp["choices"][0]
            expected = trainer_logprobs(model, prompt, choice["token_ids"])
            got = choice["logprobs"]["token_logprobs"]
            assert got == pytest.approx(expected, abs=1e-3), (version, prompt)


def test_logprobs_are_those_of_the_sampling_temperature(policy_server, loop, tiny_model_dir) -> None:
    """processed_logprobs: log_softmax(logits / T), the distribution tokens came from."""
    version = policy_server.policy_version + 1
    model = perturbed_model(tiny_model_dir, seed=100)
    loop.run(policy_server.load_weights(pack_state_dict(model.state_dict()), version))
    prompt = [1, 9, 20, 11]
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0.7, "seed": 5}
    status, resp = loop.run(_post(policy_server.url, body))
    assert status == 200, resp
    choice = resp["choices"][0]
    expected = trainer_logprobs(model, prompt, choice["token_ids"], temperature=0.7)
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(expected, abs=1e-3)


def test_refit_under_load_labels_every_response_truthfully(policy_server, loop, tiny_model_dir) -> None:
    """Calls accepted before a refit finish on the old weights; calls that arrive during it wait."""
    v_old, v_new = policy_server.policy_version + 1, policy_server.policy_version + 2
    models = {v_old: perturbed_model(tiny_model_dir, seed=400), v_new: perturbed_model(tiny_model_dir, seed=401)}
    loop.run(policy_server.load_weights(pack_state_dict(models[v_old].state_dict()), v_old))
    prompts = [[1, 5 + i, 6] for i in range(12)]

    async def scenario() -> list[tuple[list[int], dict]]:
        def call(p: list[int], seed: int) -> asyncio.Task:
            return asyncio.create_task(_post(policy_server.url, {"prompt": p, "max_tokens": 24, "seed": seed}))

        before = [call(p, i) for i, p in enumerate(prompts[:6])]
        while policy_server.inflight() == 0:
            await asyncio.sleep(0.001)
        refit = asyncio.create_task(policy_server.load_weights(pack_state_dict(models[v_new].state_dict()), v_new))
        await asyncio.sleep(0)  # the refit closes the gate before the next calls arrive
        after = [call(p, i) for i, p in enumerate(prompts[6:])]
        await refit
        results = await asyncio.gather(*before, *after)
        return [(p, r) for p, (_, r) in zip(prompts, results)]

    results = loop.run(scenario())
    assert v_old in {r["policy_version"] for _, r in results[:6]}
    assert {r["policy_version"] for _, r in results[6:]} == {v_new}
    for prompt, resp in results:
        choice = resp["choices"][0]
        expected = trainer_logprobs(models[resp["policy_version"]], prompt, choice["token_ids"])
        assert choice["logprobs"]["token_logprobs"] == pytest.approx(expected, abs=1e-3)


def test_old_version_is_refused(policy_server, loop) -> None:
    with pytest.raises(ValueError, match="refusing"):
        loop.run(policy_server.load_weights(b"", policy_server.policy_version - 1))


def test_gate_holds_new_calls_until_released(policy_server, loop) -> None:
    async def scenario() -> None:
        assert policy_server.close_admission("snapshot:t1")
        call = asyncio.create_task(_post(policy_server.url, {"prompt": [1, 5], "max_tokens": 4}))
        await asyncio.sleep(0.5)
        assert not call.done()
        health = await _health(policy_server.url)
        assert health["admission_open"] is False and health["holders"] == ["snapshot:t1"]
        assert health["inflight"] == 0  # waiting at the gate is not accepted
        assert policy_server.open_admission("snapshot:t1")
        status, _ = await asyncio.wait_for(call, 30)
        assert status == 200

    loop.run(scenario())


def test_drain_waits_for_accepted_calls(policy_server, loop) -> None:
    async def scenario() -> None:
        calls = [
            asyncio.create_task(_post(policy_server.url, {"prompt": [1, 5 + i], "max_tokens": 32, "seed": i}))
            for i in range(8)
        ]
        while policy_server.inflight() == 0:
            await asyncio.sleep(0.001)
        policy_server.close_admission("snapshot:t2")
        try:
            drained = await policy_server.drain(timeout_s=30)
            assert drained >= 1
            assert policy_server.inflight() == 0
        finally:
            policy_server.open_admission("snapshot:t2")
        assert [status for status, _ in await asyncio.gather(*calls)] == [200] * 8

    loop.run(scenario())


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": 4}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt.0"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [1, 10_000]}, "prompt"),
        ({"prompt": [1, 5], "max_tokens": 0}, "max_tokens"),
        ({"prompt": [1, 5], "max_tokens": 100_000}, "max_tokens"),
        ({"prompt": [1, 5], "temperature": -1}, "temperature"),
        ({"prompt": [1, 5], "stop_token_ids": [-3]}, "stop_token_ids"),
        ({"prompt": [1, 5], "seed": "x"}, "seed"),
    ],
)
def test_bad_request_is_400_naming_the_field(policy_server, loop, body, param) -> None:
    status, resp = loop.run(_post(policy_server.url, body))
    assert status == 400
    assert resp["error"]["param"] == param, resp


def test_invalid_json_is_400(policy_server, loop) -> None:
    status, resp = loop.run(_post(policy_server.url, b"{not json", raw=True))
    assert status == 400
    assert "JSON" in resp["error"]["message"]
    # The engine survived every bad request above.
    assert loop.run(_post(policy_server.url, {"prompt": [1, 5], "max_tokens": 2}))[0] == 200


def test_blob_that_does_not_fit_is_refused_before_the_engine(policy_server, loop, tiny_model_dir) -> None:
    version = policy_server.policy_version
    with pytest.raises(ValueError, match="not safetensors"):
        loop.run(policy_server.load_weights(b"garbage-bytes", version + 1))
    state = perturbed_model(tiny_model_dir, seed=300).state_dict()
    wrong_shape = dict(state, **{"model.norm.weight": torch.ones(3)})
    with pytest.raises(ValueError, match="model.norm.weight"):
        loop.run(policy_server.load_weights(pack_state_dict(wrong_shape), version + 1))
    partial = {k: v for k, v in state.items() if "layers.1." not in k}
    with pytest.raises(ValueError, match="lacks"):
        loop.run(policy_server.load_weights(pack_state_dict(partial), version + 1))
    assert policy_server.weights_ok and policy_server.policy_version == version
    assert loop.run(policy_server.drain(1)) == 0 and policy_server.gate.is_open()


def test_failed_load_serves_503_until_a_load_succeeds(policy_server, loop, tiny_model_dir, monkeypatch) -> None:
    """Runs last: it breaks the weights inside vLLM on purpose, then repairs them."""
    version = policy_server.policy_version
    model = perturbed_model(tiny_model_dir, seed=200)
    # Skip the server's own shape check, so that the failure happens in vLLM's worker.
    monkeypatch.setattr(policy_server, "weight_shapes", None)
    wrong = dict(model.state_dict(), **{"model.embed_tokens.weight": torch.zeros(3, 128)})
    with pytest.raises(Exception, match="collective_rpc"):
        loop.run(policy_server.load_weights(pack_state_dict(wrong), version + 1))
    health = loop.run(_health(policy_server.url))
    assert health["weights_ok"] is False and health["admission_open"] and health["policy_version"] == version
    status, resp = loop.run(_post(policy_server.url, {"prompt": [1, 5], "max_tokens": 2}))
    assert status == 503, resp

    loop.run(policy_server.load_weights(pack_state_dict(model.state_dict()), version + 1))
    prompt = [1, 9, 20, 11]
    status, resp = loop.run(_post(policy_server.url, {"prompt": prompt, "max_tokens": 12, "seed": 9}))
    assert status == 200 and resp["policy_version"] == version + 1
    choice = resp["choices"][0]
    expected = trainer_logprobs(model, prompt, choice["token_ids"])
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(expected, abs=1e-3)
