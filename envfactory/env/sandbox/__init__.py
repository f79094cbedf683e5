"""Running untrusted generated environment code: a static filter, then a process walled off by the kernel.

Generated code is hostile until a person trusts it: the OS is the wall, Python checks only a filter.

Layers, outermost first:

1. `wall`: the OS boundary. Every process that runs untrusted code starts inside bubblewrap (its
   own user, PID, mount, IPC, UTS and network namespaces, a read-only view of only the interpreter,
   its packages and the runtime package, a size-limited private tmpfs, no capabilities) with a
   seccomp filter, and its worker loads a second filter (no exec, fork, threads, signals, sockets)
   before any untrusted code. No OS sandbox: refused, unless the user opts out by name.
2. `process` / `wire`: the parent drives a worker one request at a time over pipes, reading every
   answer with a deadline, a size limit and a depth limit; anything late or malformed kills it.
3. the callers: EnvGen's validation round (`envfactory.envgen.checks.sandbox_round`,
   `run_checks_in_sandbox`): the parent makes every call and records the `Observations` itself; the
   judge (`envfactory.envgen.checks`) compares them with expectations the worker never sees.
   `envfactory.env.sandboxed` serves the `Session` API of an untrusted environment from a pool of
   the same workers: what was judged is what runs.
4. `static_check` (the AST policy) and the worker's guarded builtins (`guards`) are a filter: they
   give the Code Agent precise feedback (a line and a reason), and make the obvious escapes fail
   early. They are not the containment.

Modules: `policy` (allow-lists), `ast_check`, `limits`, `wall`, `wire`, `protocol`, `process`;
the worker's side: `worker` with `isolation` (limits, filter, privileges), `guards` and
`integrity` (tampering snapshots, a filter as well). The worker's modules are not imported here:
`python -m envfactory.env.sandbox.worker` imports this package first, and the parent never needs them.
"""

from envfactory.env.sandbox.ast_check import MAX_CODE_CHARS, StaticProblem, static_check
from envfactory.env.sandbox.limits import SandboxLimits
from envfactory.env.sandbox.policy import (
    ALLOWED_DUNDER_ATTRS,
    ALLOWED_DUNDER_NAMES,
    ALLOWED_MODULES,
    ENV_ATTRS,
    ENVFACTORY_NAMES,
    FORBIDDEN_ATTRS,
    FORBIDDEN_BUILTINS,
    MODULE_REASONS,
    module_member_problem,
    module_problem,
)
from envfactory.env.sandbox.protocol import (
    Interrupt,
    Isolation,
    JudgedCall,
    JudgedRun,
    Observations,
    Phase,
    ScenarioObservation,
    StepObservation,
    parse_observations,
)
from envfactory.env.sandbox.wall import SandboxUnavailable, Wall, find_wall

__all__ = [
    "ALLOWED_DUNDER_ATTRS",
    "ALLOWED_DUNDER_NAMES",
    "ALLOWED_MODULES",
    "ENVFACTORY_NAMES",
    "ENV_ATTRS",
    "FORBIDDEN_ATTRS",
    "FORBIDDEN_BUILTINS",
    "MAX_CODE_CHARS",
    "MODULE_REASONS",
    "Interrupt",
    "Isolation",
    "JudgedCall",
    "JudgedRun",
    "Observations",
    "Phase",
    "SandboxLimits",
    "SandboxUnavailable",
    "ScenarioObservation",
    "StaticProblem",
    "StepObservation",
    "Wall",
    "find_wall",
    "module_member_problem",
    "module_problem",
    "parse_observations",
    "static_check",
]
