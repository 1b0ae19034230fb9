"""Errors the policy server raises on purpose, each with the HTTP status it maps to."""

from __future__ import annotations


class RequestError(ValueError):
    """A request the server cannot serve as asked (HTTP 400); `param` names the field."""

    status = 400

    def __init__(self, param: str | None, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


class WeightsUnavailable(RuntimeError):
    """The last weight load failed part way; nothing is served until one succeeds (HTTP 503)."""

    status = 503
