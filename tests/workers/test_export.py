"""`turnkeep export`: a trainer checkpoint of one rank or two becomes a folder transformers loads (weights, config,
tokenizer, chat template, generation config) whose logprobs are the trainer's own for that checkpoint, in the run's
dtype; a missing step, a damaged or foreign checkpoint and a taken --out are one line and exit 2, and a failed
export leaves nothing behind.

Tolerance: the export holds the checkpoint's very bits and transformers runs the trainer's own model code, so on one
rank the logprobs are equal; the two ranks' are computed by the FSDP2-sharded model (gathered weights, the same
float32 arithmetic). 1e-4 is far below what a wrong, stale or untrained weight moves them (the step at lr 1e-2
moves them by more than 1e-2, asserted)."""

from __future__ import annotations

import errno
import re
import shutil
from pathlib import Path

import orjson
import pytest
import torch

from tests.workers.export_runs import MadeRun, make_run, model_logprobs
from turnkeep.cli.main import main

TOLERANCE = 1e-4
LINE = re.compile(r"^turnkeep export: (\S+) \(trainer checkpoint step (\d+) of \S+\): (\d+) bytes written in "
                  r"([0-9.]+) s$")


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory) -> MadeRun:
    return make_run(tmp_path_factory.mktemp("export_one_rank"))


def export(capsys, run_dir: Path, out: Path, *more: str) -> tuple[int, str, list[str]]:
    """`turnkeep export` in this process: (exit code, stdout, stderr's lines)."""
    code = main(["export", "--run-dir", str(run_dir), "--out", str(out), *more])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


