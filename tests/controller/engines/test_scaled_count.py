"""The engine count `turnkeep scale` left is what the next start of the run gets, unless the config changed."""

from pathlib import Path

from tests.conftest import small_config
from turnkeep.controller.engines.scaled_count import SCALED_FILE, count_at_start, save_scaled


def _config(run_dir: Path, engines: int):
    cfg = small_config(run_dir, run_dir / "cache")
    return cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"engines": engines})})


def test_a_run_never_scaled_starts_with_the_config(tmp_path: Path):
    cfg = _config(tmp_path, 2)
    start = count_at_start(cfg)
    assert start.cfg is cfg and start.note is None


def test_the_next_start_keeps_the_scaled_count_and_says_so(tmp_path: Path):
    save_scaled(tmp_path, 3, _config(tmp_path, 2))
    start = count_at_start(_config(tmp_path, 2))
    assert start.cfg.policy.engines == 3
    assert "3 policy engines, as `turnkeep scale` left the run (policy.engines says 2" in start.note
    # Scaled again by a run that started with the kept count: the config's own count is still the one compared.
    save_scaled(tmp_path, 1, start.cfg)
    assert count_at_start(_config(tmp_path, 2)).cfg.policy.engines == 1


def test_a_config_changed_since_the_scale_wins_and_the_kept_count_goes(tmp_path: Path):
    save_scaled(tmp_path, 3, _config(tmp_path, 2))
    start = count_at_start(_config(tmp_path, 4))
    assert start.cfg.policy.engines == 4
    assert "policy.engines changed from 2 to 4 since the run was scaled to 3" in start.note
    assert not (tmp_path / SCALED_FILE).exists()


def test_a_damaged_file_is_named_and_the_config_counts(tmp_path: Path):
    (tmp_path / SCALED_FILE).write_text('{"engines": 0, "config_engines": 2}')
    start = count_at_start(_config(tmp_path, 2))
    assert start.cfg.policy.engines == 2
    assert f"{tmp_path / SCALED_FILE} is unreadable" in start.note and "removed" in start.note
    assert not (tmp_path / SCALED_FILE).exists()
