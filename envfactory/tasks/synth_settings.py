"""What shapes a synth run's conversations, recorded in its folder (`settings.json`, `envfactory.run_settings`).

Compared on a resume: the config less what only says where and how fast (`out`, `concurrency`, `plot`), and in
llm mode each QueryGen role's model and sampling. Recorded, not compared: a `run_id` (new whenever the record is
written anew; llm mode's checkpoint threads are named by it), the config file and the tool graph with their
sha256s (the graph may be built by the run itself, so the first run cannot fingerprint it in advance).
A resume into the same folder with other settings would write units of another plan, or of another model, beside
those already there: it is refused before any unit runs, naming what differs.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envfactory.config import QUERYGEN_ROLES, Settings
from envfactory.env.pool import EnvPool
from envfactory.records.run_folder import CONVERSATIONS, DROPPED, HELDOUT
from envfactory.run_settings import RunRecord, file_sha256, has_lines, model_identity, read_record, record_or_check
from envfactory.tasks.plan import SynthConfig
from envfactory.toolgraph.settings import SAMPLING, envs_graph_path, graph_path


def graph_file(
    settings: Settings, config: SynthConfig, envs: Sequence[str] | None = None, pool: EnvPool | None = None
) -> Path:
    """The tool graph file a synth run over `envs` reads, in this order: the config's `graph`; the one the run's
    folder recorded (a resume reads the graph its first part read, whatever was built since); the graph of the run's
    environments alone (`envs_graph_path`) when it exists; the data dir's (what `envfactory graph build` writes)
    when it exists; else the run's own, to be built (with a compiled corpus in the pool, the whole pool's graph is
    ~140k texts to embed, ~16 min here). No environments (None, or none): the data dir's. `pool`: the caller's,
    else one over `settings` (the environments' own graph is named by their tools, `envs_graph_path`)."""
    if config.graph is not None:  # as `choose_envs` checked it, and as `out` is read: `~` expanded, under the cwd
        return config.graph.expanduser().resolve()
    recorded = read_record(config.folder())
    graph = recorded.context.get("tool_graph") if recorded is not None and recorded.command == "synth" else None
    if isinstance(graph, str) and Path(graph).is_file():
        return Path(graph)
    whole = graph_path(settings)
    if not envs:
        return whole
    own = envs_graph_path(settings, envs, pool if pool is not None else EnvPool(settings))
    return own if own.exists() or not whole.exists() else whole


NOT_SHAPING = {"out", "concurrency", "plot"}


def synth_record(
    config: SynthConfig,
    settings: Settings,
    config_file: Path | None = None,
    envs: Sequence[str] | None = None,
    pool: EnvPool | None = None,
) -> RunRecord:
    shaping: dict[str, Any] = config.model_dump(mode="json", exclude=NOT_SHAPING)
    if envs is not None:  # the environments the run chose (no `envs`: every trusted one the pool has now)
        shaping["environments"] = list(envs)
    # the wording and prompts the run reads: a resume with other ones would mix two wordings in one dataset
    shaping["prompts_sha256"] = file_sha256(sorted(p for p in settings.prompts_path.rglob("*.yaml") if p.is_file()))
    # how chains are sampled (`ENVFACTORY_TOOLGRAPH__MAX_SERVERS`...), where it is not the default: a resume with
    # others would plan other chains under the same unit keys (left out at the defaults, as runs before recorded)
    sampling = settings.toolgraph.model_dump(mode="json", include=set(SAMPLING), exclude_defaults=True)
    if sampling:
        shaping["sampling"] = sampling
    if config.mode == "llm":
        shaping["models"] = {r: model_identity(settings, r).model_dump() for r in QUERYGEN_ROLES}
    graph = graph_file(settings, config, envs, pool)
    # names the run (its QueryGen threads, graphs.querygen.batch): kept while the record is, new with a new record
    context: dict[str, Any] = {"run_id": uuid.uuid4().hex, "tool_graph": str(graph)}
    if graph.is_file():
        context["tool_graph_sha256"] = file_sha256([graph])
    if config_file is not None:
        context |= {"config": str(config_file.resolve()), "config_sha256": file_sha256([config_file])}
    return RunRecord(command="synth", settings=shaping, context=context)


def record_synth_settings(
    config: SynthConfig,
    settings: Settings,
    config_file: Path | None = None,
    envs: Sequence[str] | None = None,
    pool: EnvPool | None = None,
) -> Path:
    """Before any unit runs: record the run's settings (and the tool graph file a run over `envs` reads) in its
    folder, or refuse a resume made otherwise. Returns the folder."""
    folder = config.folder()
    holds = any(has_lines(folder / name) for name in (CONVERSATIONS, HELDOUT, DROPPED))
    record = synth_record(config, settings, config_file, envs, pool)
    earlier = read_record(folder)
    if earlier is not None and earlier.command == "synth" and "run_id" not in earlier.context:
        # recorded before runs kept their sampling settings (or a run_id): how that run sampled is not known, so a
        # resume is not refused for it (it was refused with "sampling...: (none) → 100", though it sampled so)
        record.settings.pop("sampling", None)
    record_or_check(folder, record, holds_results=holds)
    return folder
