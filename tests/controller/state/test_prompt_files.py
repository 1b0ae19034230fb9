import json
from pathlib import Path

import pyarrow
import pyarrow.parquet
import pytest

from turnkeep.config.loader import ConfigError, load_config
from turnkeep.controller.state.prompt_files import (
    PromptFileError,
    PromptRecord,
    check_prompt_file,
    load_prompt_file,
    records_digest,
)
from turnkeep.envs.calc_task import expected_calls, parse_question
from turnkeep.schemas.config import TurnkeepConfig

REPO = Path(__file__).resolve().parents[3]
ENVS = ("calc", "judge")


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    # Columns are shared, so a field a row lacks is a null cell (from_pylist would keep the first row's keys only).
    columns = list(dict.fromkeys(key for row in rows for key in row))
    pyarrow.parquet.write_table(pyarrow.Table.from_pydict({key: [row.get(key) for row in rows] for key in columns}),
                                path)
    return path


def single_line_error(path: Path, env_names=ENVS) -> str:
    with pytest.raises(PromptFileError) as err:
        load_prompt_file(path, env_names)
    message = str(err.value)
    assert "\n" not in message, message
    assert str(path) in message
    return message


def test_records_keep_prompt_answer_env_and_the_other_fields_as_metadata(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [
        '{"prompt": "Q 1+2", "answer": 3}',
        "",  # blank lines are skipped
        '{"prompt": "Q 2*3", "answer": "6", "env": "judge", "id": "x", "tags": ["a", 1], "extra": null}',
        '{"prompt": "say hi", "answer": 0.5}',
        '{"prompt": "free text"}',
    ])
    records = load_prompt_file(path, ENVS)
    assert records == [
        PromptRecord(prompt="Q 1+2", answer=3),
        PromptRecord(prompt="Q 2*3", answer="6", env="judge", metadata={"id": "x", "tags": ["a", 1], "extra": None}),
        PromptRecord(prompt="say hi", answer=0.5),
        PromptRecord(prompt="free text"),
    ]
    assert type(records[0].answer) is int


@pytest.mark.parametrize(("lines", "line", "says"), [
    (['{"prompt": "Q 1+2", "answer": 3}', '{"prompt": "Q 1+2", answer: 3}'], 2, "not valid JSON"),
    (['{"prompt": "Q 1+2"}', "", '["Q 1+2", 3]'], 3, "a JSON array, not an object"),
    (['"Q 1+2"'], 1, "a string, not an object"),
    (['{"answer": 3}'], 1, 'no "prompt" field'),
    (['{"prompt": "", "answer": 3}'], 1, '"prompt" is empty'),
    (['{"prompt": "   "}'], 1, '"prompt" is empty'),
    (['{"prompt": null}'], 1, '"prompt" is null, not a string'),
    (['{"prompt": 12}'], 1, '"prompt" is a number, not a string'),
    (['{"prompt": "a"}', '{"prompt": "b", "answer": [1, 2]}'], 2, '"answer" is a JSON array'),
    (['{"prompt": "a", "answer": {"x": 1}}'], 1, '"answer" is a JSON object'),
    (['{"prompt": "a", "answer": true}'], 1, '"answer" is a boolean'),
    (['{"prompt": "a", "answer": NaN}'], 1, "not JSON-able"),
    (['{"prompt": "a", "score": Infinity}'], 1, "field 'score'"),
    (['{"prompt": "a", "env": "lab"}'], 1, "\"env\" = 'lab' is not in [environments] (configured: calc, judge)"),
    (['{"prompt": "a", "env": 3}'], 1, '"env" is a number'),
])
def test_a_bad_record_is_named_by_file_and_line_with_the_fix(tmp_path, lines, line, says):
    path = write_jsonl(tmp_path / "p.jsonl", lines)
    message = single_line_error(path)
    assert f"{path} line {line}:" in message
    assert says in message
    assert ";" in message  # the fix follows the problem


def test_line_numbers_count_blank_lines_and_crlf_line_ends(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "a"}\r\n\r\n  \n{"prompt": ""}\r\n')
    assert f"{path} line 4:" in single_line_error(path)


def test_bytes_that_are_not_utf8_are_named_by_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "\xff"}\n')
    assert f"{path} line 2: not UTF-8" in single_line_error(path)


