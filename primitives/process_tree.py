"""SIGKILL a process and everything it started, the way a preempted machine would.

A `turnkeep run` owns a deep tree (Ray's raylet and GCS, vLLM engine processes, the
Temporal dev server), and some of those re-parent themselves away from the root. So
the whole tree is listed first, while it is still connected, and when the root leads
its own session every process left in that session is taken too.
"""

from __future__ import annotations

import os
import signal
import time

import psutil


def kill_tree(pid: int, timeout_s: float = 30) -> int:
    """SIGKILL `pid` and all its descendants; wait until they are gone. Returns how many were killed."""
    try:
        root = psutil.Process(pid)
        session_leader = os.getsid(pid) == pid
    except (psutil.NoSuchProcess, ProcessLookupError):
        return 0
    # Listed before any signal: once a parent dies its children move to init and the tree is lost.
    targets = _descendants(root, session_leader)
    killed = {p.pid: p for p in targets if _sigkill(p)}
    if session_leader:
        # A process forked between the listing and the kills is caught by the group kill and
        # by one more sweep of the session.
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for straggler in _session_members(pid):
            if straggler.pid not in killed and _sigkill(straggler):
                killed[straggler.pid] = straggler
    _wait_gone(list(killed.values()), timeout_s)
    return len(killed)


def kill_local_actor_processes(pids: list[int], title: str) -> int:
    """SIGKILL each of `pids` (and what it started) that is, on this machine, a process whose title holds `title`
    (Ray titles an actor's process `ray::<Class>`): a pid from another node, or one reused since, is spared."""
    killed = 0
    for pid in pids:
        try:
            if title not in " ".join(psutil.Process(pid).cmdline()):
                continue
        except psutil.Error:
            continue
        killed += kill_tree(pid)
    return killed


def kill_children(pid: int, timeout_s: float = 30) -> int:
    """SIGKILL every descendant of `pid` (not `pid` itself: the caller, which goes on); wait until they are gone."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    killed = [child for child in children if _sigkill(child)]
    _wait_gone(killed, timeout_s)
    return len(killed)


def _descendants(root: psutil.Process, session_leader: bool) -> list[psutil.Process]:
    found = {root.pid: root}
    try:
        found.update({p.pid: p for p in root.children(recursive=True)})
    except psutil.NoSuchProcess:
        pass
    if session_leader:
        found.update({p.pid: p for p in _session_members(root.pid) if p.pid not in found})
    return list(found.values())


def _session_members(sid: int) -> list[psutil.Process]:
    members = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                members.append(p)
        except (ProcessLookupError, PermissionError):
            continue
    return members


def _sigkill(p: psutil.Process) -> bool:
    try:
        p.send_signal(signal.SIGKILL)  # psutil checks the pid was not reused by another process
        return True
    except psutil.NoSuchProcess:
        return False


def _wait_gone(processes: list[psutil.Process], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = processes
    while pending:
        pending = [p for p in pending if _alive(p)]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"still alive {timeout_s:.0f}s after SIGKILL: pids {[p.pid for p in pending]}")
        time.sleep(0.05)


def _alive(p: psutil.Process) -> bool:
    # A zombie is dead; its exit status is left for its parent to reap (a Popen's returncode
    # must stay -9), and an orphaned one may sit until init gets to it.
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
