"""The static check: code that breaks the policy is rejected, with a line and a reason, before it runs.

`static_check` is a *policy*: it rejects code that reaches for the system (imports outside an
allow-list, exec/eval/open, dunder and private attribute access, module handles such as
`typing.sys`) with a line number and a reason the Code Agent can act on. In-process Python
sandboxing is known to be leaky, so this is not the containment (that is the child process).
"""

from __future__ import annotations

import ast
from types import ModuleType
from typing import Any, cast

from pydantic import BaseModel

from envfactory.env.sandbox.policy import (
    ALLOWED_DUNDER_ATTRS,
    ALLOWED_DUNDER_METHODS,
    ALLOWED_DUNDER_NAMES,
    ENV_ATTRS,
    ENVFACTORY_NAMES,
    FORBIDDEN_ATTRS,
    FORBIDDEN_BUILTINS,
    _member,
    _trusted_module,
    module_member_problem,
    module_problem,
)
from envfactory.inputs import parse_python

MAX_CODE_CHARS = 500_000


class StaticProblem(BaseModel):
    """One reason the code is rejected before it runs."""

    line: int
    message: str


_ATTR_FUNCTIONS = frozenset({"getattr", "setattr", "delattr", "hasattr"})


class _Checker:
    """The AST rules. Iterative (ast.walk), so deeply nested code cannot overflow the recursion limit."""

    def __init__(self) -> None:
        self.problems: list[StaticProblem] = []
        self.modules: dict[str, ModuleType] = {}  # local name -> module bound by an import
        self.env_names: set[str] = set()  # names bound to Environment(...) at module level
        self.bound: set[str] = set()  # every name the code binds anywhere
        self.imported: set[str] = set()  # every name an import binds

    def add(self, node: ast.AST, message: str) -> None:
        self.problems.append(StaticProblem(line=getattr(node, "lineno", 0), message=message))

    def run(self, tree: ast.AST) -> None:
        nodes = list(ast.walk(tree))
        for node in nodes:  # imports first: attribute rules resolve names they bind
            if isinstance(node, ast.Import):
                self.visit_Import(node)
            elif isinstance(node, ast.ImportFrom):
                self.visit_ImportFrom(node)
        # a module is used only as `module.member`: bound to another name, put in a list, passed, matched or
        # returned, it is out of the attribute rule's sight (`t = typing; t.sys`, `match [typing]: ...`)
        attribute_bases = {id(n.value) for n in nodes if isinstance(n, ast.Attribute)}
        attribute_bases |= {  # `getattr(module, name)`: a computed read, which the guarded getattr judges at run time
            id(n.args[0])
            for n in nodes
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name)
            and n.func.id in ("getattr", "hasattr")
            and n.args
        }
        for node in nodes:
            if (
                isinstance(node, ast.Name | ast.Attribute)
                and isinstance(node.ctx, ast.Load)
                and id(node) not in attribute_bases
                and isinstance(self._resolve(node), ModuleType)
            ):
                self.add(node, "a module may only be used as `module.member` (not named, stored, passed or matched)")
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                self.visit_definition(node)
        for node in nodes:
            if isinstance(node, ast.Name):
                self.visit_Name(node)
            elif isinstance(node, ast.Attribute):
                self.visit_Attribute(node)
            elif isinstance(node, ast.Call):
                self.visit_Call(node)
            elif isinstance(node, ast.ExceptHandler):
                self.visit_ExceptHandler(node)
            elif isinstance(node, ast.Match):
                self.visit_Match(node)
            elif isinstance(node, ast.MatchClass):
                self.visit_MatchClass(node)
            elif isinstance(node, ast.MatchAs | ast.MatchStar | ast.MatchMapping | ast.Global | ast.Nonlocal):
                self.visit_bound_strings(node)

    # ---- imports ------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            problem = module_problem(alias.name)
            if problem is None and alias.name in ENVFACTORY_NAMES:
                problem = f"'import {alias.name}' is not allowed; use 'from {alias.name} import ...'"
            if problem is not None:
                self.add(node, problem)
                continue
            # `import a.b` binds `a`; `import a.b as c` binds the submodule
            target = alias.name if alias.asname else alias.name.split(".")[0]
            module = _trusted_module(target)
            if module is not None:
                self.modules[alias.asname or target] = module

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.add(node, "relative imports are forbidden: generated code is a single module")
            return
        name = node.module or ""
        problem = module_problem(name)
        if problem is not None:
            self.add(node, problem)
            return
        module = _trusted_module(name) if name != "__future__" else None
        for alias in node.names:
            if alias.name == "*":
                self.add(node, f"'from {name} import *' is forbidden: import names explicitly")
                continue
            if name in ENVFACTORY_NAMES:
                if alias.name not in ENVFACTORY_NAMES[name]:
                    allowed = ", ".join(sorted(ENVFACTORY_NAMES[name]))
                    self.add(node, f"'{alias.name}' cannot be imported from {name} (allowed: {allowed})")
                continue
            if module is None:
                continue
            member_problem = module_member_problem(module, alias.name)
            if member_problem is not None:
                self.add(node, f"'from {name} import {alias.name}': {member_problem}")
                continue
            value = _member(module, alias.name)
            if isinstance(value, ModuleType):
                self.modules[alias.asname or alias.name] = value

    # ---- names and attributes -----------------------------------------------------------------
    def _dunder_name(self, node: ast.AST, ident: str) -> bool:
        """The rule of dunder names (a name read, bound by a pattern, or declared `global`); True if refused."""
        if ident.startswith("__") and ident.endswith("__") and ident not in ALLOWED_DUNDER_NAMES:
            self.add(node, f"name '{ident}' is forbidden: dunder names reach interpreter internals")
            return True
        return False

    def visit_Name(self, node: ast.Name) -> None:
        ident = node.id
        if self._dunder_name(node, ident):
            return
        if ident in FORBIDDEN_BUILTINS and ident not in self.bound:
            self.add(node, f"'{ident}' is forbidden: it {FORBIDDEN_BUILTINS[ident]}")
        elif ident in FORBIDDEN_ATTRS and isinstance(node.ctx, ast.Load) and ident not in self.bound:
            self.add(node, f"'{ident}' is forbidden: it {FORBIDDEN_ATTRS[ident]}")

    def _attr_problem(self, attr: str) -> str | None:
        if attr.startswith("__") and attr.endswith("__"):
            if attr in ALLOWED_DUNDER_ATTRS:
                return None
            return f"attribute '{attr}' is forbidden: dunder attributes reach interpreter internals"
        if attr.startswith("_"):
            return (
                f"attribute '{attr}' is forbidden: private attributes are off limits "
                "(state lives in public fields, written through the CRUD helpers)"
            )
        if attr in FORBIDDEN_ATTRS:
            return f"attribute '{attr}' is forbidden: it {FORBIDDEN_ATTRS[attr]}"
        return None

    def _resolve(self, node: ast.expr) -> Any:
        """The module an expression names (`typing`, `collections.abc`), when statically known."""
        if isinstance(node, ast.Name):
            return self.modules.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self._resolve(node.value)
            if isinstance(base, ModuleType):
                return _member(base, node.attr)
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        problem = self._attr_problem(node.attr)
        writes = isinstance(node.ctx, ast.Store | ast.Del)
        if problem is None and writes and isinstance(node.value, ast.Name) and node.value.id in self.imported:
            problem = (
                f"assigning '{node.value.id}.{node.attr}' is forbidden: monkeypatching imported modules "
                "and classes changes the runtime the code is checked with"
            )
        if problem is None:
            base = self._resolve(node.value)
            if isinstance(base, ModuleType):
                problem = module_member_problem(base, node.attr)
            elif isinstance(node.value, ast.Name) and node.value.id in self.env_names and node.attr not in ENV_ATTRS:
                problem = (
                    f"'{node.value.id}.{node.attr}' is forbidden: module code may only use "
                    f"{', '.join(sorted(ENV_ATTRS))} of the Environment"
                )
        if problem is not None:
            self.add(node, problem)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in _ATTR_FUNCTIONS and len(node.args) > 1:
            arg = node.args[1]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                problem = self._attr_problem(arg.value)
                if problem is not None:
                    self.add(node, f"{func.id}(..., {arg.value!r}): {problem}")

    # ---- definitions ---------------------------------------------------------------------------
    def visit_definition(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        """A def's or a class's name is a plain string too: defining `__match_args__` (a positional class pattern then
        reads the attributes it names) or `__instancecheck__` (any subject then matches) hands the interpreter's own
        getattr to the code. Dunder methods are the plain data-model ones; a class takes no metaclass."""
        name = node.name
        if name.startswith("__") and name.endswith("__") and name not in ALLOWED_DUNDER_METHODS:
            self.add(node, f"defining '{name}' is forbidden: only plain data-model methods may be dunder names")
        if isinstance(node, ast.ClassDef) and any(k.arg == "metaclass" for k in node.keywords):
            self.add(node, "a metaclass is forbidden: it changes how the interpreter looks the class's instances up")

    # ---- names the AST holds as plain strings ---------------------------------------------------
    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        """`case C(attr=p)` reads `subject.attr` with the interpreter's own getattr (no guard sees it), so each
        keyword attribute gets the rule of `x.attr`."""
        for attr in node.kwd_attrs:
            problem = self._attr_problem(attr)
            if problem is not None:
                self.add(node, f"class pattern '{attr}=': {problem}")

    def visit_Match(self, node: ast.Match) -> None:
        """A class pattern matched against a module (`match typing: case object(sys=s)`) reads module members:
        the rule of `typing.sys`, where the subject is a module the code imported."""
        base = self._resolve(node.subject)
        if not isinstance(base, ModuleType):
            return
        for case in node.cases:
            todo = [case.pattern]
            while todo:  # the patterns matched against the subject itself: `as` and `|` keep it
                pattern = todo.pop()
                if isinstance(pattern, ast.MatchAs) and pattern.pattern is not None:
                    todo.append(pattern.pattern)
                elif isinstance(pattern, ast.MatchOr):
                    todo.extend(pattern.patterns)
                elif isinstance(pattern, ast.MatchClass):
                    for attr in pattern.kwd_attrs:
                        problem = module_member_problem(base, attr)
                        if problem is not None and self._attr_problem(attr) is None:  # else said already
                            self.add(pattern, f"class pattern '{attr}=': {problem}")

    def visit_bound_strings(
        self, node: ast.MatchAs | ast.MatchStar | ast.MatchMapping | ast.Global | ast.Nonlocal
    ) -> None:
        """Names a capture pattern binds (`case __builtins__:`, `[*name]`, `{**name}`) or `global` declares: the
        rule of dunder names."""
        if isinstance(node, ast.Global | ast.Nonlocal):
            names = list(node.names)
        else:
            name = node.rest if isinstance(node, ast.MatchMapping) else node.name
            names = [name] if name is not None else []
        for ident in names:
            self._dunder_name(node, ident)

    # ---- control flow -------------------------------------------------------------------------
    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        caught = node.type
        names = caught.elts if isinstance(caught, ast.Tuple) else [caught] if caught is not None else []
        if caught is None or any(isinstance(n, ast.Name) and n.id == "BaseException" for n in names):
            self.add(
                node,
                "bare 'except:' and 'except BaseException' are forbidden: they swallow the sandbox's "
                "time and memory signals; catch specific exceptions (tools raise ToolError)",
            )


def _env_names(tree: ast.Module) -> set[str]:
    """Module-level names bound to `Environment(...)`."""
    out: set[str] = set()
    for node in tree.body:
        targets: list[ast.expr]
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "Environment":
            out.update(t.id for t in targets if isinstance(t, ast.Name))
    return out


def _bound_names(tree: ast.AST) -> set[str]:
    """Every name the module binds (parameters, assignments, defs...): those shadow builtins."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            out.add(node.id)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.alias):
            out.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
    return out


def static_check(code: str) -> list[StaticProblem]:
    """Problems that keep `code` from running at all (empty: it may go to the sandbox)."""
    if len(code) > MAX_CODE_CHARS:
        return [StaticProblem(line=0, message=f"the code is {len(code)} characters; the limit is {MAX_CODE_CHARS}")]
    try:
        tree = cast(ast.Module, parse_python(code, filename="env.py"))
    except SyntaxError as e:
        return [StaticProblem(line=e.lineno or 0, message=f"syntax error: {e.msg}")]
    except ValueError as e:  # null bytes
        return [StaticProblem(line=0, message=f"cannot parse the code: {e}")]
    except (RecursionError, MemoryError):
        return [StaticProblem(line=0, message="the code is nested too deeply to parse")]
    checker = _Checker()
    checker.bound = _bound_names(tree)
    checker.env_names = _env_names(tree)
    checker.imported = {
        alias.asname or alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    try:
        checker.run(tree)
    except RecursionError:  # resolving a very long attribute chain recurses; no tool module has one
        return [StaticProblem(line=0, message="the code is nested too deeply to check")]
    return sorted(checker.problems, key=lambda p: p.line)
