"""Predicted tool calls from a model completion, in the formats models actually emit.

`parse_tool_calls(completion, index)` never raises: whatever it is given (a string, a chat message,
a list of messages, None, a number, a megabyte of junk) it returns a `ParsedCompletion` — the calls
it could read, the call attempts it could not (each with a reason) and format notes that cost nothing.

Accepted shapes:

- **text** (a plain-string completion, or an assistant message's `content`):
  - `<think>…</think>` is dropped first (also a bare `…</think>` prefix, as Qwen3's template leaves
    it; an unclosed `<think>` drops the rest of the text: the model never finished thinking);
  - Qwen / Hermes blocks `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, any number of
    them; a block may hold a JSON list of calls, a ```json fence, or the Qwen3-Coder XML form
    `<function=NAME><parameter=P>value</parameter></function>` (a value is kept as text for a
    string-typed parameter, else read as JSON when it parses); an unclosed last block (a truncated
    generation) is still tried;
  - Mistral's `[TOOL_CALLS][…]`;
  - plain JSON — the whole text (optionally in one ```json fence) is a call object, a list of call
    objects, or an OpenAI message with `tool_calls`; in prose, ```json fences that hold calls count;
  - anything else is an answer without calls (not an error).
- **a chat message** `{"role": "assistant", "content": …, "tool_calls": [...]}` or **a list of
  them** (TRL's conversational completions, including its multi-turn tool loop: the assistant
  messages' calls are taken in order; `tool` / `user` messages are skipped). When a message has
  structured `tool_calls`, its `content` is not scanned again (templates often echo the raw text).
- **a call object** in any of: `{"name", "arguments"}`, `{"name", "parameters"}`,
  `{"type": "function", "function": {"name", "arguments"}}`; `arguments` may be a dict or a JSON string.

A call attempt is *unparseable* when its JSON does not decode, it has no string `name`, or its
arguments are not a JSON object (or nest deeper than `MAX_DEPTH`). The reward charges a format
penalty per unparseable attempt and scores a completion with attempts but no readable call as 0.

Tool names may be plain (`book_room`), or qualified `hotels.book_room` / `hotels__book_room`
(also `:` and `/`). A `ToolIndex` (which server has which tool — built from the record's
`mcp_servers`) resolves them; a plain name that several servers share goes to the server the
ground truth used it on, else to the first such server in `mcp_servers` order (noted). A name no
server has stays a call (it counts and fails on replay) with server `""`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, Field

from envfactory.llm.thinking import split_thinking
from envfactory.records.models import ToolCall

MAX_CHARS = 200_000  # longer text is cut here before parsing (noted)
MAX_CALLS = 64  # calls kept; further ones are only counted (`dropped`)
MAX_DEPTH = 32  # nesting allowed in arguments
_SNIPPET = 160  # characters of a bad block kept in its report
_SEPARATORS = (".", "__", ":", "/")

_FENCE = re.compile(r"```(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)
# a name holds no "<" and is at most 256 characters: a run of "<function=" (or of one unclosed name) is read in
# linear time — with `[^>\s]+` every start scanned the rest of the run, quadratic (~73 s for one 200k completion)
_XML_FUNCTION = re.compile(r"<function=([^<>\s]{1,256})\s*>(.*?)(?:</function>|$)", re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([^<>\s]{1,256})\s*>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_MISTRAL = "[TOOL_CALLS]"
_DECODER = json.JSONDecoder()


class BadCall(BaseModel):
    """A call attempt that could not be read: where it was, a snippet of it, and why."""

    where: str
    text: str
    reason: str


class ParsedCompletion(BaseModel):
    """What a completion asked for.

    `error` is set when the completion itself is unusable (None, a number, ...): nothing was read.
    `formats` names the shapes seen (`hermes`, `openai`, `json`, `xml`, `mistral`).
    """

    calls: list[ToolCall] = Field(default_factory=list)
    unparseable: list[BadCall] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)
    formats: list[str] = Field(default_factory=list)
    dropped: int = Field(default=0, description="calls beyond `max_calls`, counted but not kept")
    error: str | None = None

    @property
    def n_calls(self) -> int:
        """Calls the completion made, including dropped ones."""
        return len(self.calls) + self.dropped

    @property
    def attempted(self) -> bool:
        return bool(self.calls or self.unparseable or self.dropped)


class ToolIndex:
    """Which server has which tool: resolves plain and qualified tool names to (server, tool).

    `tools`: server → its tool names, in `mcp_servers` order (the order breaks ties);
    `preferred`: tool name → the server the ground truth used it on;
    `string_params`: (server, tool) → its string-typed parameters (the XML form keeps their text as is).
    """

    def __init__(
        self,
        tools: Mapping[str, Iterable[str]],
        preferred: Mapping[str, str] | None = None,
        string_params: Mapping[tuple[str, str], Iterable[str]] | None = None,
    ) -> None:
        self.tools: dict[str, frozenset[str]] = {s: frozenset(names) for s, names in tools.items()}
        self.preferred = dict(preferred or {})
        self.string_params = {k: frozenset(v) for k, v in (string_params or {}).items()}
        self.by_tool: dict[str, list[str]] = {}
        for server, names in self.tools.items():
            for n in names:
                self.by_tool.setdefault(n, []).append(server)

    def copy(self) -> ToolIndex:
        """An index over the same tools with its own `preferred` (the structures it shares are never changed)."""
        out = ToolIndex.__new__(ToolIndex)
        out.tools, out.string_params, out.by_tool = self.tools, self.string_params, self.by_tool
        out.preferred = dict(self.preferred)
        return out

    def resolve(self, name: str, server: str | None = None) -> tuple[str, str, str | None]:
        """(server, tool, problem or None). Never raises; an unknown name gives server `""`."""
        if server:
            tool = name
            for sep in _SEPARATORS:  # "hotels.book_room" with server "hotels"
                if name.startswith(server + sep):
                    tool = name[len(server) + len(sep) :]
                    break
            if server not in self.tools:
                return server, tool, f"no environment '{server}' in this task"
            if tool not in self.tools[server]:
                return server, tool, f"environment '{server}' has no tool '{tool}'"
            return server, tool, None
        owners = self.by_tool.get(name)
        if owners:
            if len(owners) == 1:
                return owners[0], name, None
            chosen = self.preferred.get(name)
            if chosen in owners:
                return chosen, name, None
            return owners[0], name, f"'{name}' is ambiguous ({', '.join(owners)}); took {owners[0]}"
        for sep in _SEPARATORS:
            head, found, tail = name.partition(sep)
            if found and head in self.tools and tail in self.tools[head]:
                return head, tail, None
        for sep in _SEPARATORS:
            head, found, tail = name.partition(sep)
            if found and head in self.tools:
                return head, tail, f"environment '{head}' has no tool '{tail}'"
        return "", name, f"no environment in this task has a tool '{name}'"


def split_name(name: str) -> tuple[str, str]:
    """Without an index: `server.tool` / `server__tool` split syntactically; a plain name has server `""`."""
    for sep in _SEPARATORS:
        head, found, tail = name.partition(sep)
        if found and head and tail:
            return head, tail
    return "", name


def _snippet(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "…"


def json_problem(value: Any, depth: int = 0) -> str | None:
    """None when `value` is plain JSON data (str keys, JSON scalars) nested at most MAX_DEPTH deep."""
    if depth > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH} levels"
    if value is None or isinstance(value, _SCALARS):
        return None
    inner = depth < MAX_DEPTH  # a scalar one level down is fine: not visited
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"a non-string key {k!r}"
            if inner and (v is None or isinstance(v, _SCALARS)):
                continue
            problem = json_problem(v, depth + 1)
            if problem is not None:
                return problem
        return None
    if isinstance(value, list):
        for v in value:
            if inner and (v is None or isinstance(v, _SCALARS)):
                continue
            problem = json_problem(v, depth + 1)
            if problem is not None:
                return problem
        return None
    return f"a value of type {type(value).__name__}"


_SCALARS = (str, bool, int, float)


BlockMemo = dict[str, tuple[ToolCall, ...]]  # a JSON block's text -> the calls it holds (read cleanly)
_BLOCKS_KEPT = 128
_BLOCK_MEMO_CHARS = 4_000  # longer blocks are read every time (a memo of a few long texts would hold megabytes)
# a block with more opening brackets is read every time: JSON nested near the interpreter's recursion limit decodes
# or not by how deep the caller's stack is (a chat message's text sits deeper than a plain string's), so its
# reading may not be remembered from one place for another
_BLOCK_MEMO_BRACKETS = 128


class _Parser:
    def __init__(self, index: ToolIndex | None, max_calls: int, max_chars: int, memo: BlockMemo | None) -> None:
        self.index = index
        self.max_calls = max_calls
        self.max_chars = max_chars
        self.memo = memo
        self.looks = 0  # formats noted (`seen`), counted: a block that notes one is not memoized
        self.out = ParsedCompletion()

    # ---- bookkeeping -------------------------------------------------------------------------
    def bad(self, where: str, text: Any, reason: str) -> None:
        shown = text if isinstance(text, str) else _safe_repr(text)
        self.out.unparseable.append(BadCall(where=where, text=_snippet(shown), reason=reason))

    def seen(self, fmt: str) -> None:
        self.looks += 1
        if fmt not in self.out.formats:
            self.out.formats.append(fmt)

    def add(self, where: str, name: Any, arguments: Any, server: Any = None, call_id: Any = None) -> None:
        if not isinstance(name, str) or not name.strip():
            self.bad(where, {"name": name, "arguments": arguments}, "no tool name (a non-empty string 'name')")
            return
        name = name.strip()
        if isinstance(arguments, str):
            text = arguments.strip()
            if not text:
                arguments = {}
            else:
                try:
                    arguments = json.loads(text)
                except (ValueError, RecursionError) as e:
                    self.bad(where, text, f"arguments of '{name}' are not valid JSON: {_why(e)}")
                    return
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            self.bad(where, _safe_repr(arguments), f"arguments of '{name}' must be a JSON object")
            return
        problem = json_problem(arguments)
        if problem is not None:
            self.bad(where, _safe_repr(arguments), f"arguments of '{name}' are not plain JSON: {problem}")
            return
        if len(self.out.calls) >= self.max_calls:
            self.out.dropped += 1
            return
        srv = server.strip() if isinstance(server, str) and server.strip() else None
        if self.index is not None:
            srv, tool, note = self.index.resolve(name, srv)
            if note is not None:
                self.out.problems.append(f"{where}: {note}")
        elif srv is None:
            srv, tool = split_name(name)
        else:
            tool = name
        cid = call_id if isinstance(call_id, str) else None
        # validated: as fast as model_construct here, and every field is already of its type
        self.out.calls.append(ToolCall(server=srv, name=tool, arguments=arguments, id=cid))

    # ---- objects -----------------------------------------------------------------------------
    def any(self, value: Any) -> None:
        if isinstance(value, str):
            self.text(value, "completion")
        elif isinstance(value, bytes | bytearray):
            self.text(bytes(value).decode("utf-8", errors="replace"), "completion")
        elif isinstance(value, dict):
            self.object(value, "completion")
        elif isinstance(value, list | tuple):
            if not value:
                return
            for i, item in enumerate(value):
                where = f"message {i}"
                if isinstance(item, dict):
                    self.object(item, where)
                elif isinstance(item, str):
                    self.text(item, where)
                else:
                    self.out.problems.append(f"{where}: a {type(item).__name__}, not a message; skipped")
        elif value is None:
            self.out.error = "no completion (None)"
        else:
            self.out.error = f"unsupported completion type {type(value).__name__}"

    def object(self, obj: dict[Any, Any], where: str) -> None:
        """A chat message, an OpenAI tool-call item, or a bare call object."""
        if "role" in obj or "tool_calls" in obj or ("content" in obj and "name" not in obj):
            self.message(obj, where)
        else:
            self.call_object(obj, where)

    def message(self, msg: dict[Any, Any], where: str) -> None:
        role = msg.get("role", "assistant")
        if role != "assistant":
            return
        calls = msg.get("tool_calls")
        if calls:
            self.seen("openai")
            if not isinstance(calls, list | tuple):
                self.bad(where, calls, "'tool_calls' must be a list")
            else:
                for j, c in enumerate(calls):
                    self.call_object(c, f"{where} tool_calls[{j}]")
            return
        legacy = msg.get("function_call")
        if isinstance(legacy, dict):
            self.seen("openai")
            self.call_object(legacy, f"{where} function_call")
            return
        content = msg.get("content")
        if isinstance(content, str):
            self.text(content, where)
        elif isinstance(content, list):  # content parts: [{"type": "text", "text": ...}]
            parts = [p.get("text") if isinstance(p, dict) else p for p in content]
            self.text("".join(p for p in parts if isinstance(p, str)), where)
        elif content is not None:
            self.out.problems.append(f"{where}: content is a {type(content).__name__}; ignored")

    def call_object(self, obj: Any, where: str) -> None:
        if not isinstance(obj, dict):
            self.bad(where, obj, "a tool call must be a JSON object")
            return
        fn = obj.get("function")
        if isinstance(fn, dict):
            args = fn.get("arguments", fn.get("parameters"))
            self.add(where, fn.get("name"), args, fn.get("server", obj.get("server")), obj.get("id"))
            return
        args = obj.get("arguments", obj.get("parameters"))
        self.add(where, obj.get("name"), args, obj.get("server"), obj.get("id"))

    def json_value(self, value: Any, where: str, text: str) -> None:
        """A decoded JSON value that should be call(s)."""
        if isinstance(value, list):
            if not value:
                return
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    self.object(item, f"{where}[{i}]")
                else:
                    self.bad(f"{where}[{i}]", item, "a tool call must be a JSON object")
        elif isinstance(value, dict):
            if "name" in value or "function" in value or "arguments" in value or "parameters" in value:
                self.call_object(value, where)
            elif "tool_calls" in value or "role" in value:
                self.message(value, where)
            else:
                self.bad(where, text, "a JSON object without 'name' is not a tool call")
        else:
            self.bad(where, text, f"a JSON {type(value).__name__} is not a tool call")

    # ---- text --------------------------------------------------------------------------------
    def text(self, text: str, where: str) -> None:
        if len(text) > self.max_chars:
            self.out.problems.append(f"{where}: {len(text)} characters; only the first {self.max_chars} were read")
            text = text[: self.max_chars]
        text = self.strip_think(text, where)
        if _OPEN in text or _CLOSE in text:
            self.hermes(text, where)
            return
        marker = text.find(_MISTRAL)
        if marker >= 0:
            self.seen("mistral")
            body = text[marker + len(_MISTRAL) :].strip()
            self.json_text(body, f"{where} [TOOL_CALLS]")
            return
        stripped = text.strip()
        if not stripped:
            return
        fenced = _FENCE.fullmatch(stripped) if stripped.startswith("```") else None
        if fenced is not None:
            stripped = fenced.group(1).strip()
        if stripped[:1] in "{[":
            self.seen("json")
            self.json_text(stripped, where)
            return
        if "<function=" in stripped:
            self.xml(stripped, where)
            return
        for k, m in enumerate(_FENCE.finditer(text)):  # prose with ```json fences: those holding calls count
            body = m.group(1).strip()
            value = _loads(body)
            if isinstance(value, dict | list) and _looks_like_calls(value):
                self.seen("json")
                self.json_value(value, f"{where} fence {k}", body)

    def strip_think(self, text: str, where: str) -> str:
        """Drop `<think>` traces (`envfactory.llm.thinking`'s rules); an unclosed one is a problem."""
        split = split_thinking(text)
        if split.unclosed:
            self.out.problems.append(f"{where}: unclosed <think>; the rest of the text was ignored")
        return split.visible

    def hermes(self, text: str, where: str) -> None:
        self.seen("hermes")
        pos, k = 0, 0
        while True:
            start = text.find(_OPEN, pos)
            if start < 0:
                if text.find(_CLOSE, pos) >= 0:
                    self.out.problems.append(f"{where}: a </tool_call> without its <tool_call>")
                return
            body_start = start + len(_OPEN)
            end = text.find(_CLOSE, body_start)
            block = f"{where} <tool_call> {k}"
            if end < 0:
                body = text[body_start:]
                self.out.problems.append(f"{block}: not closed (truncated?)")
                self.block(body, block, closed=False)
                return
            self.block(text[body_start:end], block, closed=True)
            pos, k = end + len(_CLOSE), k + 1

    def block(self, body: str, where: str, *, closed: bool) -> None:
        body = body.strip()
        fenced = _FENCE.fullmatch(body) if body.startswith("```") else None
        if fenced is not None:
            body = fenced.group(1).strip()
        if body.startswith("<function="):
            self.xml(body, where)
            return
        if not body:
            self.bad(where, body, "empty <tool_call> block" if closed else "an unclosed, empty <tool_call>")
            return
        if self.memo is None or len(body) > _BLOCK_MEMO_CHARS:
            self.json_text(body, where)
            return
        out = self.out
        hit = self.memo.get(body)
        if hit is not None:  # read before, cleanly: the same calls (they are never changed), kept up to max_calls
            for call in hit:
                if len(out.calls) >= self.max_calls:
                    out.dropped += 1
                else:
                    out.calls.append(call)
            return
        before = (len(out.calls), len(out.unparseable), len(out.problems), self.looks, out.dropped)
        self.json_text(body, where)
        if (len(out.unparseable), len(out.problems), self.looks, out.dropped) == before[1:] and (
            body.count("{") + body.count("[") <= _BLOCK_MEMO_BRACKETS
        ):
            if len(self.memo) >= _BLOCKS_KEPT:
                self.memo.clear()
            self.memo[body] = tuple(out.calls[before[0] :])

    def json_text(self, body: str, where: str) -> None:
        try:
            value, end = _DECODER.raw_decode(body)
        except (ValueError, RecursionError) as e:
            self.bad(where, body, f"invalid JSON: {_why(e)}")
            return
        rest = body[end:].strip()
        if rest:
            self.out.problems.append(f"{where}: text after the JSON ignored: {_snippet(rest)!r}")
        self.json_value(value, where, body)

    def xml(self, body: str, where: str) -> None:
        self.seen("xml")
        found = False
        for m in _XML_FUNCTION.finditer(body):
            found = True
            name = m.group(1)
            texts: frozenset[str] = frozenset()
            if self.index is not None:
                srv, tool, _ = self.index.resolve(name)
                texts = self.index.string_params.get((srv, tool), frozenset())
            args: dict[str, Any] = {}
            for p in _XML_PARAMETER.finditer(m.group(2)):
                raw = p.group(2).strip("\n")
                value = _NOT_JSON if p.group(1) in texts else _loads(raw.strip())
                args[p.group(1)] = raw if value is _NOT_JSON else value
            self.add(where, name, args)
        if not found:
            self.bad(where, body, "a <function=...> block without a name")


_NOT_JSON = object()


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _NOT_JSON


def _looks_like_calls(value: Any) -> bool:
    items = value if isinstance(value, list) else [value]
    return bool(items) and all(isinstance(v, dict) and ("name" in v or "function" in v) for v in items)


def _why(e: BaseException) -> str:
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return str(e).split("\n")[0][:120]


def _safe_repr(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, default=repr)
    except (ValueError, TypeError, RecursionError):
        try:
            text = repr(value)
        except Exception:  # a broken __repr__ must not break the parse
            text = f"<{type(value).__name__}>"
    return text[: _SNIPPET * 2]


def parse_tool_calls(
    completion: Any,
    index: ToolIndex | None = None,
    *,
    max_calls: int = MAX_CALLS,
    max_chars: int = MAX_CHARS,
    memo: BlockMemo | None = None,
) -> ParsedCompletion:
    """The tool calls of `completion` (text, a message, a list of messages). Never raises.

    `memo` (kept by the caller, for one `index`): `<tool_call>` blocks read cleanly before — no problem, no
    message inside, no unreadable call — give the same calls again without being decoded (a GRPO group's
    completions repeat calls). The calls are then shared between results: callers must not change them."""
    parser = _Parser(index, max_calls, max_chars, memo)
    try:
        parser.any(completion)
    except RecursionError:
        parser.out.error = "the completion is nested too deeply to read"
    except Exception as e:  # an object that breaks on access (a hostile __getitem__...): unreadable, not fatal
        parser.out.error = f"the completion could not be read: {type(e).__name__}"
    return parser.out
