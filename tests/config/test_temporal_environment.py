"""Temporal's own connection conventions (TEMPORAL_* variables, temporal.toml profiles) fill `[temporal]` when the
config names no address; the API key stays out of the run's config."""

import asyncio
from pathlib import Path

import pytest

from tests.conftest import small_config
from turnkeep.config.loader import ConfigError
from turnkeep.config.temporal_environment import temporal_from_environment
from turnkeep.primitives.temporal_client import TemporalSecurityError, _api_key
from turnkeep.workers.temporal.service import check_temporal_service


def _config(tmp_path: Path, **temporal):
    cfg = small_config(tmp_path / "run", tmp_path / "cache")
    return cfg.model_copy(update={"temporal": cfg.temporal.model_copy(update=temporal)})


def test_without_an_address_anywhere_the_embedded_server_stays(tmp_path):
    cfg = _config(tmp_path)
    assert temporal_from_environment(cfg, {}) == (cfg, None)


def test_the_variables_name_the_server_and_the_key_stays_in_the_environment(tmp_path):
    cfg, note = temporal_from_environment(_config(tmp_path), {
        "TEMPORAL_ADDRESS": "temporal.example:7233", "TEMPORAL_NAMESPACE": "rl", "TEMPORAL_API_KEY": "secret-key"})
    assert (cfg.temporal.address, cfg.temporal.namespace) == ("temporal.example:7233", "rl")
    assert cfg.temporal.api_key_from_environment and cfg.temporal.uses_tls()
    assert "secret-key" not in cfg.model_dump_json()
    assert note.startswith("Temporal server temporal.example:7233, namespace rl, from Temporal's environment "
                           "configuration with its API key over TLS")


def test_a_profile_of_temporal_toml_gives_address_and_tls_files(tmp_path):
    toml = tmp_path / "temporal.toml"
    toml.write_text('[profile.prod]\naddress = "prod.example:7233"\nnamespace = "train"\n'
                    '[profile.prod.tls]\nclient_cert_path = "/certs/client.pem"\nclient_key_path = "/certs/client.key"\n'
                    'server_ca_cert_path = "/certs/ca.pem"\nserver_name = "prod"\n')
    cfg, note = temporal_from_environment(_config(tmp_path), {"TEMPORAL_CONFIG_FILE": str(toml),
                                                               "TEMPORAL_PROFILE": "prod"})
    temporal = cfg.temporal
    assert (temporal.address, temporal.namespace, temporal.profile) == ("prod.example:7233", "train", "prod")
    assert (temporal.tls_cert, temporal.tls_key, temporal.tls_ca) == (
        Path("/certs/client.pem"), Path("/certs/client.key"), Path("/certs/ca.pem"))
    assert temporal.tls_server_name == "prod" and not temporal.api_key_from_environment
    assert "from profile 'prod'" in note


def test_the_config_s_own_address_wins(tmp_path):
    cfg = _config(tmp_path, address="mine:7233")
    assert temporal_from_environment(cfg, {"TEMPORAL_ADDRESS": "theirs:7233"}) == (cfg, None)


@pytest.mark.parametrize(("environ", "message"), [
    ({"TEMPORAL_ADDRESS": "h:7233", "TEMPORAL_TLS_CLIENT_CERT_DATA": "-----BEGIN", "TEMPORAL_TLS_CLIENT_KEY_DATA": "x"},
     "give TEMPORAL_TLS_CLIENT_CERT_PATH"),
    ({"TEMPORAL_ADDRESS": "h:7233", "TEMPORAL_TLS_CLIENT_CERT_PATH": "/c.pem"}, "tls_cert and temporal.tls_key go"),
    ({"TEMPORAL_CONFIG_FILE": "BROKEN", "TEMPORAL_PROFILE": "nope"}, "could not be read"),
])
def test_a_configuration_the_run_cannot_use_is_one_line(tmp_path, environ, message):
    if environ.get("TEMPORAL_CONFIG_FILE") == "BROKEN":
        broken = tmp_path / "temporal.toml"
        broken.write_text("[profile.default\naddress=")
        environ = {**environ, "TEMPORAL_CONFIG_FILE": str(broken)}
    with pytest.raises(ConfigError, match=message):
        temporal_from_environment(_config(tmp_path), environ)


def test_every_process_reads_the_key_again_and_names_it_when_missing(tmp_path, monkeypatch):
    cfg, _ = temporal_from_environment(_config(tmp_path), {"TEMPORAL_ADDRESS": "h:7233", "TEMPORAL_API_KEY": "k1"})
    monkeypatch.setenv("TEMPORAL_API_KEY", "k1")
    assert _api_key(cfg.temporal.security()) == "k1"
    monkeypatch.delenv("TEMPORAL_API_KEY")
    with pytest.raises(TemporalSecurityError, match="set it where this process runs"):
        _api_key(cfg.temporal.security())


def test_a_real_server_named_by_temporal_address_is_checked_and_used(tmp_path, temporal_address):
    cfg, note = temporal_from_environment(_config(tmp_path), {"TEMPORAL_ADDRESS": temporal_address})
    assert cfg.temporal.address == temporal_address and not cfg.temporal.uses_tls()
    asyncio.run(check_temporal_service(cfg))  # the server answers and the namespace and search attributes are there
    with pytest.raises(ConfigError, match="namespace 'absent' does not exist"):
        asyncio.run(check_temporal_service(temporal_from_environment(
            _config(tmp_path), {"TEMPORAL_ADDRESS": temporal_address, "TEMPORAL_NAMESPACE": "absent"})[0]))
