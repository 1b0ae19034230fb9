"""A stand-alone environment server process (`turnkeep env-server`): one environment class, the same server code
as the run's own environment server (`envs/server.py`), started by hand, possibly on another machine. A run
attaches it at start (and again after the server restarts); SIGTERM or Ctrl-C stops it."""

from __future__ import annotations

import asyncio
import logging
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path

from turnkeep.envs.environment import EnvContext
from turnkeep.envs.kinds import EnvironmentFactory
from turnkeep.envs.loading import LoadedEnvironment
from turnkeep.envs.server import EnvServer
from turnkeep.participants.http_server import ControlAuth
from turnkeep.schemas.config_services import EnvServerConfig

log = logging.getLogger("turnkeep.env")


@dataclass(frozen=True)
class EnvServerSettings:
    host: str
    port: int
    token: str
    token_file: Path
    workspace: Path | None = None
    """Folder for episodes' files (None: a new temporary directory)."""
    tool_latency_s: float = 0.0
    fault_injection: bool = False
    journal_dir: Path | None = None


def build_env_server(loaded: LoadedEnvironment, settings: EnvServerSettings) -> EnvServer:
    """The server for one environment class; raises OSError, JournalCorrupt or JournalInUse for its journal."""
    workspace = settings.workspace or Path(tempfile.mkdtemp(prefix="turnkeep-env-workspaces-"))
    factory = EnvironmentFactory({loaded.cls.kind: loaded}, EnvContext(settings.tool_latency_s, workspace),
                                 answer_any_name=True)
    cfg = EnvServerConfig(host=settings.host, port=settings.port, fault_injection=settings.fault_injection)
    return EnvServer(factory, cfg, ControlAuth(settings.token, where=str(settings.token_file)), name=loaded.cls.kind,
                     journal_dir=settings.journal_dir)


def serve(server: EnvServer, entry: str) -> int:
    """Serve until SIGTERM or SIGINT; raises OSError when the port cannot be listened on."""
    return asyncio.run(_serve(server, entry))


async def _serve(server: EnvServer, entry: str) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    url = await server.start()
    print(f"turnkeep env-server: serving {entry} at {url}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()
    log.info("env-server %s stopped", url)
    return 0
