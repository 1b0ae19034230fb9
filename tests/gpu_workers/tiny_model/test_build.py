"""Making and caching the tiny model: atomic, cached, loadable, seeded."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from turnkeep.envs.calc_transcripts import CalcTranscripts
from turnkeep.gpu_workers.tiny_model import build, recipe
from turnkeep.gpu_workers.tiny_model.build import ensure_tiny_model
from turnkeep.gpu_workers.tiny_model.tokenizer import encode, load_tokenizer, newline_id
from turnkeep.schemas.config import ModelConfig, TaskConfig, TinyModelConfig

TINY = TinyModelConfig(
    hidden_size=64,
    num_heads=2,
    head_dim=32,
    num_layers=1,
    intermediate_size=64,
    warm_start_steps=5,
    warm_start_batch_size=4,
)
TASK = TaskConfig()


def _ensure(cache: Path, seed: int = 0) -> Path:
    return ensure_tiny_model(ModelConfig(cache_dir=cache, tiny=TINY), CalcTranscripts(TASK), seed, eval_rollouts=4)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _ensure(tmp_path_factory.mktemp("cache"))


def test_build_writes_a_hugging_face_directory(built: Path) -> None:
    names = {p.name for p in built.iterdir()}
    assert names >= {"config.json", "model.safetensors", "generation_config.json"}
    assert names >= {"tokenizer.json", "tokenizer_config.json"}
    assert not [p for p in built.parent.iterdir() if p.name.startswith(".")]


def test_second_call_reuses_the_cache(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_rebuild(*args: object) -> None:
        raise AssertionError("rebuilt a cached model")

    monkeypatch.setattr(build, "_make_model_dir", no_rebuild)
    assert _ensure(built.parent) == built


def test_model_loads_in_transformers(built: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(built)
    tok = AutoTokenizer.from_pretrained(built)
    cfg = model.config
    shape = (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim)
    assert shape == (64, 1, 2, 32)
    assert cfg.num_key_value_heads == 2 and not cfg.tie_word_embeddings
    assert cfg.vocab_size == len(tok) and cfg.bos_token_id == tok.bos_token_id
    assert model.dtype == torch.float32
    ids = [tok.bos_token_id] + encode(load_tokenizer(built), "Q 1+2\n")
    logits = model(input_ids=torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), cfg.vocab_size)
    assert newline_id(load_tokenizer(built)) == tok.convert_tokens_to_ids("\n")


def test_same_inputs_give_identical_weights(built: Path, tmp_path: Path) -> None:
    stale = tmp_path / f".staging-{built.name}-0123456789ab"  # left by a build killed mid-way
    stale.mkdir()
    other = _ensure(tmp_path)
    assert other.name == built.name and not stale.exists()
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (other / name).read_bytes() == (built / name).read_bytes()


def test_a_failed_build_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(*args: object) -> None:
        raise RuntimeError("crash while building")

    monkeypatch.setattr(build, "_make_model_dir", crash)
    with pytest.raises(RuntimeError):
        _ensure(tmp_path, seed=1)
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == []


def test_cache_key_depends_on_every_input() -> None:
    key = recipe.cache_key(TINY, CalcTranscripts(TASK), 0)
    assert key != recipe.cache_key(TINY, CalcTranscripts(TASK), 1)
    assert key != recipe.cache_key(TINY, CalcTranscripts(TaskConfig(num_operands=4)), 0)
    assert key != recipe.cache_key(TINY.model_copy(update={"warm_start_steps": 6}), CalcTranscripts(TASK), 0)


def test_a_set_path_is_validated(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    assert ensure_tiny_model(ModelConfig(path=tmp_path), CalcTranscripts(TASK), 0) == tmp_path
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="config.json") as err:
        ensure_tiny_model(ModelConfig(path=empty), CalcTranscripts(TASK), 0)
    assert str(empty) in str(err.value) and "model.path" in str(err.value)


def test_concurrent_callers_build_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from concurrent.futures import ThreadPoolExecutor

    calls = []
    real = build._make_model_dir

    def counted(*args: object) -> None:
        calls.append(1)
        real(*args)

    monkeypatch.setattr(build, "_make_model_dir", counted)
    with ThreadPoolExecutor(2) as pool:
        paths = list(pool.map(lambda _: _ensure(tmp_path, seed=2), range(2)))
    assert paths[0] == paths[1] and len(calls) == 1


def test_the_saved_chat_template_ends_turns_at_the_newline(built: Path) -> None:
    from turnkeep.envs.codec import TurnCodec

    tok = load_tokenizer(built)
    codec = TurnCodec(built)
    assert codec.template_source == "tokenizer_config.json"
    assert codec.end_of_turn_ids == (newline_id(tok),) and newline_id(tok) in codec.stop_ids
    # The line protocol's ids: bos, then the prompt line as encoded on its own.
    assert codec.conversation_start("Q 1+2\n") == [tok.token_to_id("<bos>")] + encode(tok, "Q 1+2\n")
    assert codec.after_turn(encode(tok, "C 1+2\n"), "R 3\n") == encode(tok, "R 3\n")
