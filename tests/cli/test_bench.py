"""`turnkeep bench markdown`: the results in --out replace their sections; the others stay as they were."""

from __future__ import annotations

import pytest

from turnkeep.bench.report import BenchResult, write_result
from turnkeep.cli.bench import render_markdown

PREVIOUS = """# Benchmarks

Old head.

## overhead

| old overhead table |

Command: `turnkeep bench overhead --out old`

## wasted

| old wasted table |

- an old note

Command: `turnkeep bench wasted --out old`
"""


def test_a_result_replaces_its_section_and_the_others_are_kept_in_order(tmp_path):
    write_result(tmp_path, BenchResult(name="scaling", table="| new scaling |", notes=["flat"], data={}),
                 "turnkeep bench scaling --out new")
    write_result(tmp_path, BenchResult(name="overhead", table="| new overhead |", notes=[], data={}),
                 "turnkeep bench overhead --out new")
    text = render_markdown(tmp_path, PREVIOUS)
    assert "old overhead table" not in text and "| new overhead |" in text
    assert "| old wasted table |\n\n- an old note\n\nCommand: `turnkeep bench wasted --out old`" in text
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == ["## overhead", "## wasted", "## scaling"]  # the benchmarks' own order
    assert text.startswith("# Benchmarks\n") and "Old head." not in text


def test_no_result_at_all_is_refused_and_names_the_command(tmp_path):
    with pytest.raises(SystemExit, match="run `turnkeep bench <name>` first"):
        render_markdown(tmp_path, PREVIOUS)


def test_a_stray_json_is_skipped_and_a_damaged_result_is_named(tmp_path, capsys):
    write_result(tmp_path, BenchResult(name="overhead", table="| new overhead |", notes=[], data={}),
                 "turnkeep bench overhead --out new")
    (tmp_path / "notes.json").write_bytes(b'{"mine": 1}')
    text = render_markdown(tmp_path, PREVIOUS)
    assert "| new overhead |" in text and "mine" not in text
    assert "skipped" in capsys.readouterr().err
    (tmp_path / "wasted.json").write_bytes(b'{"table": "| half written')
    with pytest.raises(SystemExit, match=r"wasted.json is not a result of `turnkeep bench wasted` \(not JSON"):
        render_markdown(tmp_path, PREVIOUS)
    (tmp_path / "wasted.json").write_bytes(b'{"table": "| t |"}')
    with pytest.raises(SystemExit, match=r"\(no command, machine, notes\); run that command again"):
        render_markdown(tmp_path, PREVIOUS)


def test_a_folder_that_is_no_pass_keeps_the_sentence_naming_the_pass_of_the_sections_it_keeps(tmp_path):
    passed = "The sections of overhead, wasted come from one pass, `turnkeep bench all`, at commit abc: 3 minutes."
    previous = PREVIOUS.replace("Old head.", f"Old head.\n\n{passed}")
    write_result(tmp_path, BenchResult(name="scaling", table="| new scaling |", notes=[], data={}),
                 "turnkeep bench scaling --out new")
    text = render_markdown(tmp_path, previous)
    assert passed in text.split("\n## ", 1)[0] and "| new scaling |" in text
    assert passed not in render_markdown(tmp_path, PREVIOUS)  # nothing to keep: no sentence is made up

