"""`turnkeep export`'s arguments: --run-dir and --out are required, --max-shard-size takes Hugging Face's sizes."""

from __future__ import annotations

import argparse

import pytest

from turnkeep.cli.export import shard_size
from turnkeep.cli.main import _build_parser


def test_sizes_read_as_hugging_face_counts_them():
    assert [shard_size(text) for text in ("5GB", "500mb", "2.5GB", "40KB", "1234")] == [
        5 * 10**9, 500 * 10**6, 2_500_000_000, 40_000, 1234]
    for text in ("5 GiB", "GB", "0", "-1MB"):
        with pytest.raises(argparse.ArgumentTypeError):
            shard_size(text)


def test_the_run_dir_and_out_are_required_and_the_step_is_optional():
    args = _build_parser(["export"]).parse_args(["export", "--run-dir", "runs/tiny", "--out", "exports/tiny"])
    assert (str(args.run_dir), args.step, str(args.out), args.max_shard_size) == (
        "runs/tiny", None, "exports/tiny", 5 * 10**9)
    with pytest.raises(SystemExit):
        _build_parser(["export"]).parse_args(["export", "--run-dir", "runs/tiny"])
