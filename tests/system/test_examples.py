"""Every file in examples/ is a working input for the command its README names: run here, end to end."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from envfactory.compiler.build import BuildSettings, SpecJob, build_one
from envfactory.envgen.openapi import openapi_to_metadata
from tests.support.paths import ROOT

EXAMPLES = ROOT / "examples"


def project(tmp_path: Path) -> dict[str, str]:
    """A scratch project (three bundled environments, the reviewed pins, the repo's prompts) for the CLI."""
    root = tmp_path / "project"
    for name in ("hotels", "banking", "calendar"):
        shutil.copytree(ROOT / "envs" / name, root / "envs" / name)
    shutil.copytree(ROOT / "configs", root / "configs")
    return {
        **os.environ,
        "ENVFACTORY_ROOT": str(root),
        "ENVFACTORY_PROMPTS_DIR": str(ROOT / "prompts"),
        "ENVFACTORY_BFCL": "false",
        "COLUMNS": "200",
    }


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "envfactory.cli", *args], env=env, capture_output=True, text=True, timeout=600
    )


def test_every_example_is_listed_in_its_readme() -> None:
    readme = (EXAMPLES / "README.md").read_text()
    files = {p.relative_to(EXAMPLES).as_posix() for p in EXAMPLES.rglob("*") if p.is_file() and p.name != "README.md"}
    assert files and all(f"`{f}`" in readme for f in files), files


def test_the_scripted_model_writes_the_example_environment(tmp_path: Path) -> None:
    env = project(tmp_path) | {
        "ENVFACTORY_LLM__PROVIDER": "scripted",
        "ENVFACTORY_LLM__SCRIPT": str(EXAMPLES / "script.yaml"),
        "ENVFACTORY_SANDBOX_TIMEOUT_S": "12",
    }
    res = cli(env, "envgen", "run", "--metadata", str(EXAMPLES / "metadata.json"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "registered" in res.stdout
    listed = cli(env, "envs", "list", "--native")
    assert "notebook" in listed.stdout, listed


def test_the_synth_plan_runs_offline(tmp_path: Path) -> None:
    env = project(tmp_path)
    plan = yaml.safe_load((EXAMPLES / "synth.yaml").read_text())
    res = cli(env, "synth", "--config", str(EXAMPLES / "synth.yaml"), "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stdout + res.stderr
    kept = (tmp_path / "run" / "conversations.jsonl").read_text().splitlines()
    assert kept and (tmp_path / "run" / "heldout.jsonl").is_file()
    assert {line.split('"env":"')[1].split('"')[0] for line in kept if '"env":"' in line} <= set(plan["envs"])
    assert "dropped.jsonl" in res.stdout  # the run says where the drop reasons are


def test_the_openapi_example_converts_and_compiles(tmp_path: Path) -> None:
    spec = EXAMPLES / "openapi" / "google_tasks.json"
    meta = openapi_to_metadata(spec, name="google_tasks", domain="office")
    assert len(meta.tools) >= 5
    report = build_one(
        SpecJob(spec_id="examples/google_tasks", path=spec, name="google_tasks"), tmp_path, BuildSettings()
    )
    assert report.status == "healthy", report
    assert (tmp_path / "google_tasks" / "compiled.json").is_file()


@pytest.mark.parametrize("name", ["metadata.json", "openapi/google_tasks.json"])
def test_example_documents_are_valid_json(name: str) -> None:
    import json

    assert isinstance(json.loads((EXAMPLES / name).read_text()), dict)
