"""`turnkeep eval --model DIR`: a model scored on held-out problems by the run's own policy server, environments
and agent loop, with no training; what it cannot score is refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from turnkeep.cli.main import main
from turnkeep.envs.calc_task import CalcProblems
from turnkeep.primitives.pass_at_k import pass_at_k
from turnkeep.schemas.config import TaskConfig


def test_a_config_with_no_held_out_problems_and_no_prompts_is_refused_in_one_line(tmp_path, capsys) -> None:
    model = tmp_path / "model"
    model.mkdir()
    settings = ["--set", f"run.run_dir={tmp_path / 'run'}"]
    assert main(["eval", "--model", str(model), *settings]) == 2
    assert capsys.readouterr().err.strip().endswith("holds no config.json and no tokenizer.json. Point model.path at "
                                                    "a Hugging Face model directory (config.json, weights, "
                                                    "tokenizer.json), or remove model.path to use the made-up tiny "
                                                    "model.")
    for name in ("config.json", "tokenizer.json"):
        (model / name).write_text("{}")
    assert main(["eval", "--model", str(model), *settings]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("turnkeep eval: no held-out problems: the config has no tool_chat environment with reasoning_gym "
                   "tasks and no environment with a held-out dataset; give --prompts FILE (or eval.prompts)"), err
    assert main(["eval", "--model", str(model), "--samples", "0", *settings]) == 2
    assert "--samples and --limit must be at least 1" in capsys.readouterr().err


@pytest.mark.integration
def test_the_tiny_model_is_scored_on_a_prompts_file_with_pass_at_k(stack_config, tmp_path) -> None:
    from turnkeep.workers.model_maker import tiny_model_dir

    model = tiny_model_dir(stack_config)
    problems = CalcProblems(TaskConfig(), seed=123)
    prompts = tmp_path / "heldout.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": r.prompt, "answer": r.answer, "env": "calc"}) + "\n"
                               for r in map(problems.record, range(6))))
    out = tmp_path / "eval.json"
    done = subprocess.run(
        [sys.executable, "-m", "turnkeep", "eval", "--model", str(model), "--prompts", str(prompts), "--samples", "4",
         "--out", str(out), "--set", f"run.run_dir={tmp_path / 'run'}", "--set", "policy.max_num_seqs=32"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (result["prompts"], result["samples"], len(result["correct"])) == (6, 4, 6)
    # The session's tiny model is barely warm-started (its reward is about 0.05 here), so no figure is asserted,
    # only what holds for any model: the counts, and pass@k from the per-prompt counts the result lists.
    passes = [result["pass_at"][k] for k in ("1", "2", "4")]
    assert all(0 <= c <= 4 for c in result["correct"]) and 0.0 <= passes[0] <= passes[1] <= passes[2] <= 1.0
    assert passes == pytest.approx([pass_at_k(result["correct"], 4, k) for k in (1, 2, 4)])
    assert passes[0] == pytest.approx(sum(result["correct"]) / 24)  # pass@1 is the share of correct samples
    assert result["mean_reward"] >= passes[0] - 1e-9  # a correct sample has reward 1; others may have some
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("eval: 6 prompts x 4 samples: mean reward") and "pass@4" in line, done.stdout[-2000:]
