"""docker-compose.yml runs Temporal on PostgreSQL with its UI: pinned images, health checks,
a volume for the database, and ports published on loopback only (as the README documents)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

COMPOSE = Path(__file__).resolve().parents[1] / "docker-compose.yml"
README = Path(__file__).resolve().parents[1] / "docs" / "operations.md"


def _services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def test_the_three_services_with_pinned_images_and_health_checks() -> None:
    services = _services()
    assert set(services) == {"postgresql", "temporal", "temporal-ui"}
    for name, service in services.items():
        image, _, tag = service["image"].partition(":")
        assert tag and tag != "latest" and re.fullmatch(r"\d+(\.\d+)+", tag), (name, service["image"])
        assert service["healthcheck"]["test"], name
    assert services["postgresql"]["image"].startswith("postgres:")
    assert services["temporal"]["image"].startswith("temporalio/auto-setup:")
    assert services["temporal-ui"]["image"].startswith("temporalio/ui:")


def test_temporal_runs_on_postgresql_and_starts_after_it() -> None:
    services = _services()
    temporal = services["temporal"]
    assert temporal["environment"]["DB"] == "postgres12" and temporal["environment"]["POSTGRES_SEEDS"] == "postgresql"
    assert temporal["depends_on"]["postgresql"]["condition"] == "service_healthy"
    assert services["temporal-ui"]["depends_on"]["temporal"]["condition"] == "service_healthy"
    assert services["temporal-ui"]["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"
    volume, _, mount = services["postgresql"]["volumes"][0].partition(":")
    assert mount == "/var/lib/postgresql/data" and volume in yaml.safe_load(COMPOSE.read_text())["volumes"]


def test_ports_are_published_on_loopback_only_and_documented() -> None:
    services = _services()
    assert "ports" not in services["postgresql"]  # the database is reachable inside the compose network only
    published = {name: service.get("ports", []) for name, service in services.items()}
    assert published["temporal"] == ["127.0.0.1:7233:7233"]
    assert published["temporal-ui"] == ["127.0.0.1:8080:8080"]
    readme = README.read_text()
    assert "127.0.0.1:7233" in readme and "127.0.0.1:8080" in readme and "docker compose up -d" in readme
