"""What the environment server raises for its routes to answer: shared by `envs/server.py` (which raises them) and
`envs/server_routes.py` (which turns them into HTTP answers), so neither imports the other for them."""

from __future__ import annotations


class AttachRefused(Exception):
    """The server will not attach this run now; `status` is the HTTP answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class NotAttached(Exception):
    """No run has attached this server yet."""
