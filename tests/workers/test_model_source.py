"""`model.path` as a Hugging Face hub id: found in the Hugging Face cache (here a cache laid out in tmp_path, offline)
and handed on as its folder; one that is not there is one line naming it and the command that fetches it, before
anything starts; a local folder is what it was."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from turnkeep.cli.main import main
from turnkeep.config.loader import ConfigError, load_config
from turnkeep.schemas.config import ModelConfig
from turnkeep.workers.model_maker import tiny_model_dir
from turnkeep.workers.model_source import hub_cache_dir, with_model_resolved
from turnkeep.workers.startup_checks import check_before_start

ROOT = Path(__file__).resolve().parents[2]
TINY_TOML = ROOT / "configs" / "tiny.toml"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
MODEL_FILES = {"config.json": '{"model_type": "llama"}', "tokenizer.json": '{"version": "1.0"}',
               "tokenizer_config.json": "{}"}


def _cache_model(cache: Path, repo_id: str, commit: str = COMMIT) -> Path:
    """`repo_id` at `commit` in a hub cache as huggingface_hub lays it out (blobs, a snapshot of links to them, the
    main branch's ref); returns the snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for name, text in MODEL_FILES.items():
        blob = repo / "blobs" / hashlib.sha256(text.encode()).hexdigest()
        blob.write_text(text)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)  # no newline, as huggingface_hub writes it
    return snapshot


@pytest.fixture
def hf_home(tmp_path, monkeypatch) -> Path:
    """An offline Hugging Face home in tmp_path (huggingface_hub read its settings at import: they are set now)."""
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    return home


def _config(tmp_path: Path, **model: str):
    settings = {"run.run_dir": str(tmp_path / "run"), **{f"model.{key}": value for key, value in model.items()}}
    return load_config(TINY_TOML, settings)


def test_a_cached_hub_id_is_its_snapshot_folder_offline_at_the_main_branch_or_a_commit(tmp_path, hf_home) -> None:
    snapshot = _cache_model(hf_home / "hub", "org/name").resolve()
    for model in ({"path": "org/name"}, {"path": "org/name", "revision": COMMIT}):
        cfg = _config(tmp_path, **model)
        assert cfg.model.path == "org/name"  # a hub id stays one until it is resolved
        resolved = with_model_resolved(cfg)
        assert resolved.model.path == snapshot and isinstance(resolved.model.path, Path), resolved.model.path
        assert resolved.model.revision == model.get("revision")
        assert with_model_resolved(resolved) == resolved  # resolved once: a second pass changes nothing
        check_before_start(resolved)  # the folder holds a model as a local one must
        assert not (tmp_path / "run").exists()
    # The folder survives the trip through config.json, which every later process reads.
    reread = type(resolved).model_validate_json(resolved.model_dump_json())
    assert reread.model.path == snapshot


def test_hf_hub_cache_names_the_cache_over_hf_home(tmp_path, hf_home, monkeypatch) -> None:
    cache = tmp_path / "elsewhere"
    snapshot = _cache_model(cache, "org/name").resolve()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert hub_cache_dir() == cache
    assert with_model_resolved(_config(tmp_path, path="org/name")).model.path == snapshot


def test_a_tool_that_loads_the_config_itself_gets_the_folder_of_a_hub_id(tmp_path, hf_home) -> None:
    snapshot = _cache_model(hf_home / "hub", "org/name").resolve()
    assert tiny_model_dir(_config(tmp_path, path="org/name")) == snapshot  # bench/, scripts/gpu_check.py


@pytest.mark.parametrize("how", ["set", "config"])
def test_make_model_prints_the_snapshot_folder_of_a_hub_id_from_set_or_the_config_file(
        how, tmp_path, hf_home, capsys) -> None:
    snapshot = _cache_model(hf_home / "hub", "org/name").resolve()
    args = ["make-model", "--set", f"run.run_dir={tmp_path / 'run'}"]
    if how == "set":
        args += ["--set", "model.path=org/name"]
    else:
        config = tmp_path / "run.toml"
        config.write_text(f'[model]\npath = "org/name"\nrevision = "{COMMIT}"\n')
        args += ["--config", str(config)]
    assert main(args) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.strip() == str(snapshot)


