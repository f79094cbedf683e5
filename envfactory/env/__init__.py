"""Environment runtime: metadata, state database, tools, sessions, the pool, the registry of verified environments."""

from envfactory.env.diff import StateDiff, diff_states
from envfactory.env.environment import BaseEnvironment, Environment, contract_problems
from envfactory.env.metadata import DOMAINS, EnvMetadata, ToolSpec, load_metadata, parse_metadata
from envfactory.env.session import CallRecord, Session, ToolErrorInfo
from envfactory.env.state import Change, Record, State
from envfactory.errors import ConflictError, NotFoundError, ToolError

__all__ = [
    "DOMAINS",
    "BaseEnvironment",
    "CallRecord",
    "Change",
    "ConflictError",
    "EnvMetadata",
    "Environment",
    "NotFoundError",
    "Record",
    "Session",
    "State",
    "StateDiff",
    "ToolError",
    "ToolErrorInfo",
    "ToolSpec",
    "contract_problems",
    "diff_states",
    "load_metadata",
    "parse_metadata",
]
