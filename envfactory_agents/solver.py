"""The solving agent of QueryGen (role "solver"): one pass@k branch of one turn.

The agent gets the involved environments' tools (LangChain tool specs built from the metadata's JSON
schemas; a name shared by two environments is exposed as `env__tool`), bound with `bind_tools`, and
executes its calls in its OWN `Episode` forked from the turn's initial state — branches never share
state. It runs at most `max_solve_iterations` model steps; the branch ends when the model answers
without a tool call. In the conversational variant, an answer that asks the user something (a line
ending with "?") before the turn's goal is reached goes to the simulated user (`envfactory_agents/user.py`),
whose reply continues the branch; user-side tools are then the user's, not the agent's.
"""

from __future__ import annotations

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig

from envfactory.env.pool import EnvPool
from envfactory.eval.toolset import UNKNOWN_SERVER, Toolset, history_messages, tool_message
from envfactory.llm.messages import message_text
from envfactory.llm.thinking import split_thinking
from envfactory.querygen.records import SOLVER_ROLE, Branch, SolveTask, UserCall, step_calls
from envfactory.querygen.select import matcher_for, turn_goal_reached
from envfactory.records.episode import Episode
from envfactory.records.models import Node, States, Step, ToolCall, ToolResult
from envfactory_agents.common import AgentDeps
from envfactory_agents.user import user_reply


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
