"""`turnkeep`: the command line. Each command is a module of `cli/` with its parser and what it runs."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from turnkeep.chaos.runner import run_chaos
from turnkeep.cli.bench import add_bench_parser, run_bench
from turnkeep.cli.chaos import add_chaos_parser
from turnkeep.cli.config_docs import add_config_docs_parser, run_config_docs
from turnkeep.cli.env_server import add_env_server_parser, run_env_server
from turnkeep.cli.make_model import add_make_model_parser, run_make_model
from turnkeep.cli.plot import add_plot_parser, run_plot
from turnkeep.cli.run import add_run_parser, run_run
from turnkeep.cli.scale import add_scale_parser, run_scale
from turnkeep.cli.status import add_status_parser, run_status

COMMANDS = {
    "run": (add_run_parser, run_run),
    "chaos": (add_chaos_parser, run_chaos),
    "bench": (add_bench_parser, run_bench),
    "env-server": (add_env_server_parser, run_env_server),
    "status": (add_status_parser, run_status),
    "scale": (add_scale_parser, run_scale),
    "plot": (add_plot_parser, run_plot),
    "config-docs": (add_config_docs_parser, run_config_docs),
    "make-model": (add_make_model_parser, run_make_model),
}
"""Each command's parser and what it runs (given the parsed arguments; `args.argv` is the command line)."""


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="turnkeep", description=__doc__.split(".")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add_parser, _ in COMMANDS.values():
        add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(argv if argv is not None else sys.argv[1:])
    args = _build_parser().parse_args(argv)
    args.argv = argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return COMMANDS[args.command][1](args)


QUICK_EXIT_COMMANDS = frozenset({"status", "scale"})
"""Short-lived commands that leave without the interpreter's finalization. `status` and `scale` talk to Temporal; a
call still on the client's Rust threads while Python finalizes makes Python abort the process ("Fatal Python error:
PyGILState_Release", SIGABRT) after the answer was already printed (seen with `scale` refusing a count)."""


def entry() -> None:
    """The `turnkeep` command (and `python -m cli.main`); `main` stays callable in-process."""
    code = main()
    if len(sys.argv) > 1 and sys.argv[1] in QUICK_EXIT_COMMANDS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
