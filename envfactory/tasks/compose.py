"""Multi-turn conversations from sampled chains: turns that end at what the user wants, several goals per conversation.

The sampler gives dependency-satisfiable chains of a few tools. A conversation of the paper's data
has ~5 turns of ~3 calls: a user asks for one thing, the assistant looks up what it needs and does
it, the user asks for the next. So:

- **goal turns**: a chain is cut after each *goal* — a write, or a read whose result no later call
  of the chain consumes (the user wanted to know it). Reads consumed by the next call are lookups:
  they stay in the turn of the call that needs them, and the request does not narrate them. A turn
  holds at most `max_calls` calls (a long run of lookups is cut, its part a goal of its own);
- **several chains per conversation** (`join`): chains of the same environment (or environments,
  with `cross_env`) one after another; later chains run on the state the earlier ones left, and
  their ids may come from earlier turns' results (the booking made before), which the request then
  calls "that booking". The offline synthesis (`synth.synthesize_offline`) adds chains while the
  joined one still solves, until the conversation has the turns it drew.
"""

from __future__ import annotations

from collections.abc import Callable

from envfactory.toolgraph.sampler import ChainStep, ToolChain


def goal_turns(chain: ToolChain, kind: Callable[[str], str], max_calls: int = 3) -> list[list[str]]:
    """The chain's tools cut into turns, each ending at a goal (see the module's docstring)."""
    consumed = {s.index for step in chain.steps for s in step.inputs if s.source == "tool" and s.index is not None}
    turns: list[list[str]] = []
    current: list[str] = []
    for i, tool in enumerate(chain.tools):
        current.append(tool)
        goal = kind(tool) == "write" or i not in consumed
        if goal or len(current) >= max_calls or i == len(chain.tools) - 1:
            turns.append(current)
            current = []
    return turns


def _shifted(steps: list[ChainStep], offset: int) -> list[ChainStep]:
    return [
        ChainStep(
            tool=step.tool,
            inputs=[
                s.model_copy(update={"index": s.index + offset}) if s.index is not None else s for s in step.inputs
            ],
        )
        for step in steps
    ]


def join(chains: list[ToolChain], kind: Callable[[str], str], max_calls: int = 3) -> ToolChain:
    """One conversation's chain: `chains` one after another, each cut into goal turns."""
    tools: list[str] = []
    steps: list[ChainStep] = []
    cut: list[list[str]] = []
    for chain in chains:
        steps += _shifted(chain.steps, len(tools))
        tools += chain.tools
        cut += goal_turns(chain, kind, max_calls)
    return ToolChain(
        tools=tools,
        servers=list(dict.fromkeys(t.split(".", 1)[0] for t in tools)),
        turns=cut,
        seed=chains[0].seed,
        target_length=len(tools),
        steps=steps,
    )
