"""The evaluated agent: a chat model solving one turn with the turn's tools, in its own episode.

The model gets the item's prompt (the ground-truth conversation so far, then the request) and its
tools (`bind_tools`), and runs until it answers without a call, up to `max_steps` model steps and
`timeout_s` seconds. Calls are read from the reply's native `tool_calls`, else from its text
(Qwen/Hermes `<tool_call>` blocks and the other formats `reward.tool_calls` reads). Every call runs in
the attempt's own `Episode` (its own sessions, forked from the turn's initial state): attempts share
nothing. A model error, a time-out or a spent step budget ends the attempt with a recorded `error`;
nothing raises out of `run_agent` for what the model does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage, convert_to_messages
from langchain_core.messages.utils import convert_to_openai_messages
from langchain_core.runnables import Runnable
from pydantic import BaseModel, Field

from envfactory.config import Role
from envfactory.env.pool import EnvPool
from envfactory.eval.items import EvalItem
from envfactory.eval.toolset import Toolset, tool_message
from envfactory.llm.errors import LLMCallError, LLMRequestRefused
from envfactory.llm.messages import message_text, stopped_at_cap
from envfactory.llm.models import setting_var
from envfactory.llm.thinking import strip_thinking
from envfactory.metatools import CALL_TOOL, COMPLETE_TASK, META_TOOLS, Hub
from envfactory.records.episode import Episode
from envfactory.records.models import States, StateVerifier, Task, ToolCall, ToolResult
from envfactory.reward.tool_calls import parse_tool_calls

ROLE: Role = "eval"


MODEL_ERROR = "model error: "  # how an attempt's error begins when the model call itself raised


def model_error(e: BaseException) -> str:
    """An attempt's `error` for a model call that raised (`MODEL_ERROR`, its type, the start of its message)."""
    return f"{MODEL_ERROR}{type(e).__name__}: {str(e)[:300]}"


class AgentLimits(BaseModel):
    """How an attempt runs: its budgets, and how the tools are shown."""

    max_steps: int = Field(default=8, ge=1, description="model steps per turn of an attempt")
    timeout_s: float = Field(default=300.0, gt=0, description="wall clock per attempt, checked between steps")
    tools: Literal["direct", "meta"] = Field(
        default="direct",
        description="direct: the turn's tools; meta: SynthAPI's meta-tools (list_apps, list_tools, "
        "get_tool_documentation, call_tool) over the turn's environments, discovered on demand",
    )


class AgentRun(BaseModel):
    """What one attempt did: its messages (OpenAI style, the model's part only), results, final state."""

    messages: list[dict[str, Any]] = Field(default_factory=list)
    results: list[ToolResult] = Field(default_factory=list)
    final: States = Field(default_factory=dict)
    answer: str = ""
    model_steps: int = 0
    text_calls: int = 0
    error: str | None = None
    transport_error: bool = False  # the model's server was not reached or failed (not a request it refused)


def _toolset(pool: EnvPool, item: EvalItem) -> Toolset:
    """The item's tools (the prompt's list), runnable: a name the prompt does not show is an unknown tool."""
    shown = {t.get("function", t).get("name") for t in item.tools}
    everything = Toolset(pool, item.servers)
    return Toolset(pool, item.servers, only={f"{s}.{t}" for n, (s, t) in everything.targets.items() if n in shown})