def test_the_kl_reference_by_hub_id_is_resolved_and_its_errors_name_its_key(tmp_path, hf_home) -> None:
    snapshot = _cache_model(hf_home / "hub", "org/reference").resolve()
    cfg = load_config(TINY_TOML, {"run.run_dir": str(tmp_path / "run"), "algorithm.kl_coef": "0.05",
                                  "algorithm.reference_path": "org/reference"})
    resolved = with_model_resolved(cfg)
    assert resolved.algorithm.reference_path == snapshot and resolved.model.path == cfg.model.path
    check_before_start(resolved)
    missing = load_config(TINY_TOML, {"run.run_dir": str(tmp_path / "run"), "algorithm.kl_coef": "0.05",
                                      "algorithm.reference_path": "org/gone"})
    with pytest.raises(ConfigError) as err:
        with_model_resolved(missing)
    assert str(err.value).startswith("algorithm.reference_path = 'org/gone' is not in the Hugging Face cache")
    assert str(err.value).endswith("or set algorithm.reference_path to a local folder")


@pytest.mark.parametrize("revision", [None, "v1.0"])
def test_a_hub_id_not_cached_offline_is_one_line_naming_it_and_the_command_that_fetches_it(
        tmp_path, hf_home, revision) -> None:
    _cache_model(hf_home / "hub", "org/name")  # another model is cached; this revision or repository is not
    repo_id = "org/name" if revision else "org/missing"
    model = {"path": repo_id} if revision is None else {"path": repo_id, "revision": revision}
    with pytest.raises(ConfigError) as err:
        with_model_resolved(_config(tmp_path, **model))
    [line] = str(err.value).splitlines()
    fetch = f"`hf download {repo_id}`" if revision is None else f"`hf download {repo_id} --revision {revision}`"
    assert line.startswith(f"model.path = '{repo_id}'"), line
    assert f"is not in the Hugging Face cache ({hf_home / 'hub'}) and HF_HUB_OFFLINE is set" in line, line
    assert f"fetch it with {fetch}, or set model.path to a local folder" in line, line


def test_the_run_command_refuses_a_hub_id_not_cached_offline_in_one_line_and_starts_nothing(tmp_path) -> None:
    run_dir = tmp_path / "run"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-m", "turnkeep", "run", "--run-dir", str(run_dir), "--set",
                           "model.path=org/missing"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line == (f"turnkeep: model.path = 'org/missing' is not in the Hugging Face cache ({tmp_path / 'hf' / 'hub'})"
                    " and HF_HUB_OFFLINE is set; fetch it with `hf download org/missing`, or set model.path to a "
                    "local folder"), line
    assert not run_dir.exists() and done.stdout == ""


def test_a_local_folder_is_unchanged(tmp_path, hf_home, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)  # a folder here that reads like a hub id is the folder
    for given, kept in (("org/name", Path("org/name")), ("./models/qwen", Path("models/qwen")),
                        ("~/models/qwen", Path("~/models/qwen")), (str(tmp_path / "m"), tmp_path / "m")):
        cfg = _config(tmp_path, path=given)
        assert cfg.model.path == kept and isinstance(cfg.model.path, Path), given
        assert with_model_resolved(cfg) is cfg
    cfg = _config(tmp_path)
    assert cfg.model.path is None and with_model_resolved(cfg) is cfg
    assert ModelConfig(path=Path("a/b")).path == Path("a/b")  # a Path stays a folder


@pytest.mark.parametrize("given", ["./missing/model", "~/turnkeep-no-such/model", "/turnkeep-no-such/model"])
def test_a_folder_that_does_not_exist_keeps_its_error(given, tmp_path, hf_home, capsys) -> None:
    run_dir = tmp_path / "run"
    assert main(["run", "--set", f"run.run_dir={run_dir}", "--set", f"model.path={given}"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    shown = str(Path(given).expanduser())
    assert line.startswith(f"turnkeep: model.path = '{shown}' holds no config.json and no tokenizer.json"), line
    assert not run_dir.exists()
