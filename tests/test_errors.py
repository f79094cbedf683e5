"""The error model (`envfactory/errors.py`): every exception class envfactory and training/ define stands under
exactly one boundary class, the module's table names each under its boundary, and nothing catches an
`InputError` only to raise another class (readers take the caller's class as `error=` instead)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import envfactory
import training
from envfactory import errors
from envfactory.errors import (
    ConfigError,
    DataError,
    EnvError,
    EnvFactoryError,
    InputError,
    ServiceError,
    ToolError,
)
from envfactory.inputs import read_json, read_jsonl_log, read_text

ROOT = Path(envfactory.__file__).parent
BOUNDARIES: tuple[type[EnvFactoryError], ...] = (InputError, ConfigError, EnvError, DataError, ServiceError, ToolError)

# control flow inside one module, never raised past it: outside the model on purpose
PRIVATE_CONTROL_FLOW = {
    "envfactory.env.compiled._NotPlain": "a value that is not plain JSON, caught by the same function's caller",
    "envfactory.envgen.checks.sandbox_round._Loaded": "the sandbox round's module did not load: ends the round",
    "envfactory.envgen.checks.sandbox_round._Stop": "the sandbox round ends here: caught by the round itself",
    "envfactory.envgen.health._Hang": "a health probe's deadline: caught by the probe",
}


def _modules() -> list[str]:
    """Every envfactory module that imports here; one that needs an optional extra (a third-party module that is
    not installed) is left out, any other import failure fails the test. `pkgutil.walk_packages` lists the
    packages, the files under the root add the modules of a folder without `__init__.py` (compiler/)."""
    walked = {info.name for info in pkgutil.walk_packages(envfactory.__path__, "envfactory.")}
    walked |= {info.name for info in pkgutil.walk_packages(training.__path__, "training.")}
    files = {".".join(p.relative_to(ROOT.parent).with_suffix("").parts) for p in ROOT.rglob("*.py")}
    names = []
    for name in sorted(walked | {f.removesuffix(".__init__") for f in files}):
        if name.endswith(".__main__"):  # runs the CLI on import
            continue
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] in ("envfactory", "training"):
                raise
            continue
        names.append(name)
    return names


def _exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in _modules():
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == name:
                found[f"{name}.{obj.__qualname__}"] = obj
    return found


CLASSES = _exception_classes()


def test_the_walk_finds_the_classes_it_should() -> None:
    """The walk reaches deep modules (a broken walk would make the checks below pass vacuously)."""
    for name in (
        "envfactory.env.sandbox.process.WorkerDied",
        "envfactory.scaling.errors.FitError",
        "training.runconfig.RunConfigError",
    ):
        assert name in CLASSES
    assert len(CLASSES) > 60


def test_boundaries_stand_directly_under_the_root() -> None:
    for boundary in BOUNDARIES:
        assert boundary.__bases__ == (EnvFactoryError,), boundary


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_each_class_is_under_exactly_one_boundary(name: str) -> None:
    cls = CLASSES[name]
    if name in PRIVATE_CONTROL_FLOW:
        assert not issubclass(cls, EnvFactoryError), f"{name} is in the model now: take it off the private list"
        return
    if cls is EnvFactoryError or cls in BOUNDARIES:
        return
    under = [b.__name__ for b in BOUNDARIES if issubclass(cls, b)]
    assert len(under) == 1, f"{name} is under {under or 'no boundary'}: derive it from one of envfactory.errors'"


def test_the_private_list_names_classes_that_exist() -> None:
    assert set(PRIVATE_CONTROL_FLOW) <= set(CLASSES)


def _table() -> dict[str, set[str]]:
    """Boundary name -> the class names errors.py's docstring lists under it."""
    doc = errors.__doc__ or ""
    table: dict[str, set[str]] = {}
    current = None
    for line in doc.splitlines():
        head = re.match(r"^`(\w+)`: ", line)
        if head:
            current = head.group(1)
            table[current] = set()
        elif current and line.startswith("    "):
            table[current] |= set(re.findall(r"`(\w+)`", line))
        elif not line.strip():
            continue
        else:
            current = None
    return table


def test_the_docstring_table_lists_every_class_under_its_boundary() -> None:
    table = _table()
    assert set(table) == {b.__name__ for b in BOUNDARIES}
    listed = {n for names in table.values() for n in names}
    for name, cls in CLASSES.items():
        if name in PRIVATE_CONTROL_FLOW or cls is EnvFactoryError or cls in BOUNDARIES or cls.__name__.startswith("_"):
            continue
        boundary = next(b.__name__ for b in BOUNDARIES if issubclass(cls, b))
        assert cls.__name__ in table[boundary], f"{name}: list it under `{boundary}` in envfactory/errors.py"
    public = {cls.__name__ for cls in CLASSES.values() if not cls.__name__.startswith("_")}
    assert listed <= public, f"the table names classes that do not exist: {listed - public}"


def _catches_input_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return False
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(ast.unparse(t).split(".")[-1] == "InputError" for t in types)


def rewraps(source: str) -> list[tuple[int, str]]:
    """(line, raise) for each `raise` of a new exception inside an `except ... InputError ...:` block."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ExceptHandler) and _catches_input_error(node):
            for stmt in node.body:
                for inner in ast.walk(stmt):
                    if isinstance(inner, ast.Raise) and inner.exc is not None:
                        found.append((inner.lineno, ast.unparse(inner.exc)))
    return found


def test_the_rewrap_scan_sees_a_rewrap() -> None:
    source = "try:\n    f()\nexcept (OSError, InputError) as e:\n    raise CorpusError(str(e)) from None\n"
    assert rewraps(source) == [(4, "CorpusError(str(e))")]
    assert rewraps("try:\n    f()\nexcept InputError:\n    raise\n") == []


def test_no_code_rewraps_an_input_error() -> None:
    found = [
        f"{path.relative_to(ROOT.parent)}:{line}: {exc}"
        for path in sorted(ROOT.rglob("*.py"))
        for line, exc in rewraps(path.read_text(encoding="utf-8"))
    ]
    assert not found, "raise the specific class directly (a reader's `error=`), not from an InputError:\n" + "\n".join(
        found
    )


def test_a_reader_raises_the_callers_class_with_its_own_message(tmp_path: Path) -> None:
    from envfactory.corpus.models import CorpusError

    missing = tmp_path / "nothing.json"
    with pytest.raises(InputError) as plain:
        read_json(missing, what="manifest")
    with pytest.raises(CorpusError) as specific:
        read_json(missing, what="manifest", error=CorpusError)
    assert type(specific.value) is CorpusError and str(specific.value) == str(plain.value)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff")
    with pytest.raises(DataError, match=r"not valid UTF-8 \(byte 0\) \(hint\)$"):
        read_text(bad, error=lambda m: CorpusError(f"{m} (hint)"))
    log = tmp_path / "log.jsonl"
    log.write_text('{"a": 1}\n[\n')
    with pytest.raises(CorpusError, match=r"log.jsonl:2: invalid JSON .*; fix or remove it to resume$"):
        read_jsonl_log(log, error=CorpusError)
