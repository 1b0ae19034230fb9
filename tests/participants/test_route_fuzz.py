"""Random and malformed requests to every route of the live environment and policy servers.

Each one must end in a 4xx with a message (never a 5xx, never a dropped connection), and
afterwards both servers must be exactly as before: no participant prepared, no agent,
no unACKed result, no hold. The requests are generated to be invalid (a valid one
would rightly change state), from a fixed seed so a failure reproduces.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from urllib.parse import urlsplit

import aiohttp
import pytest

pytestmark = pytest.mark.integration

SEED = 20261201
CASES_PER_ROUTE = 60

CHECKPOINT_POSTS = {
    "/checkpoint/prepare": {"checkpoint_id": "fuzz.snapshot.1.1", "lease_s": 5.0},
    "/checkpoint/renew": {"checkpoint_id": "fuzz.snapshot.1.1", "lease_s": 5.0},
    "/checkpoint/commit": {"checkpoint_id": "fuzz.snapshot.1.1", "inline": True},
    "/checkpoint/resume": {"checkpoint_id": "fuzz.snapshot.1.1"},
    "/checkpoint/abort": {"checkpoint_id": "fuzz.snapshot.1.1"},
    "/checkpoint/faults": {"fail": {"prepare": 1}},
}
ENV_POSTS = {
    **CHECKPOINT_POSTS,
    "/checkpoint/restore": {"checkpoint_id": "fuzz.recovery.1", "directory": "/tmp/nowhere/env"},
    "/attach": {"run_id": "fuzz", "incarnation": 1, "name": "env", "policy_url": "http://127.0.0.1:9",
                "limits": {"max_turns": 2, "max_tokens_per_turn": 8, "max_model_len": 64, "temperature": 1.0},
                "model_files": {}, "group_size": 4},
    "/run": {"rollout_id": "fuzz.0.0", "group_id": "fuzz", "sibling": 0, "attempt": 0,
             "problem": {"question": "Q 1+1", "answer": 2, "env": "calc"}},
    "/ack": {"receipt": "fuzz.0.0:abc"},
    "/cancel": {"rollout_id": "fuzz.0.0"},
    "/judge": {"group_id": "fuzz", "problem": {"question": "Q", "env": "judge"}, "policy_turns": [[[1, 2]]]},
}
POLICY_POSTS = {
    **CHECKPOINT_POSTS,
    "/v1/completions": {"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 1.0},
}
NOT_JSON = [b"", b"{", b"[]", b"null", b"1e999", b'"x"', b"\xff\xfe\x00garbage", b"{" * 5000 + b"}" * 5000,
            b"[" * 100_000 + b"]" * 100_000, b'{"checkpoint_id": NaN}', b'{"lease_s": Infinity}']
ODD_VALUES = [None, True, -1, 0, 2**80, -(2**80), 1e308, "", "x" * 5000, "../../etc/passwd", [], {}, [1, "a"],
              {"nested": {"deeper": []}}, "\udcff"]


def invalid_bodies(rng: random.Random, template: dict, completions: bool) -> list[bytes]:
    """Bodies that no schema accepts: broken JSON, a field of the wrong kind, a required field gone,
    an unknown field (except for completions, which ignore unknown fields as OpenAI's API does)."""
    bodies = list(NOT_JSON)
    for special in ("Infinity", "-Infinity", "NaN", "-1", "1e400"):
        for key, value in template.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                bodies.append(json.dumps({**template, key: "@"}).replace('"@"', special).encode())
    while len(bodies) < CASES_PER_ROUTE:
        body = dict(template)
        key = rng.choice(sorted(body))
        how = rng.choice(["wrong", "missing", "unknown"] if not completions else ["wrong", "missing"])
        if how == "missing":
            del body[key]
            if not _required(key, template, completions):
                body[key] = {"surely": "wrong"}
        elif how == "unknown":
            body[f"unexpected_{rng.randrange(1000)}"] = rng.choice(ODD_VALUES)
        else:
            body[key] = _wrong_for(rng, template[key])
        bodies.append(json.dumps(body, default=str, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    return bodies


def _required(key: str, template: dict, completions: bool) -> bool:
    # Keys with defaults: dropping them leaves a valid body, so they get a wrong value instead.
    optional = {"lease_s": False, "inline": True, "fail": True, "max_tokens": True, "temperature": True,
                "attempt": False, "sibling": False}
    return not optional.get(key, False) and not (completions and key != "prompt")


def _wrong_for(rng: random.Random, value):
    if isinstance(value, bool):
        return rng.choice(["yes", [], {}, None])
    if isinstance(value, (int, float)):
        return rng.choice(["seven", [], {}, None, -1e9])
    if isinstance(value, str):
        return rng.choice([None, 5, [], {}, "\udcff" * 3, 1.5])
    if isinstance(value, list):
        return rng.choice([None, "list?", {"a": 1}, [[["deep"]]], [-1, 2**70]])
    return rng.choice([None, "table?", [1, 2], 7])


async def fingerprint(session: aiohttp.ClientSession, env_url: str, policy_url: str, auth: dict) -> dict:
    """What a request must not change: the servers' own accounts of their work and their gates."""
    state = {}
    for name, url in (("env", env_url), ("policy", policy_url)):
        async with session.get(f"{url}/health") as resp:
            health = await resp.json()
        async with session.get(f"{url}/checkpoint/status", headers=auth) as resp:
            status = await resp.json()
        health.pop("expired_results", None)
        for volatile in ("uptime_s", "requests", "served", "completions", "policy_version_age_s", "tokens_generated",
                         "policy_engines"):
            health.pop(volatile, None)
        status.pop("lease_remaining_s", None)
        state[name] = {"health": health, "status": status}
    return state


async def raw_request(url: str, head: bytes) -> int:
    """Headers as raw bytes (a client library refuses to send what these send); returns the status."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(head)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
        return int(status_line.split()[1])
    finally:
        writer.close()


def test_malformed_requests_get_4xx_and_change_nothing(stack) -> None:
    rng = random.Random(SEED)
    auth = {"Authorization": f"Bearer {stack.control_token}"}
    statuses: Counter[int] = Counter()
    failures: list[str] = []

    async def post(session, url: str, path: str, body: bytes, headers: dict) -> None:
        try:
            async with session.post(f"{url}{path}", data=body, headers=headers) as resp:
                text = await resp.text()
                statuses[resp.status] += 1
                if resp.status >= 500 or resp.status < 400 or not text.strip():
                    failures.append(f"{path} {resp.status} {text[:200]!r} for {body[:120]!r}")
        except aiohttp.ClientError as err:
            failures.append(f"{path}: connection {type(err).__name__} for {body[:120]!r}")

    async def scenario() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            before = await fingerprint(session, stack.env_url, stack.policy_url, auth)
            for url, routes in ((stack.env_url, ENV_POSTS), (stack.policy_url, POLICY_POSTS)):
                for path, template in routes.items():
                    for body in invalid_bodies(rng, template, completions=path == "/v1/completions"):
                        await post(session, url, path, body, {**auth, "Content-Type": "application/json"})
                    if path != "/v1/completions":
                        # Without the token even a valid body is refused, unread.
                        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
                            await post(session, url, path, json.dumps(template).encode(), headers)
                for query in ("", "?checkpoint_id=", "?checkpoint_id=%FF%FE", "?checkpoint_id=" + "x" * 3000):
                    async with session.get(f"{url}/checkpoint/status{query}", headers=auth) as resp:
                        statuses[resp.status] += 1
                        if resp.status >= 500:
                            failures.append(f"GET status{query[:40]} {resp.status}")
            # An oversized body is refused from its declared length, before it is sent or read.
            for url, path in ((stack.env_url, "/ack"), (stack.env_url, "/checkpoint/prepare"),
                              (stack.policy_url, "/v1/completions"), (stack.policy_url, "/checkpoint/abort")):
                host = urlsplit(url).netloc.encode()
                token = f"Bearer {stack.control_token}".encode()
                for auth_value in (token, b"Bearer \xff\xfe\xfd"):
                    head = (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: " + host + b"\r\nAuthorization: "
                            + auth_value + b"\r\nContent-Length: 1000000000\r\n\r\n")
                    status = await raw_request(url, head)
                    statuses[status] += 1
                    if not 400 <= status < 500:
                        failures.append(f"{path} declared 1 GB ({auth_value[:9]!r}): {status}")
            after = await fingerprint(session, stack.env_url, stack.policy_url, auth)
            assert after == before, f"state changed:\nbefore {before}\nafter  {after}"

    asyncio.run(scenario())
    total = sum(statuses.values())
    print(f"\nfuzz: {total} requests, {sum(n for s, n in statuses.items() if 400 <= s < 500)} answered 4xx, "
          f"{sum(n for s, n in statuses.items() if s >= 500)} answered 5xx; by status {dict(sorted(statuses.items()))}")
    assert not failures, f"{len(failures)} of {total} requests not answered 4xx:\n" + "\n".join(failures[:30])