def test_missing_empty_and_unknown_files_are_refused_in_one_line(tmp_path):
    assert "does not exist" in single_line_error(tmp_path / "nope.jsonl")
    assert "not a regular file" in single_line_error(tmp_path)
    (tmp_path / "empty.jsonl").write_text("")
    assert "holds no records" in single_line_error(tmp_path / "empty.jsonl")
    write_jsonl(tmp_path / "blank.jsonl", ["", "   "])
    assert "holds no records" in single_line_error(tmp_path / "blank.jsonl")
    write_jsonl(tmp_path / "p.csv", ["prompt,answer"])
    message = single_line_error(tmp_path / "p.csv")
    assert "unknown prompts file type '.csv'" in message and ".jsonl, .parquet" in message
    (tmp_path / "bad.parquet").write_text("not parquet")
    assert "not a readable parquet file" in single_line_error(tmp_path / "bad.parquet")
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist([], schema=pyarrow.schema([("prompt", pyarrow.string())])),
                                tmp_path / "none.parquet")
    assert "holds no records" in single_line_error(tmp_path / "none.parquet")


def test_a_prompt_file_error_is_a_config_error(tmp_path):
    # The CLI already turns a ConfigError into one message and exit code 2 before anything starts.
    with pytest.raises(ConfigError):
        load_prompt_file(tmp_path / "nope.jsonl", ENVS)


RECORDS = [
    {"prompt": "Q 1+2", "answer": 3, "difficulty": 1},
    {"prompt": "Q 5-4", "answer": 1, "env": "judge"},
    {"prompt": "Q 7*6", "answer": 42, "difficulty": 3, "tags": ["mul"]},
]


def test_parquet_and_jsonl_give_the_same_records_and_digest(tmp_path):
    jsonl = write_jsonl(tmp_path / "p.jsonl", [json.dumps(record) for record in RECORDS])
    parquet = write_parquet(tmp_path / "p.parquet", RECORDS)  # a null cell reads back as an absent field
    from_jsonl, from_parquet = load_prompt_file(jsonl, ENVS), load_prompt_file(parquet, ENVS)
    assert from_jsonl == from_parquet
    assert records_digest(from_jsonl) == records_digest(from_parquet)
    assert records_digest(from_jsonl[:2]) != records_digest(from_jsonl)


def test_a_bad_parquet_row_is_named_by_row(tmp_path):
    rows = [{"prompt": "Q 1+2", "env": None}, {"prompt": "Q 2+3", "env": "lab"}]
    write_parquet(tmp_path / "p.parquet", rows)
    assert f"{tmp_path / 'p.parquet'} row 2:" in single_line_error(tmp_path / "p.parquet")
    rows = [{"prompt": "Q 1+2"}, {"prompt": None}]
    write_parquet(tmp_path / "q.parquet", rows)
    assert f"{tmp_path / 'q.parquet'} row 2: no \"prompt\" field" in single_line_error(tmp_path / "q.parquet")


def test_a_parquet_cell_that_is_not_json_able_is_refused(tmp_path):
    rows = [{"prompt": "Q 1+2", "blob": b"\x00\x01"}]
    write_parquet(tmp_path / "p.parquet", rows)
    message = single_line_error(tmp_path / "p.parquet")
    assert "row 1: field 'blob'" in message and "not JSON-able" in message


def test_check_prompt_file_checks_against_the_configured_environments(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", ['{"prompt": "Q 1+2", "answer": 3, "env": "judge"}'])
    check_prompt_file(TurnkeepConfig())  # no prompts file: nothing to check
    with pytest.raises(PromptFileError, match="not in \\[environments\\] \\(configured: calc\\)"):
        check_prompt_file(TurnkeepConfig.model_validate({"data": {"train": str(path)}}))
    check_prompt_file(TurnkeepConfig.model_validate({
        "data": {"train": str(path)},
        "environments": {"calc": {}, "judge": {"kind": "judge"}},
    }))


def test_the_example_config_loads_and_its_prompts_are_calc_questions_with_right_answers(monkeypatch):
    monkeypatch.chdir(REPO)  # data.train is relative to the working directory
    cfg = load_config(REPO / "configs" / "calc_prompts.toml")
    assert cfg.data.train == Path("configs/prompts/calc_sample.jsonl")
    assert cfg.run.run_dir == Path("runs/calc_prompts")
    check_prompt_file(cfg)
    records = load_prompt_file(cfg.data.train, cfg.environments.keys())
    assert len(records) >= 30
    for record in records:
        # The calc environment shows `question + "\n"` and scores against the int answer.
        assert record.prompt.startswith("Q ") and not record.prompt.endswith("\n")
        operands, ops = parse_question(record.prompt)
        assert len(operands) == cfg.task.num_operands and set(ops) <= set(cfg.task.operators)
        assert max(operands) <= cfg.task.max_operand
        calls = expected_calls(_as_problem(record))
        assert type(record.answer) is int
        assert record.answer == _result_of(calls)


def _as_problem(record: PromptRecord):
    from turnkeep.schemas.rollout import Problem

    return Problem(question=record.prompt, answer=record.answer)


def _result_of(calls) -> int:
    from turnkeep.envs.calc_task import apply_op

    last = calls[-1]
    return apply_op(last.a, last.op, last.b)
