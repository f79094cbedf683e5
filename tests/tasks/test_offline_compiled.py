"""The offline path over environments compiled from real API specs: initial states from the compiled
scenario generator (a core batch and distractor batches, seeded per unit), π* on compiled tools, requests
worded from the spec by rule, every kept conversation verified; the same seed gives the same records."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from envfactory.compiler.build import BuildSettings, SpecJob, build_many
from envfactory.config import Settings
from envfactory.env.compiled import CompiledEnvironment
from envfactory.env.pool import EnvPool
from envfactory.envgen.health import HealthSettings
from envfactory.envgen.openapi import identifier
from envfactory.records.run_folder import CONVERSATIONS, DROPPED
from envfactory.tasks.conversation import _in_place, _naming, _noun_forms, _qualified_naming, imperative
from envfactory.tasks.initial_state import generate_initial_state
from envfactory.tasks.pi_star import _hollow
from envfactory.tasks.plan import SynthConfig, load_conversations, plan_units, run_units
from envfactory.tasks.quality import measure
from envfactory.tasks.run import OfflineRunner
from envfactory.toolgraph.build import build_tool_graph
from envfactory.toolgraph.collect import pool_sources
from envfactory.toolgraph.graph import ToolGraph
from envfactory.words import is_bookkeeping, snake_case, spoken_name
from tests.support.paths import ROOT, TEST_DATA
from tests.tasks.test_offline import check_conversation

CORPUS = TEST_DATA / "corpus" / "api"
SPECS = [
    "googleapis.com/tasks.json",
    "twilio.com/twilio_studio_v2.json",
    "xero.com/xero_assets.json",
    "reverb.com.json",
]


class _OrthogonalEmbedder:
    """Every distinct text its own axis: only the schema edges join tools (fast, no model)."""

    model_name = "orthogonal"

    def __init__(self) -> None:
        self.axes: dict[str, int] = {}

    @property
    def dim(self) -> int:
        return 8192

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        for t in texts:
            self.axes.setdefault(t, len(self.axes) % self.dim)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for r, t in enumerate(texts):
            out[r, self.axes[t]] = 1.0
        return out


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Settings, EnvPool, ToolGraph]:
    out = tmp_path_factory.mktemp("compiled")
    jobs = [SpecJob(spec_id=s, path=CORPUS / s, name=identifier(Path(s).stem)) for s in SPECS]
    quick = BuildSettings(health=HealthSettings(calls=15, scenarios=2, solver_seeds=2, reach_scenarios=10))
    list(build_many(jobs, out, quick))
    empty = tmp_path_factory.mktemp("envs")
    settings = Settings(root=ROOT, envs_dir=empty, compiled_dir=out, bfcl=False)
    pool = EnvPool(settings)
    assert len(pool.native_names()) >= 3
    graph, _ = build_tool_graph(pool_sources(pool), _OrthogonalEmbedder())  # type: ignore[arg-type]
    return settings, pool, graph


def _run(settings: Settings, pool: EnvPool, graph: ToolGraph, out: Path) -> None:
    config = SynthConfig.model_validate({"T": 3, "S": 1, "D": 2, "seed": 3, "out": out, "plot": False})
    plan = plan_units(config, pool, graph)
    assert plan.envs == pool.native_names()  # compiled environments are candidates by default
    run_units(plan.units, OfflineRunner(settings, pool), out, concurrency=1)


def test_initial_states_of_a_compiled_environment(compiled: tuple[Settings, EnvPool, ToolGraph]) -> None:
    _, pool, _ = compiled
    env = pool.get(pool.native_names()[0])
    assert isinstance(env, CompiledEnvironment)
    one = generate_initial_state(env, seed=5, depth=1)
    two = generate_initial_state(env, seed=5, depth=3)
    assert generate_initial_state(env, seed=5, depth=3) == two  # seeded
    assert generate_initial_state(env, seed=6, depth=3).config != two.config
    top = [r.name for r in env.plan.resources if r.parent is None]
    for name in top:
        assert set(one.core_ids[name]) <= set(one.config[name]) and one.distractor_ids[name] == []
        assert len(two.config[name]) == len(two.core_ids[name]) + len(two.distractor_ids[name])
        assert not set(two.core_ids[name]) & set(two.distractor_ids[name])
    assert sum(len(two.distractor_ids[n]) for n in top) > 0  # distractor batches hold more records
    env.new_state(two.config)  # loads: schemas, references


def test_a_records_named_fields_hold_values_of_their_kind(compiled: tuple[Settings, EnvPool, ToolGraph]) -> None:
    """Every compiled environment's generated records: a field the spec says nothing of but its name (a version,
    a location, a type, a path) holds a value of that kind, not a dictionary word ("runtime version interview")."""
    from faker.providers.lorem.en_US import Provider as Lorem

    from envfactory.tasks.values import _NAMED

    _, pool, _ = compiled
    checked = 0
    for name in pool.native_names():
        env = pool.get(name)
        assert isinstance(env, CompiledEnvironment)
        config = generate_initial_state(env, seed=11, depth=2).config
        for r in env.plan.resources:
            props = r.record_schema.get("properties", {})
            for record in config[r.name].values():
                for field, value in record.items():
                    schema = props.get(field, {})
                    plain = schema.get("type") == "string" and not {"enum", "format", "pattern"} & set(schema)
                    if plain and any(p.search(snake_case(field)) for p, _ in _NAMED):
                        checked += 1
                        assert value not in Lorem.word_list, (name, r.name, field, value)
    assert checked >= 5


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def test_offline_synth_over_compiled_environments(
    compiled: tuple[Settings, EnvPool, ToolGraph], tmp_path: Path
) -> None:
    settings, pool, graph = compiled
    _run(settings, pool, graph, tmp_path / "a")
    kept = load_conversations(tmp_path / "a")
    assert len(kept) >= 4, (tmp_path / "a" / DROPPED).read_text()
    for conv in kept:
        check_conversation(pool, conv)  # every turn verified, v(Db0) = 0, v(Exec(π*, Db0)) = 1
        assert all(pool.compiled(s) for s in conv.servers)
    figures = measure(kept)
    assert figures.incoherent_id_arguments == 0  # every id came back from an earlier call
    assert figures.turns_per_conversation >= 2
    requests = [n.query for c in kept for n in c.nodes]
    assert not any("{" in r or "}" in r for r in requests)  # no placeholder left unfilled
    told = 0
    for conv in kept:
        for node in conv.nodes:
            answer, results = "", []
            for step in node.steps:
                if step.role == "assistant" and isinstance(step.content, str):
                    answer = step.content
                elif step.role == "tool_result" and isinstance(step.content, list):
                    results += [r.result for r in step.content]
            keys = {k for k in _keys(results) if is_bookkeeping(k)}
            told += len(keys)
            # a response's paging and caching fields (the Google specs' etag, selfLink) are never said
            assert not any(spoken_name(k) in answer.lower() for k in keys), (keys, answer)
            assert not re.search(r"\bare 1 ", answer), answer  # "There are 1 task"
    assert told > 0  # the answers had bookkeeping to leave out
    for conv in kept:  # no write asked for twice with the same arguments (a join that adds one is not taken)
        writes = [(p.call.name, repr(sorted(p.call.arguments.items()))) for p in conv.task.solver if p.kind == "write"]
        assert len(writes) == len(set(writes)), (conv.id, writes)
    # the same plan and seed: the same records, byte for byte
    _run(settings, pool, graph, tmp_path / "b")
    for name in (CONVERSATIONS, DROPPED):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


@pytest.mark.parametrize(
    ("description", "wanted"),
    [
        ("Creates a framework with one or more controls.", "create a framework with one or more controls"),
        ("<p>Returns a list of all active backup plans.</p>", "list all active backup plans"),
        ("This endpoint allows you to get the list of all the endpoints.", "get the list of all the endpoints"),
        ("Publishes a push notification to device(s)", "publish a push notification to device(s)"),
        ("Applies changes", "apply changes"),
        ("The next item", None),
        # a backticked name is code, said as words, and the summary's second sentence no longer runs on
        (
            "Get a specific `ReservationOrder`. Get the details of the `ReservationOrder`.",
            "get a specific reservation order",
        ),
        (
            "Calculate price for a `ReservationOrder`. Calculate price for placing it.",
            "calculate price for a reservation order",
        ),
        ("Runs the `my-job` pipeline", "run the my-job pipeline"),
        ("Use to request a update an existing reservation", "update an existing reservation"),
        ("Use to request an update of the user.", "request an update of the user"),
        ("Use this method to send a native poll", "send a native poll"),
        ("Use to create a scan using code uploaded to a bucket", "create a scan using code uploaded to a bucket"),
        ("Handle GET request for patterns", None),  # (Meshery) the route: the operation's semantics say it instead
        ("Handle POST request for Pattern Deploy", None),
        ("Handler for DELETE /pets/{id}", None),
        ("POST endpoint for users", None),
        ("Get requests for a project", "get requests for a project"),  # a record called "request"
        ("Delete a GET rule", "delete a GET rule"),
    ],
)
def test_a_spec_summary_becomes_what_a_user_asks(description: str, wanted: str | None) -> None:
    assert imperative(description, "") == wanted


@pytest.mark.parametrize(
    ("summary", "label", "wanted"),
    [
        ("retrieve transaction", "transaction", "retrieve "),
        ("get details of a webhook registration", "webhook registration", "get details of "),
        ("retrieve a single screenshot cluster by its ID", "screenshot cluster", "retrieve "),
        ("update the status of a message", "message", "update the status of "),
        ("send a message", "campaign", None),
        ("get a webhook registration by its ID", "registration", None),  # another word of the name before it
        ("get a webhook registration by its ID", "webhook registration", "get "),
        ("get a bill payment by Payment Transaction ID", "bill payment", "get "),
        ("get estimate by estimate ID", "estimate", "get "),
        ("get a role by name", "role", "get "),
        ("list roles by name", "role", "list "),
        ("transaction", "transaction", None),
    ],
)
def test_a_summary_that_names_its_record_gives_way_to_the_users_reference(
    summary: str, label: str, wanted: str | None
) -> None:
    """ "retrieve transaction under the transaction - the one whose type is Basic": where the summary ends with the
    record's name, the user's reference to the record takes its place."""
    assert _naming(summary, label) == wanted


@pytest.mark.parametrize(
    ("summary", "label", "ref", "wanted"),
    [
        (
            "retrieve a single screenshot cluster by its ID",
            "cluster",
            "the cluster from before",
            "retrieve the screenshot cluster from before",
        ),
        (
            "get details of a webhook registration",
            "registration",
            "my registration REG-2",
            "get details of my webhook registration REG-2",
        ),
        ("retrieve a logged message by the message ID", "message", "that message", "retrieve that logged message"),
        ("update a specified perf sample series", "series", "my series S-1", "update my perf sample series S-1"),
        ("get a webhook registration by its ID", "registration", '"hook-7"', None),  # no noun in the ref to qualify
        ("get the status of a message", "message", "my message M-1", None),  # (`_naming`'s: "of" is no qualifier)
        ("webhook registration", "registration", "my registration R-1", None),  # no verb before it
        ("send a message", "campaign", "the campaign", None),
    ],
)
def test_a_summary_naming_its_record_with_a_word_more_qualifies_the_users_reference(
    summary: str, label: str, ref: str, wanted: str | None
) -> None:
    """ "retrieve a single screenshot cluster by its ID of the cluster in the history ...": where the summary names the
    record with a word more than the spec's label, the user's reference takes its place and keeps that word."""
    assert _qualified_naming(summary, label, ref) == wanted


def test_a_summary_says_in_general_what_the_request_names() -> None:
    """ "list all deployments for a given project for that project" → "list all deployments for that project"."""
    clause = "list all deployments for a given project"
    assert _in_place(clause, "project", "that project", len(clause)) == ("list all deployments for that project", 37)
    clause = "list steps for the specified Execution"
    assert _in_place(clause, "execution", "my execution EXE-1", len(clause)) == (
        "list steps for my execution EXE-1",
        33,
    )
    assert _in_place("list all deployments", "project", "that project", 20) is None
    # only the summary's own words, never the record's quoted name after them (a reviewer's cases)
    named = 'retrieve the dataset "The Project Phoenix backlog"'
    assert _in_place(named, "project", 'the project "P-1"', len("retrieve ")) is None
    quoted = 'list "a project" for a project'
    assert _in_place(quoted, "project", "mine", len(quoted)) == ('list "a project" for mine', 25)


@pytest.mark.parametrize(
    ("value", "hollow"),
    [
        *[({}, True), ([], True), ([{}, {}], True), ({"a": {}}, True), ([[]], True)],
        *[({"a": 1}, False), ([{}, "x"], False), ("", False), (0, False), (None, False)],
    ],
)
def test_an_optional_value_with_nothing_in_it_is_left_out(value: object, hollow: bool) -> None:
    """`metadata: [{}, {}]` (an array of objects the spec gives no properties) was bound and said "metadata , ": an
    optional input whose made value holds nothing a user could say is left out."""
    assert _hollow(value) is hollow


@pytest.mark.parametrize(
    ("label", "kept"),
    [("any", 1), ("me", 1), ("delete site", 1), ("batch", 3), ("message", 3), ("anything", 3)],
)
def test_a_label_that_is_no_noun_is_never_said_as_one(label: str, kept: int) -> None:
    """The SMS Works' `POST /batch/any` ("Sends a collection of unique SMS messages") was asked for as "open an any":
    forms that say the label are left out where it is no noun; the spec's summary or a form without it remains."""
    forms = ["open a {label}", "create a new {label}", "make one with {target}"]
    assert len(_noun_forms(forms, label)) == kept
