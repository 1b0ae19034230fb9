"""vLLM's engine core forked from a process that imported vLLM while the policy actor did.

Inside a Ray actor vLLM starts its engine core with `spawn` (forking a process that runs Ray's threads is unsafe):
a fresh interpreter that imports torch and vLLM again, about 5 s on 2 cores, and only after the actor's own import
of them. Those two imports were the longest stretch of a restart. A forkserver, started before the actor imports
vLLM, preloads vLLM's engine core module at the same time; when vLLM starts its engine core, the forkserver forks
it. The forkserver is single-threaded and has touched neither Ray nor a GPU, which is what `spawn` is for.

Only an engine without GPUs uses it (`wanted`): on a GPU, CUDA's own start dwarfs the import, and vLLM's
multiprocessing executor starts worker processes of its own. vLLM is reached at one place, the module attribute its
engine launcher reads its multiprocessing context from; if a vLLM version moves it, engines spawn as before. The
forkserver stays up beside the engine core (it reports the core's exit to vLLM) and exits with the actor.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import multiprocessing.forkserver
import os
from multiprocessing.context import ForkServerProcess

log = logging.getLogger("turnkeep.policy")

LAUNCHER = "vllm.v1.engine.utils"
"""The module whose `get_mp_context` vLLM's engine launcher calls for the context it starts engine cores with."""
PRELOAD = ["vllm.v1.engine.core"]
"""What the engine core's process runs: importing it imports torch and the rest of vLLM."""


def wanted() -> bool:
    """The engine has no GPU of Ray's (a CPU machine, or a policy placed without GPUs)."""
    import ray  # not at the top: the forkserver's children import this module and must not load Ray

    return not ray.get_gpu_ids()


def start() -> None:
    """Start the forkserver and let it import the engine core's modules while this process goes on."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    multiprocessing.forkserver.ensure_running()


def use_for_engines() -> bool:
    """Make vLLM's engine launcher take its processes from the forkserver; False when this vLLM has no such
    launcher attribute (its engines then spawn as before)."""
    try:
        launcher = importlib.import_module(LAUNCHER)
    except ImportError:
        return False
    if not hasattr(launcher, "get_mp_context"):
        log.warning("vLLM's engine launcher has no get_mp_context; its engine core is spawned (imports vLLM again)")
        return False
    launcher.get_mp_context = _ForkserverContext
    return True


class _ForkserverContext:
    """The forkserver's multiprocessing context, whose processes start with this process's environment."""

    def __init__(self) -> None:
        self._context = multiprocessing.get_context("forkserver")

    def Process(self, *args, **kwargs):  # noqa: N802 - multiprocessing's name
        return EnvironmentCarryingProcess(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._context, name)


class EnvironmentCarryingProcess(ForkServerProcess):
    """A forkserver child inherits the forkserver's environment, fixed when it started; vLLM sets variables for its
    engine core just before starting it (threads, the executor, serialization), so the child takes the environment
    this process has at `start`."""

    def start(self) -> None:
        self._environment = dict(os.environ)
        super().start()

    def run(self) -> None:
        # Only what differs: clearing the environment first would keep vLLM from retitling the process
        # (setproctitle), and the run's memory figures find the engine core by its title.
        for name in set(os.environ) - set(self._environment):
            del os.environ[name]
        for name, value in self._environment.items():
            if os.environ.get(name) != value:
                os.environ[name] = value
        _apply_variables_read_at_import()
        super().run()


def _apply_variables_read_at_import() -> None:
    """OpenMP and torch's compiler read these when the forkserver imported torch, before vLLM set them for this
    child."""
    import torch  # already loaded by the forkserver: this only reaches it

    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit():
        torch.set_num_threads(int(threads))
    if os.environ.get("TORCHDYNAMO_DISABLE") == "1":
        import torch._dynamo  # torch's compiler, loaded only to switch it off

        torch._dynamo.config.disable = True
