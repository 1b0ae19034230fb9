"""The `turnkeep` entry point: `status` leaves without the interpreter's finalization, where a Temporal call that
outlived its deadline would make Python abort (sdk-python #300; 4 of 25 runs against a live run did); every other
command exits normally, so a run's own shutdown still runs."""

from __future__ import annotations

import sys

import pytest

from turnkeep.cli import main as cli


class Exited(Exception):
    pass


def _entry(monkeypatch, argv: list[str], code: int) -> tuple[str, int]:
    monkeypatch.setattr(sys, "argv", ["turnkeep", *argv])
    monkeypatch.setattr(cli, "main", lambda: code)

    def quick_exit(status: int):
        raise Exited(("os._exit", status))

    monkeypatch.setattr(cli.os, "_exit", quick_exit)
    with pytest.raises((Exited, SystemExit)) as ended:
        cli.entry()
    if isinstance(ended.value, Exited):
        return ended.value.args[0]
    return "sys.exit", ended.value.code


def test_status_ends_without_finalizing_and_keeps_its_exit_code(monkeypatch):
    assert _entry(monkeypatch, ["status", "/runs/a", "--json"], 2) == ("os._exit", 2)


@pytest.mark.parametrize("command", ["run", "chaos", "bench", "env-server"])
def test_other_commands_exit_normally(monkeypatch, command):
    assert _entry(monkeypatch, [command], 0) == ("sys.exit", 0)
