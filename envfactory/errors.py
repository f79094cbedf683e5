"""The error model: one root, `EnvFactoryError`, and one class per boundary a failure comes from.

Every exception class envfactory defines derives from exactly one boundary class below (`tests/test_errors.py`
walks the package and checks it). Code raises the specific class; nothing catches an `InputError` only to
raise another class: a reader takes the caller's class as `error=` (see `envfactory.inputs`) and raises it
directly. The CLI catches the root and prints its message on one line (exit 1).

Boundary classes and every class under each (module under `envfactory.`, or `training.` where it says so):

`InputError`: a file, argument or request the user or a client hands us.
    `InputError` (errors, re-exported by inputs), `ArgumentError` (env.tools), `CallSyntaxError`
    (suites.bfcl.calls), `TemplateError` (tasks.template), `WordingError` (tasks.conversation).

`ConfigError`: settings, a missing extra, no model configured.
    `SynthConfigError` (tasks.plan), `LLMConfigError` (llm.errors), `PromptError` (llm.prompts),
    `EmbeddingError` (llm.embeddings), `OnnxError` (llm.onnx_embed), `ExecutorError` (executor),
    `ClientConfigError` (serve.clients), `AffinityError` (serve.affinity), `QueryGenError` (querygen.records),
    `RunConfigError` (training.runconfig), `ConversionError` (training.to_gguf).

`EnvError`: an environment: its folder, metadata, code, scenarios or sandbox.
    `MetadataError`, `ContractError`, `EnvNotFoundError`, `EnvLoadError`, `ScenarioError` (errors);
    `FolderError` (env.folder), `RegistryError` (env.registry), `TrustError` (env.trust), `SandboxUnavailable`
    (env.sandbox.wall), `SandboxViolation` (env.sandbox.guards), `WorkerDied` (env.sandbox.process), `WireError`
    (env.sandbox.wire), `OpenAPIError` (envgen.openapi), `RegistrationError` (envgen.register), `CompileError`
    (compiler.compile), `RevisionError` (compiler.revision), `ScenarioGenerationError` (tasks.compiled_state),
    `StateGenerationError` (tasks.initial_state), `FieldGenerationError` (tasks.state_values),
    `FolderCycleError` (suites.bfcl.dump), `TaskError` (hubs.episode).

`DataError`: records, run folders, the corpus, exports, tables.
    `CorpusError` (corpus.models), `ExportError` (export.errors), `HubExportError` (hubs.export), `RecordError`
    (reward.settings), `RunSettingsError` (run_settings), `SynthError` (tasks.plan), `EvalRunError` (eval.run),
    `EvalSourceError` (eval.items), `StatsError` (eval.stats), `MetricError` (eval.metrics), `ScalingError`,
    `BudgetError`, `FitError`, `RunTableError` (scaling.errors), `ToolGraphError` (toolgraph.errors),
    `EnvironmentSetupError` (training.environment), `SpecChangedError` (envgen.openapi).

`ServiceError`: a server, an HTTP peer or an LLM endpoint.
    `LLMCallError`, `LLMRequestRefused` (llm.errors), `ScriptExhaustedError` (llm.scripted), `ExtractionError`
    (llm.structured), `SourceSearchError` (envgen.sources), `HubError` (metatools.protocol),
    `TrainerClientError`, `ConnectionLostError`, `JSONRPCError`, `ProtocolError`, `ServerHTTPError`,
    `ToolCallError` (serve.trainer_client), `BindError` (serve.net).

`ToolError`: one tool call, refused: recorded as state (a `Session` turns it into an error result and rolls back).
    `ToolError`, `NotFoundError`, `ConflictError` (errors).

Classes that stood on a builtin (`ValueError`, `PermissionError`) keep it as a second base, so an `except
ValueError` that caught them still does. A few private classes are control flow inside one module and never
leave it (`_NotPlain`, `_Loaded`, `_Stop`, `_Hang`); the test lists them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError


def first_error(e: ValidationError, root: str = "") -> tuple[str, str]:
    """The first error of a pydantic validation: where (a dotted location, or `root` at the top) and what (without
    pydantic's "Value error, " in front of a validator's own message)."""
    err = e.errors()[0]
    return ".".join(str(x) for x in err["loc"]) or root, str(err["msg"]).removeprefix("Value error, ")


class EnvFactoryError(RuntimeError):
    """Root of every error envfactory names: the CLI prints the message on one line and exits non-zero.

    A `RuntimeError`, so that LangGraph's server (`langgraph dev`, Studio) shows a failed run its message: it
    passes on the message of the builtin errors (`ValueError`, `RuntimeError`...) and answers "An internal error
    occurred" for any other class. Not a `ValueError`: pydantic would turn one raised in a validator into a
    `ValidationError`."""


class InputError(EnvFactoryError):
    """A file or a JSON document cannot be accepted (missing, not a regular file, too large, malformed)."""


class ConfigError(EnvFactoryError):
    """Settings that cannot work: a missing extra, no model configured, a value out of range."""


class EnvError(EnvFactoryError):
    """An environment cannot be used: its folder, metadata, code, scenarios or sandbox."""


class DataError(EnvFactoryError):
    """Records, run folders, the corpus or exported data that cannot be read or give no result."""


class ServiceError(EnvFactoryError):
    """A server, an HTTP peer or an LLM endpoint failed or answered what cannot be used."""


ErrorFactory = Callable[[str], EnvFactoryError]
"""What a reader raises with its one-line message: a class (`CorpusError`) or a function adding the caller's
hint (`lambda m: CorpusError(f"{m} (run `envfactory corpus fetch`)")`)."""


class MetadataError(EnvError):
    """A `metadata.json` (or metadata object) is malformed."""

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.source, self.field, self.problem = source, field, problem
        super().__init__(f"{source}: field '{field}': {problem}")


class ContractError(EnvError):
    """An environment's code and metadata disagree, or the code breaks the environment contract."""

    def __init__(self, env: str, problems: list[str]) -> None:
        self.env, self.problems = env, problems
        joined = "; ".join(problems)
        super().__init__(f"environment '{env}' breaks the contract: {joined}")


class EnvNotFoundError(EnvError):
    """No environment of that name in the pool."""


class EnvLoadError(EnvError):
    """An environment folder exists but its code or files cannot be loaded."""


class ScenarioError(EnvError):
    """An initial config (scenario) does not exist or does not load into the state model."""


class ToolError(EnvFactoryError):
    """Raised by a tool for bad input (unknown id, invalid value, violated precondition): the tool boundary.

    A `Session` turns it into a structured error result and leaves the state untouched: an expected outcome
    of a tool call, recorded as state, not a user error (a session never lets it out).
    """

    code = "tool_error"

    def __init__(self, message: str, **details: Any) -> None:
        self.message, self.details = message, details
        super().__init__(message)


class NotFoundError(ToolError):
    """An id that names no record."""

    code = "not_found"


class ConflictError(ToolError):
    """The request contradicts the current state (already cancelled, duplicate, insufficient funds...)."""

    code = "conflict"
