"""`turnkeep env-server`: one environment class served as its own process.

The same server code as the run's built-in environment server (`envs/server.py`),
started by hand, possibly on another machine, for a run that names it with
`[environments.<name>] kind = "remote"`, `url`, `token_file`. Every route but
`/health` needs the token in `--token-file` (created 0600 when the file does not
exist). It listens on 127.0.0.1 unless `--host` says otherwise. A run attaches it at
start (and again after the server restarts); SIGTERM or Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import tempfile
from pathlib import Path

from envs.environment import EnvContext
from envs.kinds import EnvironmentFactory
from envs.loading import EnvironmentLoadError, load_environment
from envs.server import EnvServer
from participants.http_server import ControlAuth
from primitives.control_token import ControlTokenError, create_token_file
from primitives.segment_format import JournalCorrupt, JournalInUse
from schemas.config import EnvServerConfig

log = logging.getLogger("turnkeep.env")


def add_env_server_parser(sub) -> None:
    parser = sub.add_parser("env-server", help="serve one environment class as its own process (kind = \"remote\")")
    parser.add_argument("--entry", required=True, help="package.module:ClassName of an Environment subclass")
    parser.add_argument("--options", default="{}", help="the class's options as JSON (checked by its Options)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, required=True, help="port to listen on (0: a free one, printed)")
    parser.add_argument("--token-file", type=Path, required=True,
                        help="bearer token every route but /health needs (created, mode 0600, if absent)")
    parser.add_argument("--workspace", type=Path, default=None, help="folder for episodes' files (default: a temp dir)")
    parser.add_argument("--tool-latency-s", type=float, default=0.0, help="added latency of every tool call (tests)")
    parser.add_argument("--fault-injection", action="store_true", help="serve /checkpoint/faults (tests, benchmarks)")
    parser.add_argument("--journal-dir", type=Path, default=None,
                        help="journal every committed turn boundary here, so a run restored from a trainer "
                             "checkpoint continues this server's running agents (default: no journal)")


def run_env_server(args: argparse.Namespace) -> int:
    try:
        import orjson

        options = orjson.loads(args.options)
        if not isinstance(options, dict):
            raise EnvironmentLoadError(f"--options {args.options!r}: give a JSON object, e.g. '{{\"size\": 4}}'")
        loaded = load_environment(args.entry, options, where="--entry")
        token = create_token_file(args.token_file)
    except orjson.JSONDecodeError as err:
        print(f"turnkeep env-server: --options is not JSON ({err}); give a JSON object", file=sys.stderr)
        return 2
    except (EnvironmentLoadError, ControlTokenError) as err:
        print(f"turnkeep env-server: {err}", file=sys.stderr)
        return 2
    workspace = args.workspace or Path(tempfile.mkdtemp(prefix="turnkeep-env-workspaces-"))
    factory = EnvironmentFactory({loaded.cls.kind: loaded}, EnvContext(args.tool_latency_s, workspace),
                                 answer_any_name=True)
    cfg = EnvServerConfig(host=args.host, port=args.port, fault_injection=args.fault_injection)
    try:
        server = EnvServer(factory, cfg, ControlAuth(token, where=str(args.token_file)), name=loaded.cls.kind,
                           journal_dir=args.journal_dir)
    except (OSError, JournalCorrupt, JournalInUse) as err:
        print(f"turnkeep env-server: --journal-dir {args.journal_dir}: {err}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_serve(server, args.entry))
    except OSError as err:
        print(f"turnkeep env-server: cannot listen on {args.host}:{args.port} ({err}); pick another --port",
              file=sys.stderr)
        return 2


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