def _function(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


class _MetaTools:
    """SynthAPI's meta-tools over the item's environments, in the attempt's own hub episode."""

    def __init__(self, pool: EnvPool, item: EvalItem, direct: Toolset) -> None:
        self.hub = Hub(pool, apps=item.servers)
        task = Task(
            id=item.id,
            instruction="",
            servers=item.servers,
            initial_state=item.initial,
            verifier=StateVerifier(goal={}),
            solver=[],
        )
        self.episode = self.hub.episode(task)
        self.specs = [
            {
                "type": "function",
                "function": {"name": s.name, "description": s.description, "parameters": s.input_schema},
            }
            for s in META_TOOLS
            if s.name != COMPLETE_TASK  # the evaluation judges the attempt itself
        ]
        self.direct = direct

    def execute(self, name: str, args: Any, call_id: str) -> ToolResult:
        outcome = self.hub.invoke(self.episode, name, args if isinstance(args, dict) else {})
        return ToolResult(server="hub", name=name, ok=outcome.ok, result=outcome.payload, call_id=call_id)

    def results(self) -> list[ToolResult]:
        """The environments' results, call by call (what the results check compares)."""
        return [
            ToolResult(server=c.app, name=c.record.tool, ok=c.record.ok, result=c.record.payload())
            for c in self.episode.calls
        ]

    def as_direct(self) -> list[dict[str, Any]]:
        """The environment calls as one assistant message with direct calls, for the composite reward."""
        calls = [
            {
                "type": "function",
                "function": {"name": self.direct.exposed(c.app, c.record.tool), "arguments": c.record.arguments},
            }
            for c in self.episode.calls
        ]
        return [{"role": "assistant", "content": "", "tool_calls": calls}] if calls else []

    def history(self, prompt: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The prompt with its earlier direct calls written as `call_tool` calls, as a meta-tool agent makes them."""
        out = []
        for m in prompt:
            calls = m.get("tool_calls")
            if m.get("role") == "assistant" and calls:
                rewritten = []
                for c in calls:
                    fn = c.get("function", {})
                    server, tool = self.direct.targets.get(fn.get("name", ""), ("", fn.get("name", "")))
                    args = {"app": server, "tool": tool, "arguments": fn.get("arguments") or {}}
                    rewritten.append({**c, "function": {"name": CALL_TOOL, "arguments": args}})
                m = {**m, "tool_calls": rewritten}
            out.append(m)
        return out


Call = tuple[str, Any, str]  # name, arguments, call id


class Reply(NamedTuple):
    """A model's reply as a tool-using loop reads it."""

    raw: str  # the text, thinking included
    text: str  # the visible text
    calls: list[Call]  # native tool calls, else the ones written in the text
    invalid: list[Call]  # native calls whose arguments could not be read (arguments as the model sent them)
    from_text: int  # how many of `calls` came from the text


def invoke(bound: Runnable[Any, BaseMessage], messages: list[BaseMessage], item: str) -> BaseMessage:
    """One model step, tagged with the eval role and the item (for token accounting and traces)."""
    return bound.invoke(messages, config={"tags": [f"role:{ROLE}"], "metadata": {"role": ROLE, "item": item}})


def read_reply(reply: BaseMessage, prefix: str, name: Callable[[ToolCall], str] | None = None) -> Reply:
    """The calls of `reply`: its native `tool_calls` (readable and not), else — when it made no native call
    at all — those written in its text (Hermes `<tool_call>` and the reward parser's other formats; `name`
    maps a parsed call to the name to run). A call without an id gets one made from `prefix`."""
    raw = message_text(reply)
    calls: list[Call] = []
    invalid: list[Call] = []
    if isinstance(reply, AIMessage):
        calls = [(tc["name"], tc["args"], tc.get("id") or f"{prefix}c{j}") for j, tc in enumerate(reply.tool_calls)]
        invalid = [
            (str(b.get("name") or "?"), b.get("args"), b.get("id") or f"{prefix}b{j}")
            for j, b in enumerate(reply.invalid_tool_calls)
        ]
    from_text = 0
    if not calls and not invalid:
        parsed = parse_tool_calls(raw).calls
        calls = [(name(c) if name else c.name, c.arguments, f"{prefix}t{j}") for j, c in enumerate(parsed)]
        from_text = len(calls)
    return Reply(raw=raw, text=strip_thinking(raw).strip(), calls=calls, invalid=invalid, from_text=from_text)


def calls_message(text: str, calls: list[Call]) -> AIMessage:
    """The assistant message that made `calls` (arguments that are not an object sent as {})."""
    made = [{"name": n, "args": a if isinstance(a, dict) else {}, "id": i, "type": "tool_call"} for n, a, i in calls]
    return AIMessage(content=text, tool_calls=made)


def _exposed(call: ToolCall, toolset: Toolset) -> str:
    qualified = f"{call.server}__{call.name}"  # the parser splits `env__tool`; the toolset shows it whole
    return qualified if call.server and qualified in toolset.targets else call.name


class SimulatedUser:
    """The user of a conversational task: answers the model's question with what they know, in order.

    Per turn, the item records what the user said when the assistant asked (synth's clarifications: which of
    several look-alike records they mean). A model reply without a call that asks something (it holds a
    question mark) while the user still knows something for this turn gets the next piece as the user's
    message; any other reply without a call ends the turn. The user never volunteers what was not asked, and
    says each piece once."""

    def __init__(self, knows: list[list[str]]) -> None:
        self.knows = knows
        self.said: dict[int, int] = {}

    @property
    def replies(self) -> int:
        return sum(len(k) for k in self.knows)

    def answer(self, turn: int, text: str) -> str | None:
        pending = self.knows[turn] if turn < len(self.knows) else []
        said = self.said.get(turn, 0)
        if "?" not in text or said >= len(pending):
            return None
        self.said[turn] = said + 1
        return pending[said]


def run_agent(model: BaseChatModel, pool: EnvPool, item: EvalItem, limits: AgentLimits) -> AgentRun:
    """One attempt at `item` (see the module doc)."""
    toolset = _toolset(pool, item)
    meta = _MetaTools(pool, item, toolset) if limits.tools == "meta" else None
    episode = meta.episode if meta is not None else Episode(pool, item.initial, item.servers)
    messages: list[BaseMessage] = list(convert_to_messages(meta.history(item.prompt) if meta else item.prompt))
    bound = model.bind_tools(meta.specs if meta is not None else item.tools)
    run = AgentRun()
    start = time.monotonic()
    answered_turns: list[str] = []

    def finish(**update: Any) -> AgentRun:
        if meta is not None:  # what the environments saw: their results, and the calls as direct ones
            update = {"results": meta.results(), "messages": [*meta.as_direct(), *run.messages[-1:]], **update}
        return run.model_copy(update={"final": episode.dumps(), **update})

    user = SimulatedUser(item.user_knows)
    budget = limits.max_steps * (1 + len(item.followups)) + user.replies  # max_steps per turn, + each question
    for step in range(1, budget + 1):
        if time.monotonic() - start > limits.timeout_s:
            return finish(error=f"timed out: over {limits.timeout_s:g} s after {run.model_steps} model steps")
        try:
            message = invoke(bound, messages, item.id)
            reply = read_reply(message, f"s{step}", lambda c: _exposed(c, toolset))
        except Exception as e:  # a provider's failure is a failed attempt, whatever its type
            transport = isinstance(e, LLMCallError) and not isinstance(e, LLMRequestRefused)
            return finish(error=model_error(e), transport_error=transport)
        run.model_steps = step
        run.text_calls += reply.from_text
        text = reply.text
        calls = reply.calls + reply.invalid
        if not calls and stopped_at_cap(message):  # a call or an answer cut off: neither is the model's last word
            run.messages.append({"role": "assistant", "content": text})
            cap = setting_var(ROLE, "MAX_TOKENS")
            return finish(error=f"the reply stopped at the max_tokens limit, unfinished: raise {cap}")
        if not calls:
            run.messages.append({"role": "assistant", "content": text})
            if not text:
                return finish(error="the model's final answer is empty")
            reply_text = user.answer(len(answered_turns), text)
            if reply_text is not None:  # the model asked: the simulated user says what they know
                messages += [AIMessage(content=text), HumanMessage(content=reply_text)]
                run.messages.append({"role": "user", "content": reply_text})
                continue
            if len(answered_turns) < len(item.followups):  # whole-conversation mode: the next request
                request = item.followups[len(answered_turns)]
                answered_turns.append(text)
                messages += [AIMessage(content=text), HumanMessage(content=request)]
                run.messages.append({"role": "user", "content": request})
                continue
            return finish(answer=text)
        ai = calls_message(text, calls)
        messages.append(ai)
        answered: list[ToolMessage] = []
        for name, args, call_id in calls:
            if meta is not None:
                result = meta.execute(name, args, call_id)
            else:
                _, result = toolset.execute(episode, name, args, call_id)
            run.results.append(result)
            answered.append(tool_message(result))
        messages += answered
        run.messages += convert_to_openai_messages([ai, *answered])
    return finish(error=f"no final answer within {budget} model steps")
