"""Every `turnkeep` command the README and docs/ show (in code blocks, and inline in the README) is one the CLI
accepts as written: its flags parse, and its config with every `--set` loads (inline ones too, where they have
arguments). The `temporal` commands are run for
real by tests/test_readme_temporal_commands.py, the Slurm script by tests/docs/test_slurm_example.py, the two
set-up commands by CI itself; `RUN_FOR_REAL` names the test that runs each `turnkeep` command the pages show (a whole
run or a benchmark is too long for the suite: the tests run them with a small --steps, or parse them as `--help`
would). The Python and TOML snippets run in tests/test_readme_environment.py."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from turnkeep.cli.main import _build_parser
from turnkeep.config.loader import ConfigError, load_config, parse_overrides

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PREFIXES = {"turnkeep": [], ".venv/bin/turnkeep": [], ".venv-gpu/bin/turnkeep": [], "bash scripts/run.sh": ["run"]}
SHOWN_TO_FAIL = {"train.lrr=1e-3": "unknown key 'train.lrr'"}
"""A command shown with the refusal it gets: it must still be refused with that message."""
RUN_FOR_REAL = {
    "run": ("tests/examples/test_lookup.py", "the shown `--config examples/lookup/config.toml` with --steps 3; the "
            "other runs are whole runs (minutes to hours): parsed and their configs loaded here, and the default "
            "config runs with small --steps in tests/workers/test_controller_crash.py"),
    "env": ("tests/test_readme_environment.py", "the shown `env try` command, for real, on the README's class"),
    "env-server": ("tests/test_env_server_install.py", "an env-server started from an install without extras"),
    "status": ("tests/workers/test_controller_crash.py", "`status --json` against a live and a killed run"),
    "scale": ("tests/workers/test_engines.py", "`scale --run-dir ... --engines N` against a live run"),
    "plot": ("tests/cli/test_plot.py", "`plot` of a run directory"),
    "export": ("tests/workers/test_export.py", "`export --run-dir ... --out ...` of one- and two-rank checkpoints, "
               "and its refusals"),
    "chaos": ("tests/chaos/test_runner.py", "a chaos run with a few kills and a small --steps; --recheck in "
              "tests/chaos/test_recheck.py"),
    "bench": ("tests/cli/test_bench_pass.py", "benchmarks take minutes to hours: parsed here and in that file (as "
              "`--help` would), each benchmark's pieces run in tests/bench/"),
    "model": ("tests/workers/test_gguf_model.py", "`model get` of a GGUF file the test writes and `model list`; the "
              "packaged SmolLM2 in tests/workers/test_real_model.py"),
    "eval": ("tests/cli/test_eval.py", "`eval --model` of a tiny model on a prompts file; `eval --run-dir` against a "
             "live run in tests/workers/test_evaluations.py"),
}
"""Where each shown command's verb runs as a process or through `main` (beyond the parse here), or why not."""


def shown_commands() -> list[tuple[str, str]]:
    """(page, command) for every command line of a code block, and every inline `turnkeep ...` with its arguments."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for block in _code_blocks(text):
            if "├─" in block:
                continue  # the picture of the processes
            for line in block.replace("\\\n", " ").splitlines():
                line = line.removeprefix("$ ").split("  #", 1)[0].strip()
                if any(line.startswith(prefix + " ") or line == prefix for prefix in PREFIXES):
                    found.append((page.name, line))
        found += [(page.name, cmd) for cmd in re.findall(r"`(turnkeep [a-z-]+ [^`<]+)`", text) if "..." not in cmd]
    return found


def _code_blocks(text: str) -> list[str]:
    blocks, current = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def _argv(command: str) -> list[str]:
    for prefix, implied in PREFIXES.items():
        if command == prefix or command.startswith(prefix + " "):
            return [*implied, *shlex.split(command[len(prefix):])]
    raise AssertionError(command)


def test_the_pages_show_commands() -> None:
    commands = {command for _, command in shown_commands()}
    assert any(c.startswith("bash scripts/run.sh") for c in commands)
    assert any(c.startswith("turnkeep scale") for c in commands) and any("env-server" in c for c in commands)


@pytest.mark.parametrize(("page", "command"), shown_commands())
def test_every_shown_command_says_where_it_runs_for_real(page: str, command: str) -> None:
    verb = _argv(command)[0]
    assert verb in RUN_FOR_REAL, f"{page}: `{command}`: say in RUN_FOR_REAL which test runs `turnkeep {verb}`"
    test_file = ROOT / RUN_FOR_REAL[verb][0]
    text = test_file.read_text() if test_file.is_file() else ""
    assert f'"{verb}"' in text or f"turnkeep {verb} " in text, (verb, test_file)


@pytest.mark.parametrize(("page", "command"), shown_commands())
def test_a_shown_command_is_one_the_cli_accepts(page: str, command: str) -> None:
    argv = _argv(command)
    try:
        args = _build_parser().parse_args(argv)
    except SystemExit as exit_:
        raise AssertionError(f"{page}: `{command}` does not parse (exit {exit_.code})") from None
    if args.command not in ("run", "chaos"):
        return
    refusal = next((message for setting, message in SHOWN_TO_FAIL.items() if setting in args.set), None)
    config = args.config if args.config.is_absolute() else ROOT / args.config
    try:
        load_config(config, parse_overrides(args.set))
    except ConfigError as err:
        assert refusal is not None and refusal in str(err), f"{page}: `{command}`: {err}"
        return
    assert refusal is None, f"{page}: `{command}` is shown refused, and was accepted"


def test_the_readme_is_a_guide_and_every_link_stays_in_the_repository() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.split()) <= 3000  # the guide; the reference is in docs/
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            resolved = (page.parent / target).resolve()
            assert resolved.is_relative_to(ROOT) and resolved.exists(), f"{page.name}: link to {target}"


def test_every_figure_the_readme_takes_from_benchmarks_md_is_there() -> None:
    """A paragraph that cites BENCHMARKS.md quotes its figures as the bench pass wrote them."""
    benchmarks = (ROOT / "BENCHMARKS.md").read_text()
    pieces = re.split(r"\n\n|\n- ", (ROOT / "README.md").read_text())  # paragraphs and list items
    paragraphs = [p for p in pieces if "BENCHMARKS.md, `" in p]
    assert paragraphs
    for paragraph in paragraphs:
        for figure in re.findall(r"(?<![\w.,`])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d{2,})(?![\w`])", paragraph):
            assert figure in benchmarks, f"{figure} (in: {paragraph[:80]}...) is not in BENCHMARKS.md"
