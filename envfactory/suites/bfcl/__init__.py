"""BFCL multi-turn environments through the envfactory contract.

Each of BFCL's multi-turn backend classes (`GorillaFileSystem`, `TravelAPI`, `TradingBot`,
`MessageAPI`, `TicketAPI`, `VehicleControlAPI`, `TwitterAPI`, `MathAPI`) becomes one
`BFCLEnvironment`. Nothing of BFCL is copied: the classes run as installed (`bfcl-eval`), and this
package only adapts them.

- **metadata** comes from BFCL's function docs (`multi_turn_func_doc/*.json`), converted from
  BFCL's schema dialect ("dict", "float", "tuple", "any", `"default": "None"`...) to JSON Schema.
  Each tool's kind (read/write) comes from a hand-checked table (`suites._SUITES`).
- **state** is an instance of the BFCL class after `_load_scenario(deepcopy(config))`, exactly as
  BFCL's own executor builds it (stateless classes, i.e. `MathAPI`, get no scenario).
- **dump_state** serializes the instance's attributes recursively to JSON data. Left out, because
  they are not scenario state: `_api_description` (a constant string), `_random` (the seeded RNG
  behind ids, tokens and sensor readings: it is deterministic given the seed and the call history,
  dumping its 625-word Mersenne state would make every read of a random sensor look like a write,
  and BFCL's own state checker ignores it), `TravelAPI._flight_cost_lookup` (a cache that
  `book_flight` refills itself) and `File._last_modified` (wall-clock time, ignored by BFCL's
  `File.__eq__`). Private attributes that *are* state stay in (`VehicleControlAPI._brakePedalForce`,
  `_parkingBrakeForce`, `_slopeAngle`: `startEngine` reads them), and `GorillaFileSystem._current_dir`
  is dumped as its path. The file tree is dumped in BFCL's own config format
  (`{"root": {name: {"type": "directory", "contents": {...}}}}`).
- **calls** are validated against the converted schema (strict JSON types: `1.0` is not an integer,
  `true` is not a number), then run as plain method calls. BFCL's results are kept exactly as they
  are (including its `{"error": ...}` dicts); they are only converted to JSON data (tuples → lists,
  sets → sorted lists, non-string keys → strings as `json.dumps` writes them, mpmath/Decimal →
  numbers). An exception raised by a BFCL method becomes a `ToolError` (the session rolls back).
- No `eval`, `exec` or `globals()`: BFCL's ground truth strings are parsed with `ast`
  (`parse_call`, `parse_calls`), and routed to their class with `route` (same rule as BFCL's
  executor, which maps a method name to the last involved class that has it).

BFCL quirks contained here (all isolation fixes; none changes a result BFCL would give a fresh
process): `TwitterAPI.post_tweet` has mutable default arguments (`tags=[]`, `mentions=[]`) that
`mention` later extends, so omitted mutable defaults are passed as fresh copies; arguments are
deep-copied before the call (BFCL stores them in its state); results are converted to fresh JSON
data (BFCL returns references into its state); `MathAPI` sets process-global precisions
(`mpmath.mp.dps`, the decimal context), which are restored after each call; long-context states are
deep-copied after loading (BFCL puts its module-level extension dicts into the state).

Modules, one concept each:

- `suites`: the per-class table (env names, domains, read/write kinds, doc fixes) and lookups into
  the installed `bfcl-eval` (classes, function docs, data folder, versions);
- `schema`: BFCL's doc dialect → JSON Schema, and the strict validator for call arguments;
- `dump`: state as JSON data (`to_jsonable`, the file-system dump, what is not state and why);
- `calls`: ground-truth call strings parsed with `ast` (`parse_call`, `parse_calls`);
- `adapter`: `BFCLTool`, `BFCLEnvironment`, `factories()` and `environment()`;
- `entries`: BFCL's test entries (`load_entries`) and `route`.
"""

from envfactory.suites.bfcl.adapter import BFCLEnvironment, BFCLTool, environment, factories
from envfactory.suites.bfcl.calls import CallSyntaxError, ParsedCall, parse_call, parse_calls
from envfactory.suites.bfcl.dump import to_jsonable
from envfactory.suites.bfcl.entries import BFCLEntry, load_entries, route
from envfactory.suites.bfcl.schema import StrictValidator, convert_schema
from envfactory.suites.bfcl.suites import (
    SUITES_BY_CLASS,
    SUITES_BY_ENV,
    available,
    bfcl_version,
    class_importable,
    data_dir,
    func_docs,
    load_class,
)

__all__ = [
    "SUITES_BY_CLASS",
    "SUITES_BY_ENV",
    "BFCLEntry",
    "BFCLEnvironment",
    "BFCLTool",
    "CallSyntaxError",
    "ParsedCall",
    "StrictValidator",
    "available",
    "bfcl_version",
    "class_importable",
    "convert_schema",
    "data_dir",
    "environment",
    "factories",
    "func_docs",
    "load_class",
    "load_entries",
    "parse_call",
    "parse_calls",
    "route",
    "to_jsonable",
]
