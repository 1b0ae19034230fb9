"""Run by the NeMo Gym venv's python (nemo-gym needs Python >= 3.12, turnkeep runs on 3.11), never imported by turnkeep.

    python nemo_gym_launch.py describe SERVER     # JSON: where the server's app and config are, what it needs
    python nemo_gym_launch.py serve FOLDER CONFIG NAME PORT

`describe` finds a resources server bundled in the installed nemo_gym by name (`resources_servers/<name>`), or by a
path to its app folder or to one of its configs/*.yaml, and reads that config: the instance name of its resources
server, the agents the config declares (name: agent type) and a reason the adapter cannot run it (its server config
names a model server: its verify calls a judge model), or null.

`serve` starts the resources server alone, as `ng_run` would start it, without the head server and without the Ray
cluster `run_webserver` starts (turnkeep plays the agent, and only the resources server's own routes are used): the
config reaches the server the way `ng_run` hands it to each server it spawns, in NEMO_GYM_CONFIG_DICT and
NEMO_GYM_CONFIG_PATH.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

MODEL_SERVERS = "responses_api_models"


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "describe":
        print(json.dumps(describe(argv[1])))
        return 0
    if len(argv) == 5 and argv[0] == "serve":
        serve(Path(argv[1]), Path(argv[2]), argv[3], int(argv[4]))
        return 0
    print("usage: nemo_gym_launch.py describe SERVER | serve FOLDER CONFIG NAME PORT", file=sys.stderr)
    return 2


def describe(server: str) -> dict:
    import resources_servers  # late: only this venv has NeMo Gym's packages
    from omegaconf import OmegaConf  # late: only this venv has NeMo Gym's packages

    path = Path(server).expanduser()
    if path.suffix in (".yaml", ".yml"):
        folder, configs = path.resolve().parent.parent, [path.resolve()]
    else:
        folder = path.resolve() if path.is_dir() else Path(list(resources_servers.__path__)[0]) / server
        own = folder / "configs" / f"{folder.name}.yaml"
        configs = [own] + sorted(p for p in (folder / "configs").glob("*.yaml") if p != own)
    if not (folder / "app.py").is_file():
        return {"error": f"no resources server {server!r}: {folder} has no app.py (name a folder of "
                         f"{list(resources_servers.__path__)[0]}, or give the path of an app folder or its config)"}
    for config in configs:
        if not config.is_file():
            continue
        whole = OmegaConf.to_container(OmegaConf.load(config), resolve=False)
        for name, block in whole.items():
            inner = (block or {}).get("resources_servers") if isinstance(block, dict) else None
            if isinstance(inner, dict) and inner:
                return {"folder": str(folder), "config": str(config), "name": name,
                        "agents": _agents(whole), "refusal": _refusal(name, inner)}
    return {"error": f"{folder}: no config under configs/ declares a resources server (resources_servers: ...)"}


def _agents(whole: dict) -> dict[str, str]:
    agents = {}
    for name, block in whole.items():
        inner = block.get("responses_api_agents") if isinstance(block, dict) else None
        if isinstance(inner, dict) and inner:
            agents[name] = next(iter(inner))
    return agents


def _refusal(name: str, inner: dict) -> str | None:
    """Why the server cannot run under turnkeep: it calls a model server (a judge) that is not the run's policy."""
    def walk(value, where):
        if isinstance(value, dict):
            if value.get("type") == MODEL_SERVERS:
                return f"{where} = {value.get('name')!r}"
            for key, item in value.items():
                found = walk(item, f"{where}.{key}" if where else str(key))
                if found:
                    return found
        return None

    found = walk(inner, "")
    if found is None:
        return None
    return (f"resources server {name!r} calls a model server ({found}), a judge turnkeep cannot serve; pick a server "
            f"whose verify needs no model")


def serve(folder: Path, config: Path, name: str, port: int) -> None:
    from omegaconf import OmegaConf  # late: only this venv has NeMo Gym's packages

    whole = OmegaConf.to_container(OmegaConf.load(config), resolve=False)
    block = whole[name]
    inner = next(iter(block["resources_servers"].values()))
    inner.update(host="127.0.0.1", port=port, num_workers=None)
    inner.setdefault("entrypoint", "app.py")
    global_config = {name: block, "head_server": {"host": "127.0.0.1", "port": 0}}
    os.environ["NEMO_GYM_CONFIG_DICT"] = OmegaConf.to_yaml(OmegaConf.create(global_config))
    os.environ["NEMO_GYM_CONFIG_PATH"] = name
    sys.path.insert(0, str(folder.parent.parent))
    app = _app(folder, inner["entrypoint"])
    import uvicorn  # late: only this venv has NeMo Gym's packages

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=0.5)


def _app(folder: Path, entrypoint: str):
    from nemo_gym.base_resources_server import SimpleResourcesServer  # late: only this venv has NeMo Gym
    from nemo_gym.global_config import get_global_config_dict  # late: only this venv has NeMo Gym
    from nemo_gym.server_utils import ServerClient  # late: only this venv has NeMo Gym

    module = importlib.import_module(f"{folder.parent.name}.{folder.name}.{Path(entrypoint).stem}")
    classes = [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, SimpleResourcesServer)
               and c.__module__ == module.__name__]
    if not classes:
        raise SystemExit(f"{folder / entrypoint} defines no SimpleResourcesServer subclass")
    cls = next(c for c in classes if not any(o is not c and issubclass(o, c) for o in classes))
    client = ServerClient(head_server_config=ServerClient.load_head_server_config(),
                          global_config_dict=get_global_config_dict())
    server = cls(config=cls.load_config_from_global_config(), server_client=client)
    app = server.setup_webserver()
    server.setup_liveness(app)
    server.setup_exception_middleware(app)
    print(f"serving {cls.__name__} on 127.0.0.1:{server.config.port}", flush=True)
    return app


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
