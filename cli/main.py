"""`turnkeep`: the command line. Each command is a module of `cli/` with its parser and what it runs."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable

from turnkeep.cli.version import installed_version

COMMANDS = {
    "run": ("turnkeep.cli.run:add_run_parser", "turnkeep.cli.run:run_run"),
    "chaos": ("turnkeep.cli.chaos:add_chaos_parser", "turnkeep.chaos.runner:run_chaos"),
    "bench": ("turnkeep.cli.bench:add_bench_parser", "turnkeep.cli.bench:run_bench"),
    "env-server": ("turnkeep.cli.env_server:add_env_server_parser", "turnkeep.cli.env_server:run_env_server"),
    "env": ("turnkeep.cli.env_try:add_env_parser", "turnkeep.cli.env_try:run_env"),
    "status": ("turnkeep.cli.status:add_status_parser", "turnkeep.cli.status:run_status"),
    "scale": ("turnkeep.cli.scale:add_scale_parser", "turnkeep.cli.scale:run_scale"),
    "plot": ("turnkeep.cli.plot:add_plot_parser", "turnkeep.cli.plot:run_plot"),
    "config-docs": ("turnkeep.cli.config_docs:add_config_docs_parser", "turnkeep.cli.config_docs:run_config_docs"),
    "make-model": ("turnkeep.cli.make_model:add_make_model_parser", "turnkeep.cli.make_model:run_make_model"),
    "model": ("turnkeep.cli.model:add_model_parser", "turnkeep.cli.model:run_model"),
    "eval": ("turnkeep.cli.eval:add_eval_parser", "turnkeep.cli.eval:run_eval"),
    "export": ("turnkeep.cli.export:add_export_parser", "turnkeep.cli.export:run_export"),
}
"""Each command's parser and what it runs (given the parsed arguments; `args.argv` is the command line), as
`module:function`. Named, not imported: a command loads only its own modules, so `turnkeep env-server` starts on a
host that only serves environments (no torch, Ray or vLLM there) and does not pay for the run's imports."""


EXTRAS_PACKAGES = frozenset({"torch", "ray", "vllm", "transformers", "safetensors"})
"""What pyproject's `trainer`, `cpu` and `gpu` extras install: a host that only serves environments has none."""


def _load(target: str) -> Callable:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of the command `argv` names (every command's when it names none it knows: `turnkeep --help`)."""
    parser = argparse.ArgumentParser(prog="turnkeep", description=__doc__.split(".")[0])
    parser.add_argument("--version", action="version", version=f"turnkeep {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    named = [argv[0]] if argv and argv[0] in COMMANDS else [] if argv == ["--version"] else list(COMMANDS)
    for command in named:
        _load(COMMANDS[command][0])(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(argv if argv is not None else sys.argv[1:])
    args = _build_parser(argv).parse_args(argv)
    args.argv = argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return _load(COMMANDS[args.command][1])(args)
    except ModuleNotFoundError as err:
        if (line := _missing_extra(args.command, err)) is None:
            raise
        print(line, file=sys.stderr)
        return 2


def _missing_extra(command: str, err: ModuleNotFoundError) -> str | None:
    """The one-line error for a command run where an extra's package is not installed (None: not one of those)."""
    missing = (err.name or "").split(".")[0]
    if missing not in EXTRAS_PACKAGES:
        return None
    return (f"turnkeep {command}: this install has no {missing} (only `turnkeep env-server` and `turnkeep env try` "
            "with scripted turns run without the trainer and engines); install them: pip install 'turnkeep[cpu]' "
            "('turnkeep[gpu]' on a GPU machine)")


QUICK_EXIT_COMMANDS = frozenset({"status", "scale", "eval"})
"""Short-lived commands that leave without the interpreter's finalization. `status`, `scale` and `eval --run-dir`
talk to Temporal; a call still on the client's Rust threads while Python finalizes makes Python abort the process
("Fatal Python error: PyGILState_Release", SIGABRT) after the answer was already printed (seen with `scale` refusing
a count, and with `eval --run-dir` after its signal)."""


def entry() -> None:
    """The `turnkeep` command (and `python -m turnkeep`); `main` stays callable in-process."""
    code = main()
    if len(sys.argv) > 1 and sys.argv[1] in QUICK_EXIT_COMMANDS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
