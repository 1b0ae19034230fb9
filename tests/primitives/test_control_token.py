"""The run's control token file: private, stable across restarts."""

from __future__ import annotations

import os
import stat

import pytest

from turnkeep.primitives.control_token import ControlTokenError, create_control_token, read_control_token, token_path


def test_token_is_private_and_stable(tmp_path) -> None:
    run_dir = tmp_path / "run"
    token = create_control_token(run_dir)
    path = token_path(run_dir)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(token) >= 32
    assert create_control_token(run_dir) == token  # a restarted run keeps its token
    assert read_control_token(run_dir) == token
    assert [p.name for p in run_dir.iterdir()] == ["control_token"]  # no temp file left behind


def test_a_token_others_can_read_is_refused(tmp_path) -> None:
    create_control_token(tmp_path)
    os.chmod(token_path(tmp_path), 0o644)
    with pytest.raises(ControlTokenError, match="chmod 600"):
        read_control_token(tmp_path)


def test_missing_token_says_where_it_should_be(tmp_path) -> None:
    with pytest.raises(ControlTokenError, match="control_token does not exist"):
        read_control_token(tmp_path)
