"""A pytest plugin that runs the slowest test files first, so the parallel suite does not end on one long file.

Each run records every test file's time (setup + call + teardown, summed over its tests) in
`.envfactory/test-file-seconds.json` under the rootdir (pytest's own cache is off: `-p no:cacheprovider`);
the next run orders files by that time, slowest first, keeping each file's tests together and in their
own order (so module-scoped fixtures are set up once). pytest-xdist hands tests to workers in this order,
so the long files start early and the short ones fill in at the end. A file not in the cache keeps its place
among the others of time 0; with no cache (a fresh clone) the order is pytest's own. A file no longer there (moved
or deleted) leaves the record at the next run's end."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

RECORD = Path(".envfactory") / "test-file-seconds.json"


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def slowest_first(items: list[pytest.Item], seconds: dict[str, float]) -> list[pytest.Item]:
    """The items grouped by file, files in order of recorded seconds (descending), stable otherwise."""
    files: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        files[file_of(item.nodeid)].append(item)
    order = sorted(files, key=lambda f: -seconds.get(f, 0.0))  # sorted() is stable: ties keep pytest's order
    return [item for f in order for item in files[f]]


def recorded(config: pytest.Config) -> dict[str, float]:
    """The last runs' seconds per file; nothing when there is no readable record."""
    try:
        data = json.loads((config.rootpath / RECORD).read_text())
        return {str(k): float(v) for k, v in data.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seconds = recorded(config)
    if seconds:
        items[:] = slowest_first(items, seconds)


class _Recorder:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[file_of(report.nodeid)] += report.duration


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) sees every report
        config.pluginmanager.register(_Recorder(), "envfactory-file-seconds")


def pytest_sessionfinish(session: pytest.Session) -> None:
    recorder = session.config.pluginmanager.get_plugin("envfactory-file-seconds")
    if not isinstance(recorder, _Recorder) or not recorder.seconds:
        return
    root = session.config.rootpath
    merged = recorded(session.config) | {f: round(s, 2) for f, s in recorder.seconds.items()}
    merged = {f: s for f, s in merged.items() if (root / f).is_file()}  # a moved or deleted file's key goes
    path = root / RECORD
    try:  # written whole, then renamed: a run stopped halfway never leaves a torn record
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(merged, indent=0, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable checkout only loses the ordering
