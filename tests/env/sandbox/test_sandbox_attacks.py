"""The sandbox's tampering check and its answers to the parent, against hostile code that holds the real builtins.

Same premise and harness as tests/system/test_attacks.py: the generated code is past the Python filter. What must
hold: swapping what a runtime function is made of (its code, defaults, closure) in place is reported as tampering
(a tripwire: such code could forge the report too; the parent's own records are what keep verdicts honest), and an
answer no client can be sent (a lone surrogate) fails its call as the code's fault, with its write not kept.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from envfactory.env.metadata import EnvMetadata
from envfactory.env.sandboxed import SandboxedEnvironment
from envfactory.env.session import Session
from envfactory.errors import ScenarioError
from tests.env.sandbox.test_idle import worker_of
from tests.system.test_attacks import (
    ATTACK,
    ATTACK_STEP,
    hostile_env,
    meta,  # noqa: F401 - the module-scoped fixture: the hostile module's metadata
    run_round,
    scenario,
)
from tests.system.test_attacks_more import runtime  # noqa: F401 - the fixture: an untrusted folder served from EnvPool

# ---- the tampering check: a function swapped in place -------------------------------------------------

SWAPS = {
    "nothing": ("", None),
    "__code__": (
        "import envfactory.env.session as S\n"
        "S.Session.dump.__code__ = (lambda self: {'hits': 0, 'notes': ['forged']}).__code__\n",
        "envfactory.env.session.Session.dump.__code__",
    ),
    "__defaults__": (
        "import envfactory.env.sandbox.wire as W\nW.write_frame.__defaults__ = (None,)\n",
        "write_frame.__defaults__",
    ),
    "__kwdefaults__ value": (
        "import envfactory.inputs as I\nI.parse_json.__kwdefaults__['max_depth'] = 10 ** 6\n",
        "envfactory.inputs.parse_json.__kwdefaults__[max_depth]",
    ),
    "closure cell": (
        "from envfactory.env.sandbox.wire import WireError\n"
        "WireError.__init__.__closure__[0].cell_contents = Exception\n",
        "envfactory.env.sandbox.wire.WireError.__init__.__closure__[0]",
    ),
    "a dispatch table entry, changed in place": (
        "import copy\ncopy._deepcopy_dispatch[list] = lambda x, memo, deepcopy=None: ['forged']\n",
        "copy._deepcopy_dispatch[list]",
    ),
    "a class's bases": (
        "from envfactory.env.environment import Environment, BaseEnvironment\n"
        "class Forged(BaseEnvironment):\n    pass\n"
        "Environment.__bases__ = (Forged,)\n",
        "envfactory.env.environment.Environment.__bases__",
    ),
    "a library function the answers go through": (
        "import copy\nreal = copy.deepcopy\ncopy.deepcopy = lambda *a, **k: real(*a, **k)\n",
        ": copy.deepcopy was changed",
    ),
}


@pytest.mark.parametrize("how", list(SWAPS))
def test_swapping_a_functions_insides_is_reported_as_tampering(
    meta: EnvMetadata,  # noqa: F811
    how: str,
) -> None:
    """With the real builtins, code swaps what a runtime function is made of and leaves the function itself in
    place (identity unchanged): the snapshot still sees it. (A tripwire: such code could also forge the report.)"""
    payload, key = SWAPS[how]
    _, obs = run_round(hostile_env(payload), meta, [scenario(ATTACK_STEP)], ATTACK)
    assert obs.import_error is None and obs.scenarios[0].steps[0].result.get("real_builtins") is True, obs
    if key is None:
        assert obs.scenarios[0].steps[0].ok and obs.tampering == [], obs
    else:
        assert any(key in t for t in obs.tampering), obs.tampering


# ---- a lone surrogate in a tool's answer ---------------------------------------------------------------


def test_a_lone_surrogate_fails_the_call_and_keeps_no_write(
    runtime: Callable[..., SandboxedEnvironment],  # noqa: F811
) -> None:
    """A tool's answer no client can be sent (UTF-8 has no lone surrogates) is the code's failure: the call is an
    internal_error, its write is not kept (the session is restored from its successful calls), the worker goes on
    (it refuses the answer itself; the parent would refuse it too and end the worker)."""
    env = runtime('db.set("hits", db.hits + 1)\nout["text"] = "a\\ud800b"\n')
    session = Session.fork(env, "default")
    assert session.call("ping").ok
    process = worker_of(session)
    before = session.dump()
    rec = session.call("attack")
    assert not rec.ok and rec.error is not None and rec.error.type == "internal_error", rec
    assert "lone surrogate" in rec.error.message
    assert session.dump() == before and before["hits"] == 0
    assert session.call("ping").ok
    assert worker_of(session) is process and process.alive and env.pool.unhealthy is None


def test_a_lone_surrogate_written_into_the_state_is_named_when_the_state_is_read(
    runtime: Callable[..., SandboxedEnvironment],  # noqa: F811
) -> None:
    """A tool may leave a lone surrogate in the state rather than in its answer: the state cannot be sent then,
    and reading it is refused naming why (it said "could not be read: None")."""
    env = runtime('db.set("notes", ["a\\ud800b"])\n')
    session = Session.fork(env, "default")
    rec = session.call("attack")
    assert rec.ok, rec  # its answer does not carry it: the state does
    with pytest.raises(ScenarioError, match="could not be read: the answer holds a lone surrogate"):
        session.dump()
