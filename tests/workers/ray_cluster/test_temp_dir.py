"""Ray's temp dir for a run: in the run directory when Ray's socket paths fit the unix limit there, otherwise a
short folder of the run's own (the same for the same run directory) that `<run_dir>/ray` links to; a run
directory no folder can serve is refused in one line before anything starts."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from turnkeep.config.loader import ConfigError
from turnkeep.workers.ray_cluster.temp_dir import (
    LONGEST_SOCKET_UNDER,
    UNIX_PATH_MAX,
    prepare_ray_temp_dir,
    ray_temp_dir,
)


def _deep(root: Path) -> Path:
    return root / "experiments" / "2026-12" / "agents" / "lookup-sweep" / "lr-1e-4" / "seed-0"


def test_a_short_run_directory_keeps_ray_inside_it(tmp_path) -> None:
    run_dir = Path("/tmp") / "r"
    assert ray_temp_dir(run_dir) == run_dir / "ray"


def test_a_deep_run_directory_gets_a_short_folder_of_its_own_that_its_ray_link_names(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TMPDIR", str(Path("/tmp")))
    run_dir = _deep(tmp_path)
    temp_dir = ray_temp_dir(run_dir)
    assert len(str(run_dir / "ray")) + LONGEST_SOCKET_UNDER > UNIX_PATH_MAX  # the case this is about
    assert len(str(temp_dir)) + LONGEST_SOCKET_UNDER <= UNIX_PATH_MAX
    assert ray_temp_dir(run_dir) == temp_dir and ray_temp_dir(_deep(tmp_path / "other")) != temp_dir
    run_dir.mkdir(parents=True)
    try:
        assert prepare_ray_temp_dir(run_dir) == temp_dir
        assert (run_dir / "ray").is_symlink() and (run_dir / "ray").resolve() == temp_dir
        for folder in (temp_dir, temp_dir.parent):
            assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
        assert prepare_ray_temp_dir(run_dir) == temp_dir  # a restarted controller: the same folder, link kept
    finally:
        (run_dir / "ray").unlink(missing_ok=True)
        temp_dir.rmdir()


def test_a_run_directory_no_folder_can_serve_is_one_line(tmp_path, monkeypatch) -> None:
    long_tmp = tmp_path / ("t" * 80)
    monkeypatch.setenv("TMPDIR", str(long_tmp))
    long_tmp.mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    with pytest.raises(ConfigError, match=r"run.run_dir = .*107-byte unix path limit.*set TMPDIR to a short folder"):
        ray_temp_dir(_deep(tmp_path))
    assert not os.listdir(long_tmp)
