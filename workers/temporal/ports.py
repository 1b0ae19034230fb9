"""Ports for the embedded Temporal dev server: a free one chosen on the loopback address, or the configured one
checked, naming the process that holds it when it is taken."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import psutil

from turnkeep.config.loader import ConfigError
from turnkeep.workers.temporal.pidfile import cmdline


class TemporalStartError(ConfigError):
    """The embedded dev server cannot start (a port held by another process, a server that exits or does not
    answer); one line naming the setting or temporal.log. A ConfigError, so the CLI prints it without a traceback."""


def free_port(ip: str) -> int:
    with socket.socket() as sock:
        try:
            sock.bind((ip, 0))
        except OSError as err:
            raise TemporalStartError(f"temporal.ip = {ip}: the embedded server cannot listen there ({err.strerror}); "
                                     "use 127.0.0.1 (the default) or an address of this machine") from None
        return sock.getsockname()[1]


def port_free(ip: str, port: int) -> bool:
    with socket.socket() as sock:
        # Like the server's own listener: connections of a run that just died (TIME_WAIT) do not block it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((ip, port))
        except OSError:
            return False
        return True


def choose_port(ip: str, wanted: int, setting: str, what: str) -> int:
    """`wanted`, or a free port when it is 0 or taken (another run side by side): the choice is printed, and a
    restart of this run keeps it (its pid file records the command line)."""
    chosen = free_port(ip)  # first: an address this machine does not have is named as such
    if wanted == 0:
        return chosen
    if port_free(ip, wanted):
        return wanted
    print(f"turnkeep: {setting} = {wanted} on {ip} is in use by {port_holder(wanted)}; {what} of this run is on port "
          f"{chosen} instead (set {setting} to choose another)", file=sys.stderr, flush=True)
    return chosen


def check_port(ip: str, port: int, setting: str) -> None:
    if not port_free(ip, port):
        raise TemporalStartError(
            f"{setting} = {port}: port {port} on {ip} is in use by {port_holder(port)}, not by this run's Temporal "
            f"server; set {setting} to a free port (or 0 to pick one), or stop that process"
        )


def port_holder(port: int) -> str:
    """Who listens on `port`, as far as this user can see."""
    try:
        pids = {c.pid for c in psutil.net_connections("tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}
    except (psutil.Error, OSError):
        pids = set()
    for pid in sorted(pids):
        args = cmdline(pid)
        if args[1:3] == ["server", "start-dev"] and "--db-filename" in args[:-1]:
            return f"another Temporal dev server (pid {pid}, database {args[args.index('--db-filename') + 1]})"
        if args:
            return f"pid {pid} ({Path(args[0]).name})"
    return "another process"
