"""`turnkeep env-server`'s arguments: a port out of range is named by argparse in one line, before anything loads."""

from __future__ import annotations

import pytest

from turnkeep.cli.main import main


@pytest.mark.parametrize("port, named", [("70000", "70000 is not a port"), ("-1", "-1 is not a port"),
                                         ("http", "'http' is not a port number")])
def test_a_port_out_of_range_is_one_line_and_exit_2(port, named, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["env-server", "--entry", "turnkeep.envs.calc_env:CalcEnvironment", "--port", port,
              "--token-file", str(tmp_path / "token")])
    assert exited.value.code == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert f"argument --port: {named}; give 0 to 65535" in errors[-1], errors
    assert not (tmp_path / "token").exists()
