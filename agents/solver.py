"""The solving agent of QueryGen (role "solver"): one pass@k branch of one turn.

The agent gets the involved environments' tools (LangChain tool specs built from the metadata's JSON
schemas; a name shared by two environments is exposed as `env__tool`), bound with `bind_tools`, and
executes its calls in its OWN `Episode` forked from the turn's initial state — branches never share
state. It runs at most `max_solve_iterations` model steps; the branch ends when the model answers
without a tool call. In the conversational variant, an answer that asks the user something (a line
ending with "?") before the turn's goal is reached goes to the simulated user (`agents/user.py`),
whose reply continues the branch; user-side tools are then the user's, not the agent's.
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig

from agents.common import AgentDeps
from agents.user import user_reply
from envfactory.env.pool import EnvPool
from envfactory.llm.models import message_text
from envfactory.llm.thinking import split_thinking
from envfactory.querygen.records import SOLVER_ROLE, Branch, SolveTask, UserCall, step_calls
from envfactory.querygen.select import matcher_for, turn_goal_reached
from envfactory.tasks.episode import Episode, result_of
from envfactory.tasks.models import Node, States, Step, ToolCall, ToolResult

UNKNOWN_SERVER = "unknown"


class Toolset:
    """The tools of some environments as OpenAI-style function specs, and the way back to (env, tool)."""

    def __init__(
        self, pool: EnvPool, servers: list[str], exclude: set[str] | None = None, only: set[str] | None = None
    ) -> None:
        """`exclude` / `only`: qualified names ("env.tool") to leave out / to keep exclusively."""
        exclude = exclude or set()
        owners: dict[str, list[str]] = {}
        for server in servers:
            for name in pool.get(server).metadata.tool_names:
                owners.setdefault(name, []).append(server)
        self.specs: list[dict[str, Any]] = []
        self.targets: dict[str, tuple[str, str]] = {}  # exposed name → (env, tool)
        self._exposed: dict[tuple[str, str], str] = {}
        for server in servers:
            for spec in pool.get(server).metadata.tools:
                exposed = spec.name if len(owners[spec.name]) == 1 else f"{server}__{spec.name}"
                self._exposed[(server, spec.name)] = exposed
                qualified = f"{server}.{spec.name}"
                if qualified in exclude or (only is not None and qualified not in only):
                    continue
                self.targets[exposed] = (server, spec.name)
                self.specs.append(
                    {
                        "type": "function",
                        "function": {"name": exposed, "description": spec.description, "parameters": spec.input_schema},
                    }
                )

    def exposed(self, server: str, tool: str) -> str:
        return self._exposed.get((server, tool), tool)

    def execute(self, episode: Episode, name: str, args: Any, call_id: str | None) -> tuple[ToolCall, ToolResult]:
        """Run one call the model made; an unknown tool or bad arguments are failed results, never raised."""
        arguments = args if isinstance(args, dict) else {}
        target = self.targets.get(name)
        if target is None:
            call = ToolCall(server=UNKNOWN_SERVER, name=name, arguments=arguments, id=call_id)
            known = ", ".join(self.targets) or "none"
            error = {"error": {"type": "unknown_tool", "message": f"no tool '{name}'; available: {known}"}}
            return call, ToolResult(server=UNKNOWN_SERVER, name=name, ok=False, result=error, call_id=call_id)
        server, tool = target
        call = ToolCall(server=server, name=tool, arguments=arguments, id=call_id)
        if not isinstance(args, dict):
            error = {"error": {"type": "invalid_arguments", "message": "arguments must be a JSON object"}}
            return call, ToolResult(server=server, name=tool, ok=False, result=error, call_id=call_id)
        return call, result_of(call, episode.call(server, tool, arguments))


def tool_message(result: ToolResult) -> ToolMessage:
    content = json.dumps(result.result, ensure_ascii=False, default=str)
    return ToolMessage(content=content, tool_call_id=result.call_id or "", name=result.name, status=_status(result))


def _status(result: ToolResult) -> Any:
    return "success" if result.ok else "error"


def history_messages(nodes: list[Node], toolset: Toolset) -> list[BaseMessage]:
    """Earlier turns as chat messages: the user's words, the assistant's words, its calls and their results.

    An assistant text directly before a tool_call step is one message with those calls, as the model gave it."""
    out: list[BaseMessage] = []
    for node in nodes:
        text: str | None = None  # an assistant text that may carry the next step's calls
        ids: list[str] = []
        for j, step in enumerate(node.steps):
            if step.role == "tool_call":
                calls = step.calls()
                ids = [c.id or f"n{node.index}s{j}c{k}" for k, c in enumerate(calls)]
                tool_calls = [
                    {"name": toolset.exposed(c.server, c.name), "args": c.arguments, "id": i, "type": "tool_call"}
                    for c, i in zip(calls, ids, strict=True)
                ]
                out.append(AIMessage(content=text or "", tool_calls=tool_calls))
                text = None
                continue
            if text is not None:
                out.append(AIMessage(content=text))
                text = None
            if step.role == "user":
                out.append(HumanMessage(content=str(step.content)))
            elif step.role == "assistant":
                text = str(step.content)
            else:
                for k, r in enumerate(step.results()):
                    call_id = r.call_id or (ids[k] if k < len(ids) else f"n{node.index}s{j}r{k}")
                    out.append(tool_message(r.model_copy(update={"call_id": call_id})))
        if text is not None:
            out.append(AIMessage(content=text))
    return out


def is_question(text: str) -> bool:
    """Does the answer ask the user something? A line that ends with a question mark."""
    return any(line.strip().endswith("?") for line in text.splitlines())


def _clock(states: States) -> str:
    clocks = sorted({str(s["clock"]) for s in states.values() if isinstance(s.get("clock"), str)})
    return ", ".join(clocks) or "unknown"


def _config(task: SolveTask) -> RunnableConfig:
    return {
        "tags": [f"role:{SOLVER_ROLE}", f"branch:{task.branch}"],
        "metadata": {"role": SOLVER_ROLE, "turn": task.turn, "branch": task.branch},
    }


def solve_branch(deps: AgentDeps, pool: EnvPool, task: SolveTask) -> Branch:
    """One branch: the model acts in its own episode until it answers (or the step budget is spent)."""
    cfg = task.config
    conversational = cfg.enable_user_interaction
    user_side = set(task.user_tools) if cfg.user_tools_on else set()
    toolset = Toolset(pool, task.servers, exclude=user_side)
    episode = Episode(pool, task.initial, task.servers)
    environments = [
        {"name": s, "description": pool.get(s).metadata.description, "tools": len(pool.get(s).metadata.tools)}
        for s in task.servers
    ]
    if conversational:
        user_actions = [
            {"tool": t, "description": pool.get(t.split(".", 1)[0]).metadata.tool(t.split(".", 1)[1]).description}
            for t in sorted(user_side)
        ]
        system = deps.prompts.get("solver/solve_conv").render(
            environments=environments, now=_clock(task.initial), user_actions=user_actions or "none"
        )
    else:
        system = deps.prompts.get("solver/solve").render(environments=environments, now=_clock(task.initial))
    history = [Node.model_validate(n) for n in task.history]
    messages: list[BaseMessage] = [*system, *history_messages(history, toolset), HumanMessage(content=task.query)]
    model = deps.model(SOLVER_ROLE).bind_tools(toolset.specs)
    user_toolset = Toolset(pool, task.servers, only=user_side)
    steps: list[Step] = [Step(role="user", content=task.query)]
    user_calls: list[UserCall] = []
    questions = 0

    def branch(iterations: int, answer: str = "", error: str | None = None) -> Branch:
        return Branch(
            turn=task.turn,
            branch=task.branch,
            steps=steps,
            final=episode.dumps(),
            answer=answer,
            user_calls=user_calls,
            iterations=iterations,
            questions=questions,
            error=error,
        )

    for iteration in range(1, cfg.max_solve_iterations + 1):
        reply = model.invoke(messages, config=_config(task))
        assert isinstance(reply, AIMessage)
        visible, thinking, _ = split_thinking(message_text(reply))
        text = visible.strip()
        invalid = list(reply.invalid_tool_calls or [])
        if reply.tool_calls or invalid:
            # some servers send calls without ids; the results must name the call they answer
            named = [
                {**tc, "id": tc.get("id") or f"t{task.turn}b{task.branch}s{iteration}c{j}"}
                for j, tc in enumerate(reply.tool_calls)
            ]
            reply = reply.model_copy(update={"tool_calls": named})
            messages.append(reply)
            if text or thinking:
                steps.append(Step(role="assistant", content=text, thinking=thinking))
            calls: list[ToolCall] = []
            results: list[ToolResult] = []
            for tc in reply.tool_calls:
                call, result = toolset.execute(episode, tc["name"], tc["args"], tc.get("id"))
                calls.append(call)
                results.append(result)
            for bad in invalid:
                name, cid = str(bad.get("name") or "?"), bad.get("id")
                call = ToolCall(server=UNKNOWN_SERVER, name=name, arguments={}, id=cid)
                problem = f"unparseable arguments: {bad.get('error')}"
                error = {"error": {"type": "invalid_arguments", "message": problem}}
                calls.append(call)
                results.append(ToolResult(server=UNKNOWN_SERVER, name=name, ok=False, result=error, call_id=cid))
            steps += [Step(role="tool_call", content=calls), Step(role="tool_result", content=results)]
            messages += [tool_message(r) for r in results]
            continue
        steps.append(Step(role="assistant", content=text, thinking=thinking))
        messages.append(AIMessage(content=text))
        asks = conversational and questions < cfg.max_user_replies and is_question(text)
        made = [c for c, r in step_calls(steps) if r.ok]
        if asks and not turn_goal_reached(task, episode.dumps(), made, matcher_for(pool)):
            questions += 1
            answer, performed = user_reply(
                deps,
                pool,
                task=task,
                dialog=steps,
                question=text,
                tools=user_toolset.specs,
                execute=lambda name, args, cid: user_toolset.execute(episode, name, args, cid),
            )
            if not answer:
                return branch(iteration, error="the simulated user gave no answer")
            steps.append(Step(role="user", content=answer))
            user_calls += [UserCall(step=len(steps) - 1, call=c, result=r) for c, r in performed]
            messages.append(HumanMessage(content=answer))
            continue
        if not text:
            return branch(iteration, error="the model's final answer is empty")
        return branch(iteration, answer=text)
    return branch(cfg.max_solve_iterations, error=f"no final answer within {cfg.max_solve_iterations} model steps")