def loaded_logprobs(folder: Path, run: MadeRun, dtype: torch.dtype) -> torch.Tensor:
    """The export as transformers loads it (its config's dtype), scored on the run's prompt."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer("Q 37+48-12")["input_ids"] == run.prompt_ids
    assert tokenizer.chat_template == AutoTokenizer.from_pretrained(run.model_dir).chat_template
    model = AutoModelForCausalLM.from_pretrained(folder, dtype="auto")
    assert model.dtype == dtype
    return model_logprobs(model, run.prompt_ids)


def checked_line(stdout: str, out: Path) -> tuple[int, float]:
    lines = stdout.strip().splitlines()
    assert len(lines) == 1 and (match := LINE.match(lines[0])), stdout
    assert Path(match.group(1)) == out
    written = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
    assert int(match.group(3)) == written
    return written, float(match.group(4))


def assert_trainers_logprobs(folder: Path, run: MadeRun, dtype: torch.dtype, label: str) -> None:
    from transformers import AutoModelForCausalLM

    exported = loaded_logprobs(folder, run, dtype)
    difference = (exported - run.logprobs).abs().max().item()
    untrained = model_logprobs(AutoModelForCausalLM.from_pretrained(run.model_dir, dtype=dtype), run.prompt_ids)
    moved = (untrained - run.logprobs).abs().max().item()
    print(f"{label}: export vs trainer logprobs, max abs difference {difference:.3g} (the training step moved "
          f"them {moved:.3g})")
    assert difference < TOLERANCE
    assert moved > 1e-2


def test_a_one_rank_checkpoint_exports_to_a_folder_transformers_loads_with_the_trainers_logprobs(
        one_rank, tmp_path, capsys):
    out = tmp_path / "hf"
    code, stdout, errors = export(capsys, one_rank.run_dir, out)
    assert code == 0 and not errors, errors
    written, seconds = checked_line(stdout, out)
    print(f"one rank: {written} bytes in {seconds} s")
    names = {path.name for path in out.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json"} <= names
    assert "turnkeep_tiny.json" not in names and not list(tmp_path.glob(".staging-*"))
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(out).chat_template  # the tiny model's own, carried over
    assert orjson.loads((out / "config.json").read_bytes()).get("dtype", "float32") == "float32"
    assert_trainers_logprobs(out, one_rank, torch.float32, "one rank, float32")


def test_a_lora_checkpoint_holds_only_adapters_and_exports_them_merged_into_the_base_weights(tmp_path, capsys):
    run = make_run(tmp_path / "lora", lora={"rank": 4, "alpha": 32.0})
    capsys.readouterr()  # transformers' loading bars, while the run's trainer started
    shards = run.run_dir / "checkpoints" / "step_1" / "trainer" / "shards"
    from turnkeep.gpu_workers.hf_export import read_model_state

    saved = read_model_state(shards)
    assert saved and all(".lora_A." in name or ".lora_B." in name for name in saved)
    out = tmp_path / "hf"
    code, stdout, errors = export(capsys, run.run_dir, out)
    assert code == 0 and not errors, errors
    assert_trainers_logprobs(out, run, torch.float32, "LoRA rank 4, merged")


def test_the_export_keeps_the_runs_dtype(tmp_path, capsys):
    run = make_run(tmp_path / "bf16", dtype="bfloat16")
    out = tmp_path / "hf"
    code, _, errors = export(capsys, run.run_dir, out)
    assert code == 0, errors
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), framework="pt") as weights:
        assert {weights.get_slice(name).get_dtype() for name in weights.keys()} == {"BF16"}
    assert orjson.loads((out / "config.json").read_bytes())["dtype"] == "bfloat16"
    assert_trainers_logprobs(out, run, torch.bfloat16, "one rank, bfloat16")


@pytest.mark.integration  # two spawned trainer ranks, a gloo group
def test_a_two_rank_checkpoint_exports_sharded_with_the_sharded_trainers_logprobs(tmp_path, capsys):
    from tests.gpu_workers.conftest import build_tiny_llama

    # A model folder of its own (model.path), with tied input and output embeddings.
    run = make_run(tmp_path / "two", ranks=2, model_path=build_tiny_llama(tmp_path / "tied"))
    assert sorted(p.name for p in (run.run_dir / "checkpoints/step_1/trainer/shards").iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp"]
    out = tmp_path / "hf"
    code, stdout, errors = export(capsys, run.run_dir, out, "--step", "1", "--max-shard-size", "40KB")
    assert code == 0, errors
    written, seconds = checked_line(stdout, out)
    print(f"two ranks: {written} bytes in {seconds} s")
    index = orjson.loads((out / "model.safetensors.index.json").read_bytes())
    assert len(set(index["weight_map"].values())) > 1
    assert "lm_head.weight" not in index["weight_map"]  # tied: saved once, as in the model's own folder
    assert_trainers_logprobs(out, run, torch.float32, "two ranks, float32")


def _corrupt_a_shard(run_dir: Path) -> None:
    shard = run_dir / "checkpoints/step_1/trainer/shards/__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def _foreign_run(run_dir: Path) -> None:
    (run_dir / "run.json").write_bytes(orjson.dumps({"run_id": "another-run-9f9f9f", "incarnation": 1}))


REFUSALS = {
    "no_such_step": ([], ["--step", "7"], "has no trainer checkpoint of step 7 (it has steps 1); pass one of them"),
    "corrupt": ([_corrupt_a_shard], [], "(digest_mismatch)"),
    "foreign": ([_foreign_run], [], "(foreign_run)"),
    "no_checkpoint": ([lambda d: shutil.rmtree(d / "checkpoints")], [], "holds no trainer checkpoint yet"),
    "not_a_run": ([lambda d: (d / "run.json").unlink()], [], "is not a turnkeep run directory"),
    "out_taken": ([], [], "exists and is not an empty folder; pass a new folder"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_a_refusal_is_one_line_naming_the_fix_and_writes_nothing(case, one_rank, tmp_path, capsys):
    damages, more, words = REFUSALS[case]
    run_dir = tmp_path / "run"
    shutil.copytree(one_rank.run_dir, run_dir)
    for damage in damages:
        damage(run_dir)
    out = tmp_path / "exports" / "hf"
    if case == "out_taken":
        out.mkdir(parents=True)
        (out / "notes.txt").write_text("mine")
    code, stdout, errors = export(capsys, run_dir, out, *more)
    print(errors)
    assert code == 2 and not stdout
    assert len(errors) == 1 and errors[0].startswith("turnkeep export: ") and words in errors[0], errors
    if case == "out_taken":
        assert [p.name for p in out.iterdir()] == ["notes.txt"]
    else:
        assert not out.exists()
    assert not out.parent.exists() or not list(out.parent.glob(".staging-*"))


def test_a_failed_write_leaves_nothing_and_an_empty_out_is_filled(one_rank, tmp_path, capsys, monkeypatch):
    import turnkeep.workers.export as export_module

    def full_disk(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    out = tmp_path / "hf"
    out.mkdir()
    with monkeypatch.context() as patched:
        patched.setattr(export_module, "write_weights", full_disk)
        code, _, errors = export(capsys, one_rank.run_dir, out)
    assert code == 2 and len(errors) == 1 and "No space left on device" in errors[0], errors
    assert not list(tmp_path.glob(".staging-*")) and list(out.iterdir()) == []
    code, _, errors = export(capsys, one_rank.run_dir, out)
    assert code == 0 and (out / "model.safetensors").is_file(), errors
