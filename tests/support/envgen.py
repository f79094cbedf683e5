"""Shared set-up for EnvGen tests: a temporary project, scripted models, graph runs, node sequences."""

from __future__ import annotations

import shutil
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import yaml

from envfactory.config import get_settings
from envfactory.llm.scripted import reset_scripted_models
from envfactory_agents.common import reset_model_cache
from graphs.checkpoint import open_checkpointer
from graphs.envgen import EnvGenContext, build
from tests.support.paths import ROOT, TEST_DATA

DATA = TEST_DATA / "envgen"
METADATA = DATA / "notebook_metadata.json"


GOOD = (DATA / "notes_good.py").read_text()

# Broken variants of the good code, as a Code Agent might write them: (text to find, replacement).
VARIANTS: dict[str, tuple[str, str]] = {
    # a critical interface error: the tool the metadata names is missing
    "bug": ("def delete_note(", "def remove_note("),
    # a behaviour bug only executed checks catch: it reports success and deletes nothing
    "nodelete": ('    return db.delete("notes", note_id)', '    return db.get("notes", note_id, "note")'),
    # rejected by the static check
    "subprocess": ("from __future__ import annotations\n", "from __future__ import annotations\n\nimport subprocess\n"),
    # never returns: killed by the sandbox's time limit
    "loop": ("    q = query.lower()\n", "    q = query.lower()\n    while True:\n        q = q + ''\n"),
    # allocates without bound at import: killed by the memory limit
    "alloc": (
        "env = Environment(",
        "_CACHE = []\nwhile True:\n    _CACHE.append('x' * 10_000_000)\n\nenv = Environment(",
    ),
}


def code(name: str) -> str:
    if name == "good":
        return GOOD
    find, replace = VARIANTS[name]
    assert find in GOOD, f"variant '{name}' no longer applies to notes_good.py"
    return GOOD.replace(find, replace, 1)


def fenced(text: str) -> str:
    return f"Here is env.py:\n\n```python\n{text}```\n"


SCENARIOS = (DATA / "notebook_scenarios.json").read_text()


def setup_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: dict[str, list[Any]]) -> Path:
    """A temporary project (one pool env, repo prompts) whose LLM replays `script` (prompt -> answers)."""
    root = tmp_path / "project"
    shutil.copytree(ROOT / "envs" / "hotels", root / "envs" / "hotels")
    (root / "configs").mkdir()  # the reviewed hotels code stays trusted in the copy (its hash is pinned)
    shutil.copy(ROOT / "configs" / "trusted.json", root / "configs" / "trusted.json")
    script_path = tmp_path / "script.yaml"
    script_path.write_text(yaml.safe_dump(script, sort_keys=False))
    for key, value in env_vars(root, script_path).items():
        monkeypatch.setenv(key, value)
    reset_model_cache()
    reset_scripted_models()
    return root


def env_vars(root: Path, script_path: Path) -> dict[str, str]:
    return {
        "ENVFACTORY_ROOT": str(root),
        "ENVFACTORY_DATA_DIR": str(root / ".envfactory"),
        "ENVFACTORY_PROMPTS_DIR": str(ROOT / "prompts"),
        "ENVFACTORY_BFCL": "false",
        "ENVFACTORY_LLM__PROVIDER": "scripted",
        "ENVFACTORY_LLM__SCRIPT": str(script_path),
        # a limit, not a wait: room for a slow interpreter start on a loaded CI machine (CI once saw a 4 s clock
        # beat the memory limit); a hanging tool is still caught by the per-call limit, a quarter of it
        "ENVFACTORY_SANDBOX_TIMEOUT_S": "12",
        "ENVFACTORY_SANDBOX_MEMORY_MB": "512",
        "HF_HUB_OFFLINE": "1",
    }


def run_graph(
    request: dict[str, Any], ctx: EnvGenContext | None = None, thread: str = "t1", **kwargs: Any
) -> tuple[dict[str, Any], list[str]]:
    """Run (or resume, with request=None) one thread in-process; return its final values and node sequence."""
    with open_checkpointer(get_settings()) as saver:
        graph = build(saver)
        cfg: Any = {"configurable": {"thread_id": thread}}
        payload = None if request is None else {"request": request}
        graph.invoke(payload, cfg, context=ctx or EnvGenContext(), durability="sync", **kwargs)
        return dict(graph.get_state(cfg).values), node_sequence(graph, thread)


def node_sequence(graph: Any, thread: str) -> list[str]:
    """The nodes that ran, in order, read from the checkpoint history (what was `next` before each step)."""
    snaps = list(reversed(list(graph.get_state_history({"configurable": {"thread_id": thread}}))))
    ran: list[str] = []
    for before, after in pairwise(snaps):
        if after.metadata and after.metadata.get("source") == "loop":
            ran.extend(n for n in before.next if n != "__start__")
    return ran


def metadata_request() -> dict[str, Any]:
    return {"metadata_path": str(METADATA)}


def scripted_calls(prompt: str) -> list[str]:
    """Every conversation the scripted model received for `prompt`, as one text each, in order."""
    from envfactory_agents.common import _MODELS

    seen: dict[int, str] = {}
    for model in _MODELS.values():  # models of several roles share one replay of the script file
        for call in getattr(model, "calls", []):
            if call.prompt == prompt:
                seen[call.index] = "\n".join(str(m.content) for m in call.messages)
    return [seen[i] for i in sorted(seen)]
