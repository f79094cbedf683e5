"""Running untrusted generated environment code: a static check, then a fresh, limited subprocess.

DESIGN: "Generated code is untrusted: it is checked statically (AST: allowed imports only, no
exec/eval/open/subprocess/socket) and executed in a subprocess with time, memory and no-network
limits; a crash or hang there is a validation error, never a crash of the run."

Two layers, because neither is enough alone:

1. `static_check` is a *policy*: it rejects code that reaches for the system (imports outside an
   allow-list, exec/eval/open, dunder and private attribute access, module handles such as
   `typing.sys`) with a line number and a reason the Code Agent can act on. In-process Python
   sandboxing is known to be leaky, so this is not the containment.
2. `run_checks_in_sandbox` is the *containment*: every call starts a new interpreter
   (`python -P -m envfactory.env.sandbox.child`) that applies resource limits, leaves the network
   namespace, drops root, blocks sockets, runs the code with guarded builtins and reports raw
   observations to a result file. The parent enforces the wall clock and never raises for bad code.

The child only gets the calls to make (tool, arguments, initial config), never the expected
results: the judge (`envfactory.env.checks`) compares in this process, so generated code cannot
read the answers it is checked against.

Modules:
- `policy`: the allow-lists and deny-lists both layers enforce;
- `ast_check`: `static_check` and `StaticProblem`;
- `protocol`: the job the parent sends, the observations and exit codes the child returns;
- `limits`: `SandboxLimits`;
- `runner`: `run_checks_in_sandbox` and `SandboxResult` (the parent side);
- `child`: the child's entry point, with `isolation` (preload, rlimits, network, privileges),
  `guards` (restricted builtins, sealed evaluators) and `integrity` (tampering snapshots).

The child's modules are not imported here: `python -m envfactory.env.sandbox.child` imports this
package first, and if the package had already imported `.child`, runpy would run it a second time
as `__main__`. The parent never needs them.
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
    EXIT_BAD_JOB,
    EXIT_MEMORY,
    EXIT_NO_REPORT,
    EXIT_TIMEOUT,
    Interrupt,
    JobScenario,
    JobStep,
    Observations,
    Phase,
    SandboxJob,
    ScenarioObservation,
    StepObservation,
    parse_observations,
)
from envfactory.env.sandbox.runner import SandboxResult, SandboxStatus, run_checks_in_sandbox

__all__ = [
    "ALLOWED_DUNDER_ATTRS",
    "ALLOWED_DUNDER_NAMES",
    "ALLOWED_MODULES",
    "ENVFACTORY_NAMES",
    "ENV_ATTRS",
    "EXIT_BAD_JOB",
    "EXIT_MEMORY",
    "EXIT_NO_REPORT",
    "EXIT_TIMEOUT",
    "FORBIDDEN_ATTRS",
    "FORBIDDEN_BUILTINS",
    "MAX_CODE_CHARS",
    "MODULE_REASONS",
    "Interrupt",
    "JobScenario",
    "JobStep",
    "Observations",
    "Phase",
    "SandboxJob",
    "SandboxLimits",
    "SandboxResult",
    "SandboxStatus",
    "ScenarioObservation",
    "StaticProblem",
    "StepObservation",
    "module_member_problem",
    "module_problem",
    "parse_observations",
    "run_checks_in_sandbox",
    "static_check",
]
