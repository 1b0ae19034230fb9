"""docs/slurm/turnkeep.sbatch, run under stand-ins for Slurm's commands, Ray and turnkeep: it starts a Ray node per
node of the allocation, hands `turnkeep run` a command line the real CLI and config accept, and on SIGTERM (what
Slurm sends before a preemption or the time limit) forwards it to the run, waits for it, and requeues the job."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

from turnkeep.cli.main import _build_parser
from turnkeep.config.loader import load_config, parse_overrides

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "slurm" / "turnkeep.sbatch"

STUBS = {
    "scontrol": 'if [ "$1" = show ]; then printf "gpu-a\\ngpu-b\\n"; else echo "scontrol $*" >> "$CALLS"; fi',
    "srun": 'echo "srun $*" >> "$CALLS"; for a in "$@"; do [ "$a" = hostname ] && { echo 10.0.0.5; exit 0; }; done; '
            'exec sleep 60',
    # A run that takes its final snapshot on SIGTERM and exits 0, as `turnkeep run` does.
    "turnkeep": 'printf "%q " "$@" > "$CALLS.turnkeep"; trap \'echo "saved" >> "$CALLS"; exit 0\' TERM; '
                'while true; do sleep 0.1; done',
}


def _stubs(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls"),
            "HOME": str(tmp_path / "home"), "SLURM_JOB_NODELIST": "gpu-[a-b]", "SLURM_JOB_NAME": "tk",
            "SLURM_JOB_ID": "4242", "RAY_SETTLE_S": "0"}


def test_the_script_parses() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


def test_a_dry_run_starts_a_ray_node_per_node_and_a_run_the_cli_accepts(tmp_path: Path) -> None:
    env = {**_stubs(tmp_path), "DRY_RUN": "1"}
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [shlex.split(line) for line in out.stdout.splitlines() if line.strip()]
    rays = [line for line in lines if line[0] == "srun"]
    assert sorted(line[line.index("-w") + 1] for line in rays) == ["gpu-a", "gpu-b"]
    assert any("--head" in line and "--node-ip-address=10.0.0.5" in line for line in rays)
    [run] = [line for line in lines if line[0] == "turnkeep"]
    args = _build_parser().parse_args(run[1:])
    cfg = load_config(args.config, parse_overrides(args.set))  # the config and every --set are accepted
    assert cfg.ray.address == "10.0.0.5:6379" and cfg.policy.engines == 3
    # The job asks for the GPUs its run places: nodes x gpus-per-node, from the script's own #SBATCH lines.
    asked = dict(line.removeprefix("#SBATCH --").split("=", 1) for line in SCRIPT.read_text().splitlines()
                 if line.startswith("#SBATCH --") and "=" in line)
    assert int(asked["nodes"]) * int(asked["gpus-per-node"]) == cfg.placement.gpus_needed(cfg.policy.engines,
                                                                                         cfg.train.ranks) == 4
    assert cfg.ray.token_file == tmp_path / "home" / ".turnkeep" / "ray_token"
    assert (tmp_path / "home" / ".turnkeep" / "ray_token").stat().st_mode & 0o777 == 0o600


def test_sigterm_reaches_the_run_which_saves_and_the_job_is_requeued(tmp_path: Path) -> None:
    env = _stubs(tmp_path)
    job = subprocess.Popen(["bash", str(SCRIPT)], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "calls.turnkeep").exists():
            assert time.monotonic() < deadline and job.poll() is None, job.stderr.read() if job.poll() else "no run"
            time.sleep(0.1)
        job.send_signal(signal.SIGTERM)  # Slurm signals the batch shell (--signal=B:TERM)
        assert job.wait(timeout=30) == 0
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # the stand-in Ray nodes
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls.index("saved") < calls.index("scontrol requeue 4242"), calls
