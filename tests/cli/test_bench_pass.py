"""`turnkeep bench all`: every benchmark once into one --out, then BENCHMARKS.md from that folder alone."""

from __future__ import annotations

from pathlib import Path

from turnkeep.bench.report import BenchResult, write_result
from turnkeep.cli.bench import BENCHMARKS
from turnkeep.cli.bench_pass import PASS_ARGS, bench_pass
from turnkeep.cli.main import _build_parser, main


def test_the_pass_runs_every_benchmark_with_arguments_its_parser_takes():
    assert list(PASS_ARGS) == list(BENCHMARKS)  # none left out, in the order the markdown shows them
    for name, args in PASS_ARGS.items():
        parsed = _build_parser().parse_args(["bench", name, "--out", "x", *args])
        assert parsed.bench == name


class StandInBenchmarks:
    """Each benchmark writes a one-line result at once, except those told to fail; markdown is the real command."""

    def __init__(self, failing: set[str] = frozenset()):
        self.failing = failing
        self.ran: list[str] = []

    def __call__(self, command: list[str]) -> int:
        _, name, _, out, *_ = command
        self.ran.append(name)
        if name == "markdown":
            return main(command)
        if name in self.failing:
            (Path(out) / ("chaos" if name == "recovery" else name)).mkdir(parents=True)  # runs it left behind
            return 1
        write_result(Path(out), BenchResult(name=name, table=f"| {name} figures |", notes=[], data={}),
                     "turnkeep " + " ".join(command))
        return 0


def test_a_whole_pass_writes_every_section_and_names_itself_in_the_head(tmp_path):
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# Benchmarks\n\n## overhead\n\n| an older overhead |\n")
    benchmarks = StandInBenchmarks()
    assert bench_pass(tmp_path / "out", markdown, run_one=benchmarks) == 0
    assert benchmarks.ran == [*BENCHMARKS, "markdown"]
    text = markdown.read_text()
    assert "an older overhead" not in text
    assert all(f"| {name} figures |" in text for name in BENCHMARKS)
    assert "come from one pass, `turnkeep bench all`, at commit " in text
    assert "failed in that pass" not in text


def test_a_failing_benchmark_leaves_the_others_running_and_the_markdown_unwritten(tmp_path, capsys):
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("kept as it was\n")
    out = tmp_path / "out"
    benchmarks = StandInBenchmarks(failing={"recovery"})
    assert bench_pass(out, markdown, run_one=benchmarks) == 1
    assert benchmarks.ran == list(BENCHMARKS)  # every one ran; no markdown
    assert markdown.read_text() == "kept as it was\n"
    assert "recovery failed" in (err := capsys.readouterr().err)
    assert f"`turnkeep bench all --out {out} --only recovery`" in err
    # Completed as it says: the failed try's runs are set aside, and the pass keeps the others' records.
    benchmarks.failing = set()
    assert bench_pass(out, markdown, ["recovery"], run_one=benchmarks) == 0
    assert not (out / "chaos").exists() and [p.name[:6] for p in (out / "set-aside").iterdir()] == ["chaos-"]
    text = markdown.read_text()
    assert all(f"| {name} figures |" in text for name in BENCHMARKS) and "failed in that pass" not in text
    assert "come from one pass, `turnkeep bench all`, at commit " in text and "overhead 0.0" in text


def test_only_runs_the_named_benchmarks_in_the_pass_order(tmp_path):
    parsed = _build_parser().parse_args(["bench", "all", "--only", "ranks,overhead", "--out", str(tmp_path)])
    benchmarks = StandInBenchmarks()
    assert bench_pass(parsed.out, tmp_path / "B.md", parsed.only, run_one=benchmarks) == 0
    assert benchmarks.ran == ["overhead", "ranks", "markdown"]


def test_every_benchmark_has_its_row_in_the_docs_table():
    page = (Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md").read_text()
    assert [name for name in BENCHMARKS if f"| `{name}` |" not in page] == []
