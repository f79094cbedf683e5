"""`envfactory mcp config`: configurations an outside client can use from anywhere, in each client's format."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envfactory.config import Settings
from envfactory.serve.clients import HUB, ClientConfigError, client_config
from tests.support.paths import ROOT


def test_stdio_entries_name_this_interpreter_and_the_project_folder() -> None:
    settings = Settings(root=ROOT)
    config = client_config(settings, "claude-desktop", ["hotels", "banking"], hub=True)
    servers = config["mcpServers"]
    assert set(servers) == {"hotels", "banking", HUB}
    for name in ("hotels", "banking"):
        entry = servers[name]
        assert entry["command"] == sys.executable and Path(entry["command"]).is_absolute()
        assert entry["args"] == ["-m", "envfactory.cli", "serve", name, "--transport", "stdio"]
        assert entry["env"] == {"ENVFACTORY_ROOT": str(ROOT)}
    assert servers[HUB]["args"][2:4] == ["hub", "serve"]
    every = client_config(settings)["mcpServers"]
    assert "hotels" in every and "bfcl_math" in every  # default: the whole registry
    vscode = client_config(settings, "vscode", ["hotels"])
    assert vscode["servers"]["hotels"]["type"] == "stdio"
    assert client_config(settings, "cursor", ["hotels"], url="http://127.0.0.1:8000/mcp") == {
        "mcpServers": {"hotels": {"url": "http://127.0.0.1:8000/mcp"}}
    }


def test_bad_requests_are_one_clear_error() -> None:
    settings = Settings(root=ROOT)
    with pytest.raises(ClientConfigError, match="unknown client 'emacs'"):
        client_config(settings, "emacs")
    with pytest.raises(ClientConfigError, match=r"not in the registry .*: nope; registered: .*hotels"):
        client_config(settings, "generic", ["nope"])
    with pytest.raises(ClientConfigError, match="stdio only"):
        client_config(settings, "claude-desktop", ["hotels"], url="http://x/mcp")
    for url in ("notaurl", "ftp://host/mcp", "http:///mcp", "file:///etc/passwd"):
        with pytest.raises(ClientConfigError, match="http\\(s\\) address"):
            client_config(settings, "cursor", ["hotels"], url=url)
    with pytest.raises(ClientConfigError, match="one running server"):  # was: one entry, named envfactory
        client_config(settings, "cursor", ["hotels", "banking"], url="http://127.0.0.1:8000/mcp")
    with pytest.raises(ClientConfigError, match="one running server"):  # was: --hub silently dropped
        client_config(settings, "cursor", ["hotels"], hub=True, url="http://127.0.0.1:8000/mcp")
    assert list(client_config(settings, "Cursor", ["hotels"])["mcpServers"]) == ["hotels"]  # any case


def _starts(entry: dict[str, object], folder: Path) -> None:
    """What a client does with an entry: run it with a bare PATH in some folder, and speak MCP over stdio."""
    request = {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
    }  # fmt: skip
    res = subprocess.run(
        [entry["command"], *entry["args"]],  # type: ignore[misc]
        input=json.dumps(request) + "\n", cwd=folder, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", **entry["env"]},  # type: ignore[dict-item]
    )  # fmt: skip
    assert res.stdout, res.stderr[-1000:]
    first = json.loads(res.stdout.splitlines()[0])
    assert first["id"] == 1 and first["result"]["serverInfo"]["name"], res.stderr[-1000:]


def test_environments_outside_the_projects_envs_start_from_their_entries(tmp_path: Path) -> None:
    """A compiled environment's registry entry, or one of a pool folder of the user's, was `serve NAME` alone: started
    by a client, the server found no such environment (those folders are known only from ENVFACTORY_COMPILED_DIR
    and ENVFACTORY_ENVS_DIR), and the hub's entry served the bundled pool. The entries now carry them."""
    import shutil

    from envfactory.compiler.build import write_compiled
    from envfactory.compiler.compile import compile_spec
    from envfactory.compiler.scenarios import generate_scenarios
    from envfactory.env.pool import EnvPool
    from envfactory.env.registry import load_registry
    from envfactory.envgen.openapi import load_openapi
    from envfactory.envgen.validate import sync_registry, validate_env
    from tests.support.paths import TEST_DATA

    spec = load_openapi(TEST_DATA / "corpus" / "api" / "googleapis.com" / "tasks.json")
    plan, _ = compile_spec(spec, name="tasks", domain="office", source="openapi:googleapis.com/tasks")
    compiled = tmp_path / "compiled"
    write_compiled(compiled / "tasks", plan, generate_scenarios(plan))
    mine = tmp_path / "myenvs"
    shutil.copytree(ROOT / "envs" / "hotels", mine / "hotels")  # trusted: its hash is pinned in the trust file
    registry = tmp_path / "mcp_server.json"
    with pytest.raises(ClientConfigError, match=r"no environment is registered in .*envs validate"):
        client_config(Settings(root=ROOT, registry_path=registry))
    settings = Settings(root=ROOT, compiled_dir=compiled, registry_path=registry, bfcl=False)
    pool = EnvPool(settings)
    sync_registry(pool, [validate_env(pool, "tasks"), validate_env(pool, "banking")])
    entries = load_registry(registry).mcpServers
    assert entries["tasks"].env == {"ENVFACTORY_COMPILED_DIR": str(compiled.resolve())}
    assert entries["banking"].env is None and "env" not in json.loads(registry.read_text())["mcpServers"]["banking"]
    users = Settings(root=ROOT, envs_dir=mine, registry_path=registry, bfcl=False)
    sync_registry(EnvPool(users), [validate_env(EnvPool(users), "hotels")])
    assert load_registry(registry).mcpServers["hotels"].env == {"ENVFACTORY_ENVS_DIR": str(mine.resolve())}
    config = client_config(Settings(root=ROOT, registry_path=registry), "generic", ["tasks", "hotels"])["mcpServers"]
    _starts(config["tasks"], tmp_path)
    _starts(config["hotels"], tmp_path)
    hub = client_config(settings, "generic", ["tasks"], hub=True)["mcpServers"][HUB]
    assert hub["env"]["ENVFACTORY_COMPILED_DIR"] == str(compiled.resolve())


