"""`turnkeep env try`: an environment class and its reward tried alone, on a prompts file, before any run; its
refusals are one line and exit 2. The calculator (the `calc` kind's class) and the example package
(examples/lookup) play scripted turns; the model policy samples a tiny model made for the test."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from turnkeep.cli.env_try import read_turns_file
from turnkeep.cli.main import main

REPO = Path(__file__).resolve().parents[2]
CALC = "turnkeep.envs.calc_env:CalcEnvironment"
CALC_PROMPTS = REPO / "configs" / "prompts" / "calc_sample.jsonl"
LOOKUP = "turnkeep_example_lookup.env:LookupEnvironment"
LOOKUP_PROMPTS = REPO / "examples" / "lookup" / "prompts.jsonl"


@pytest.fixture(autouse=True)
def _example_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("turnkeep_example_lookup") is None:  # not installed (pip install -e examples/lookup)
        monkeypatch.syspath_prepend(str(REPO / "examples" / "lookup" / "src"))


def _try(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main(["env", "try", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _turns(tmp_path: Path, text: str) -> str:
    path = tmp_path / "turns.txt"
    path.write_text(text)
    return str(path)


def _first_record(path: Path) -> dict:
    return json.loads(path.read_text().splitlines()[0])


def test_the_calculator_plays_scripted_turns_and_prints_each_reward(capsys, tmp_path) -> None:
    first = _first_record(CALC_PROMPTS)
    assert (first["prompt"], first["answer"]) == ("Q 89-25+53", 117)  # the turns below are this record's
    turns = _turns(tmp_path, "C 89-25\nC 64+53\nA 117\n\nA 1\n")
    code, out, err = _try(capsys, "--entry", CALC, "--prompts", str(CALC_PROMPTS), "--turns", turns, "--episodes", "2")
    assert code == 0, err
    assert "episode 1 (record 1): question 'Q 89-25+53', answer 117, env 'calc'" in out
    assert "  prompt  'Q 89-25+53\\n'\n  policy  'C 89-25'\n  tool    'R 64\\n'\n  policy  'C 64+53'\n" in out
    assert "  done after 3 turn(s)\n  reward 1.0\n" in out
    assert "episode 2 (record 2)" in out and "  reward 0.0\n" in out  # a guess skips the calculator
    assert out.rstrip().endswith("mean reward 0.5 over 2 episode(s)")


def test_the_example_package_plays_scripted_turns(capsys, tmp_path) -> None:
    first = _first_record(LOOKUP_PROMPTS)
    assert (first["prompt"], first["answer"], first["table"]["b"], first["table"]["a"]) == ("K ba", "58", 5, 8)
    turns = _turns(tmp_path, "L b\nL a\nA 58\n")
    code, out, err = _try(capsys, "--entry", LOOKUP, "--prompts", str(LOOKUP_PROMPTS), "--turns", turns,
                          "--episodes", "1", "--options", '{"keys_per_question": 2}')
    assert code == 0, err
    assert "lookup, stateless" in out
    assert "  policy  'L b'\n  tool    'V 5\\n'\n  policy  'L a'\n  tool    'V 8\\n'\n  policy  'A 58'\n" in out
    assert "  reward 1.0\n" in out and "mean reward 1 over 1 episode(s)" in out


def test_without_a_turns_file_the_class_demonstrations_play(capsys) -> None:
    code, out, err = _try(capsys, "--entry", LOOKUP, "--prompts", str(LOOKUP_PROMPTS), "--episodes", "2")
    assert code == 0, err
    assert "(turns of demonstration 1, written for the prompt 'K " in out
    assert "(turns of demonstration 2, written for the prompt 'K " in out
    assert out.count("  reward ") == 2


def test_a_script_that_ends_first_and_an_episode_cut_at_max_turns_are_said(capsys, tmp_path) -> None:
    short = _turns(tmp_path, "C 89-25\n")
    code, out, _ = _try(capsys, "--entry", CALC, "--prompts", str(CALC_PROMPTS), "--turns", short, "--episodes", "1")
    assert code == 0 and "no turn 2: the policy has no more (the episode is not done)" in out
    code, out, _ = _try(capsys, "--entry", CALC, "--prompts", str(CALC_PROMPTS), "--turns", short, "--episodes", "1",
                        "--max-turns", "1")
    assert code == 0 and "not done after max turns (1)" in out and "  reward 0.0\n" in out


def test_a_turns_file_reads_json_lines_and_blank_lines_between_episodes(tmp_path) -> None:
    path = tmp_path / "turns.txt"
    path.write_text('L a\r\n"two\\nlines"\n\n\nA 1\n')
    assert read_turns_file(path) == [["L a", "two\nlines"], ["A 1"]]


def _one_line_refusal(capsys, *args: str, says: str) -> None:
    code, out, err = _try(capsys, *args)
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("turnkeep env try: "), err
    assert says in err, err


def test_an_entry_that_does_not_load_is_one_line(capsys) -> None:
    _one_line_refusal(capsys, "--entry", "no_such_package.envs:Env", "--prompts", str(CALC_PROMPTS),
                      says="module 'no_such_package.envs' does not import")
    _one_line_refusal(capsys, "--entry", "turnkeep.envs.calc_env:Nothing", "--prompts", str(CALC_PROMPTS),
                      says="has no attribute 'Nothing'")
    _one_line_refusal(capsys, "--entry", "turnkeep.envs.calc_env", "--prompts", str(CALC_PROMPTS),
                      says='use the form "package.module:ClassName"')


def test_bad_options_are_one_line(capsys) -> None:
    _one_line_refusal(capsys, "--entry", LOOKUP, "--prompts", str(LOOKUP_PROMPTS), "--options",
                      '{"keys_per_question": 9}', says="LookupEnvironment refuses its options (keys_per_question")
    _one_line_refusal(capsys, "--entry", LOOKUP, "--prompts", str(LOOKUP_PROMPTS), "--options", "{oops",
                      says="--options is not JSON")
    _one_line_refusal(capsys, "--entry", LOOKUP, "--prompts", str(LOOKUP_PROMPTS), "--options", "[1]",
                      says="give a JSON object")


def test_a_prompts_file_with_a_bad_record_is_one_line(capsys, tmp_path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Q 1+2", "answer": 3}\n{"prompt": "Q 1+2", "answer": 3\n')
    _one_line_refusal(capsys, "--entry", CALC, "--prompts", str(prompts), says=f"{prompts} line 2: not valid JSON")
    prompts.write_text('{"prompt": "Q 1+2", "env": 7}\n')
    _one_line_refusal(capsys, "--entry", CALC, "--prompts", str(prompts), says='line 1: "env" is a number')
    prompts.write_text('{"prompt": "K ab", "env": "lookup"}\n')
    _one_line_refusal(capsys, "--entry", CALC, "--prompts", str(prompts),
                      says="no record is for environment 'calc' (the records name lookup); pass --name")
    _one_line_refusal(capsys, "--entry", CALC, "--prompts", str(tmp_path / "absent.jsonl"),
                      says="prompts file does not exist")


def test_turns_it_cannot_use_are_one_line(capsys, tmp_path) -> None:
    _one_line_refusal(capsys, "--entry", CALC, "--prompts", str(CALC_PROMPTS),
                      says="CalcEnvironment offers no demonstrations; give the policy's turns with --turns FILE")
    _one_line_refusal(capsys, "--entry", CALC, "--prompts", str(CALC_PROMPTS), "--turns", str(tmp_path / "none.txt"),
                      says="no such file")
    _one_line_refusal(capsys, "--entry", CALC, "--prompts", str(CALC_PROMPTS), "--turns", _turns(tmp_path, "\n\n"),
                      says="holds no turn")
    _one_line_refusal(capsys, "--entry", CALC, "--prompts", str(CALC_PROMPTS), "--turns", _turns(tmp_path, '"x\n'),
                      says="line 1: starts with '\"' but is not a JSON string")
    _one_line_refusal(capsys, "--entry", CALC, "--prompts", str(CALC_PROMPTS), "--policy", "model", "--turns",
                      _turns(tmp_path, "A 1\n"), says="--turns is for --policy scripted")


def test_a_count_below_one_is_refused_by_the_parser(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["env", "try", "--entry", CALC, "--prompts", str(CALC_PROMPTS), "--episodes", "0"])
    assert exited.value.code == 2 and "--episodes: 0: give 1 or more" in capsys.readouterr().err


BROKEN = '''
from turnkeep import Environment, StepResult

class Broken(Environment):
    kind = "broken"
    recovery_mode = "restart_only"

    def __init__(self, problem, ctx):
        self.problem = problem

    def prompt(self):
        return self.problem.question + "\\n"

    async def step(self, turn_text):
        raise RuntimeError("the tool is down")

    def reward(self):
        return 0.0
'''


def test_what_the_class_raises_while_it_plays_is_shown_with_its_traceback(capsys, tmp_path, monkeypatch) -> None:
    (tmp_path / "broken_env.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = _try(capsys, "--entry", "broken_env:Broken", "--prompts", str(CALC_PROMPTS), "--turns",
                          _turns(tmp_path, "C 1+1\n"))
    assert code == 1
    assert "Traceback" in err and "RuntimeError: the tool is down" in err
    assert err.rstrip().endswith("turnkeep env try: Broken raised while playing (the traceback above)")
    assert "  policy  'C 1+1'" in out


def test_scripted_turns_need_no_trainer_package(tmp_path) -> None:
    """A host with a plain install (no torch, transformers or Ray) tries its environment with scripted turns."""
    turns = _turns(tmp_path, "A 117\n")
    code = ("import sys\nfrom turnkeep.cli.main import main\n"
            f"argv = ['env', 'try', '--entry', {CALC!r}, '--prompts', {str(CALC_PROMPTS)!r}, '--turns', {turns!r}]\n"
            "assert main(argv) == 0\nheavy = sorted({'torch', 'transformers', 'ray', 'vllm'} & set(sys.modules))\n"
            "assert not heavy, heavy\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "reward 0.0" in done.stdout


def test_the_model_policy_samples_turns_from_a_tiny_model(capsys, tmp_path) -> None:
    """The model of `--config` / `--set` (here a tiny model made for the test, cached under tmp_path) samples the
    turns through its chat template; what it says is random, the episode's shape is not."""
    settings = {"model.cache_dir": str(tmp_path / "models"), "model.tiny.hidden_size": 32, "model.tiny.num_layers": 1,
                "model.tiny.num_heads": 1, "model.tiny.head_dim": 32, "model.tiny.intermediate_size": 32,
                "model.tiny.warm_start_steps": 2, "model.tiny.warm_start_batch_size": 2, "rollout.max_turns": 2}
    sets = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    code, out, err = _try(capsys, "--entry", CALC, "--prompts", str(CALC_PROMPTS), "--policy", "model",
                          "--episodes", "1", *sets)
    assert code == 0, err
    assert f"sampling from {tmp_path / 'models'}" in out
    assert "  prompt  'Q 89-25+53\\n'\n  policy  " in out and "  reward " in out
