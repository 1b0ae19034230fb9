"""`turnkeep env-server`: one environment class served as its own process (`workers/env_server.py`).

For a run that names it with `[environments.<name>] kind = "remote"`, `url`, `token_file`.
Every route but `/health` needs the token in `--token-file` (created 0600 when the file does
not exist). It listens on 127.0.0.1 unless `--host` says otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from turnkeep.envs.loading import EnvironmentLoadError, load_environment
from turnkeep.primitives.control_token import ControlTokenError, create_token_file
from turnkeep.primitives.segment_format import JournalCorrupt, JournalInUse
from turnkeep.workers.env_server import EnvServerSettings, build_env_server, serve


def add_env_server_parser(sub) -> None:
    parser = sub.add_parser("env-server", help="serve one environment class as its own process (kind = \"remote\")")
    parser.add_argument("--entry", required=True, help="package.module:ClassName of an Environment subclass")
    parser.add_argument("--options", default="{}", help="the class's options as JSON (checked by its Options)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    parser.add_argument("--port", type=tcp_port, required=True, help="port to listen on (0: a free one, printed)")
    parser.add_argument("--token-file", type=Path, required=True,
                        help="bearer token every route but /health needs (created, mode 0600, if absent)")
    parser.add_argument("--workspace", type=Path, default=None, help="folder for episodes' files (default: a temp dir)")
    parser.add_argument("--tool-latency-s", type=float, default=0.0, help="added latency of every tool call (tests)")
    parser.add_argument("--fault-injection", action="store_true", help="serve /checkpoint/faults (tests, benchmarks)")
    parser.add_argument("--journal-dir", type=Path, default=None,
                        help="journal every committed turn boundary here, so a run restored from a trainer "
                             "checkpoint continues this server's running agents (default: no journal)")


def tcp_port(text: str) -> int:
    """A TCP port number, 0 to 65535 (argparse names the flag and exits 2 otherwise)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number; give 0 to 65535") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port; give 0 to 65535 (0: a free one)")
    return port


def run_env_server(args: argparse.Namespace) -> int:
    try:
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
    settings = EnvServerSettings(host=args.host, port=args.port, token=token, token_file=args.token_file,
                                 workspace=args.workspace, tool_latency_s=args.tool_latency_s,
                                 fault_injection=args.fault_injection, journal_dir=args.journal_dir)
    try:
        server = build_env_server(loaded, settings)
    except (OSError, JournalCorrupt, JournalInUse) as err:
        print(f"turnkeep env-server: --journal-dir {args.journal_dir}: {err}", file=sys.stderr)
        return 2
    try:
        return serve(server, args.entry)
    except OSError as err:
        print(f"turnkeep env-server: cannot listen on {args.host}:{args.port} ({err}); pick another --port",
              file=sys.stderr)
        return 2
