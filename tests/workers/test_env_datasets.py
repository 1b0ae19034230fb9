"""Prompts from the environments' own datasets (`workers/env_datasets.py`): used when the run has no prompts file,
interleaved across environments, each record named with its environment; the held-out split feeds evaluations."""

from __future__ import annotations

from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.workers.env_datasets import environment_datasets
from turnkeep.workers.eval_problems import eval_problems, run_eval_problems
from turnkeep.workers.prompts import prompt_source

ENTRY = "tests.envs.user_envs"


def _config(**environments: str) -> TurnkeepConfig:
    return TurnkeepConfig.model_validate({"environments": {
        name: {"kind": "python", "entry": f"{ENTRY}:{cls}"} for name, cls in environments.items()}})


def test_the_environments_rows_are_the_prompts_interleaved_and_named() -> None:
    cfg = _config(a="WithDataset", b="WithDataset", plain="Echo")
    source = prompt_source(cfg)
    records = [source.record(i) for i in range(source.size)]
    assert [(r.env, r.prompt) for r in records] == [("a", "q0"), ("b", "q0"), ("a", "q1"), ("b", "q1"),
                                                     ("a", "q2"), ("b", "q2")]
    assert records[2].metadata == {"row": 1} and source.path is None and len(source.digest) == 64
    # The digest follows the rows: a restore over another dataset is refused as for a prompts file.
    assert environment_datasets(_config(a="WithDataset"), "train").digest != source.digest


def test_the_held_out_rows_are_what_an_evaluation_plays_and_no_dataset_falls_back() -> None:
    cfg = _config(a="WithDataset")
    [problem] = eval_problems(cfg, None, None)
    assert (problem.question, problem.env, problem.metadata) == ("held", "a", {"row": "h0"})
    assert environment_datasets(_config(plain="Echo"), "train") is None
    assert type(prompt_source(_config(plain="Echo"))).__name__ == "CalcProblems"


def test_a_runs_evaluations_play_the_held_out_rows_and_none_without_a_source() -> None:
    [problem] = run_eval_problems(_config(a="WithDataset"))
    assert (problem.question, problem.env) == ("held", "a")
    assert run_eval_problems(_config(plain="Echo")) == []
