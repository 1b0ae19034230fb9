"""What the controller raises when the run cannot go on. A snapshot step's own failures (a broken invariant, a trainer
that moved, ACKs in flight) are `primitives.snapshot_errors`, raised on the GPU side too."""

from __future__ import annotations


class RunStopped(RuntimeError):
    """The run stopped before its last step: the run workflow stopped it (failed snapshots in a row, a broken
    invariant), a process died, or a pump failed; the message is the one-line reason."""