def test_the_printed_command_starts_the_server_from_another_folder(tmp_path: Path) -> None:
    """What a client does with the entry: run it with a bare PATH in some folder, and speak MCP over stdio."""
    entry = client_config(Settings(root=ROOT), "generic", ["hotels"])["mcpServers"]["hotels"]
    request = {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
    }  # fmt: skip
    res = subprocess.run(
        [entry["command"], *entry["args"]],
        input=json.dumps(request) + "\n", cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", **entry["env"]},
    )  # fmt: skip
    first = json.loads(res.stdout.splitlines()[0])
    assert first["id"] == 1 and first["result"]["serverInfo"]["name"], res.stderr[-1000:]
    assert os.path.isabs(entry["command"])


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("LD_PRELOAD", "/tmp/x.so"),
        ("ENVFACTORY_UNSAFE_NO_OS_SANDBOX", "1"),
        ("ENVFACTORY_TRUST_PATH", "/tmp/evil_trusted.json"),
        ("PYTHONPATH", "/tmp"),
        ("ENVFACTORY_ENVS_DIR", "/tmp/a\nLD_PRELOAD=/x"),
    ],
)
def test_a_registry_entry_sets_only_the_folders_its_environment_lives_in(tmp_path: Path, key: str, value: str) -> None:
    """An entry's `env` went unchecked into the configurations `mcp config` writes: a hand-edited registry could
    switch the started server's sandbox off, point it at another trust file or preload a library. Only
    ENVFACTORY_COMPILED_DIR and ENVFACTORY_ENVS_DIR, each a path on one line, are read now."""
    from envfactory.env.registry import RegistryError

    registry = tmp_path / "mcp_server.json"
    entry = {"args": ["serve", "x"], "domain": "d", "tools": 1, "write_tools": 0, "source": "s", "env": {key: value}}
    registry.write_text(json.dumps({"mcpServers": {"x": entry}}))
    with pytest.raises(RegistryError, match="env"):
        client_config(Settings(root=ROOT, registry_path=registry), "generic", ["x"])
    entry["env"] = {"ENVFACTORY_ENVS_DIR": str(tmp_path)}
    registry.write_text(json.dumps({"mcpServers": {"x": entry}}))
    config = client_config(Settings(root=ROOT, registry_path=registry), "generic", ["x"])["mcpServers"]["x"]
    assert config["env"]["ENVFACTORY_ENVS_DIR"] == str(tmp_path)
