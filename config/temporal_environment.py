"""Temporal's own conventions for reaching a server, honoured when the config names no `temporal.address`: the
`TEMPORAL_ADDRESS`, `TEMPORAL_NAMESPACE`, `TEMPORAL_API_KEY` and `TEMPORAL_TLS_*` variables and the profiles of
`temporal.toml` (`TEMPORAL_PROFILE`, `TEMPORAL_CONFIG_FILE`), read with the SDK's own loader
(`temporalio.envconfig`), so an operator whose `temporal` CLI already reaches a server runs turnkeep against it
with nothing more to set. A config that names an address wins, and with neither the run starts its embedded dev
server as before.

The API key is not copied into the run's config (which is written into the run directory): every process that
connects reads it from the same place again (`primitives.temporal_client`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from turnkeep.config.loader import ConfigError
from turnkeep.schemas.config import TurnkeepConfig

TLS_PATH_VARIABLES = {"server_root_ca_cert": "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
                      "client_cert": "TEMPORAL_TLS_CLIENT_CERT_PATH",
                      "client_private_key": "TEMPORAL_TLS_CLIENT_KEY_PATH"}


def temporal_from_environment(cfg: TurnkeepConfig, environ: Mapping[str, str] | None = None,
                              ) -> tuple[TurnkeepConfig, str | None]:
    """The config with `[temporal]` filled from Temporal's environment configuration when it names a server and the
    config does not, and one line saying so (None: the config is unchanged)."""
    if cfg.temporal.address is not None:
        return cfg, None
    from temporalio.envconfig import ClientConfigProfile  # reads temporal.toml only when the config names no server

    environ = dict(os.environ if environ is None else environ)
    profile_name = environ.get("TEMPORAL_PROFILE") or None
    try:
        profile = ClientConfigProfile.load(override_env_vars=environ)
    except Exception as err:  # the SDK raises whatever its TOML and file reading raise
        where = environ.get("TEMPORAL_CONFIG_FILE") or "temporal.toml"
        raise ConfigError(f"Temporal's environment configuration ({where}) could not be read: "
                          f"{str(err).splitlines()[0] if str(err) else type(err).__name__}; fix it, or set "
                          "temporal.address in the config") from None
    if not profile.address:
        return cfg, None
    update: dict = {"address": profile.address, "namespace": profile.namespace or cfg.temporal.namespace,
                    "api_key_from_environment": bool(profile.api_key), "profile": profile_name}
    tls = profile.tls
    if tls is not None and not tls.disabled:
        update.update(tls=True, tls_server_name=tls.server_name,
                      tls_ca=_path(tls.server_root_ca_cert, "server_root_ca_cert"),
                      tls_cert=_path(tls.client_cert, "client_cert"),
                      tls_key=_path(tls.client_private_key, "client_private_key"))
    try:
        temporal = cfg.temporal.model_validate({**cfg.temporal.model_dump(), **update})
    except ValidationError as err:
        raise ConfigError(f"Temporal's environment configuration does not make a usable [temporal]: "
                          f"{err.errors()[0]['msg']}; fix the TEMPORAL_* variables or the profile, or set "
                          "temporal.address in the config") from None
    source = f"profile {profile_name!r}" if profile_name else "Temporal's environment configuration"
    return (cfg.model_copy(update={"temporal": temporal}),
            f"Temporal server {temporal.address}, namespace {temporal.namespace}, from {source}"
            f"{' with its API key' if update['api_key_from_environment'] else ''}"
            f"{' over TLS' if temporal.uses_tls() else ''} (set temporal.address in the config to choose another)")


def _path(source: object, field: str) -> Path | None:
    if source is None or isinstance(source, Path):
        return source
    if isinstance(source, str):
        return Path(source)
    raise ConfigError(f"Temporal's environment configuration gives the TLS {field.replace('_', ' ')} as data; the "
                      f"run's processes read it from a file: give {TLS_PATH_VARIABLES[field]} (or the path form in "
                      "temporal.toml) instead")
