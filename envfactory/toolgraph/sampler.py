"""Topology-aware sampling of dependency-satisfiable tool chains (EnvFactory, section 3.3).

A chain starts at a random tool and walks to random Tool_Depend successors until it reaches its
target length. Before a tool joins, its inputs are resolved:

- an optional input is skipped with p = `skip_optional_p` (0.6);
- an input that is already satisfiable — user-provided, or produced (directly or indirectly) by a
  tool already in the chain — is skipped with p = `skip_satisfied_p` (0.9);
- otherwise a prior tool that outputs it is chosen (keeping the chain within `max_servers`
  environments) and *its* priors are resolved first, recursively, at most `max_depth` levels deep.

**Invariant**: every required input of every tool of a chain is user-provided or produced by an
earlier tool of the chain. The published pseudocode adds a tool even when no prior can be found; here
a tool whose required internal input cannot be satisfied is not added, and priors tentatively chosen
for it are dropped with it. Each step records which earlier tool provides each internal input.

Randomness: one `random.Random` per chain, seeded from the sampler's seed; candidate lists are
sorted before every choice, so a seed gives the same chains from a graph built the same way, and a
chain's own `seed` reproduces it alone (`sample_chain(seed)`). The global RNG is never used.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Literal

from pydantic import BaseModel, Field

from envfactory.config import ToolGraphSettings
from envfactory.toolgraph.errors import ToolGraphError
from envfactory.toolgraph.graph import ToolGraph


class InputSource(BaseModel):
    """Where one input of a chain step gets its value."""

    parameter: str
    required: bool
    source: Literal["user", "tool"]
    tool: str | None = None  # the providing tool ("env.tool"), earlier in the chain
    output: str | None = None  # the provider's output parameter name
    index: int | None = None  # the provider's position in the chain


class ChainStep(BaseModel):
    tool: str
    inputs: list[InputSource] = Field(default_factory=list)


class ToolChain(BaseModel):
    """A sampled chain: tools in call order, split into turns."""

    tools: list[str]  # "env.tool" ids
    servers: list[str]  # environments, in order of first use
    turns: list[list[str]]  # consecutive groups of `tools`, 1–5 each by default
    seed: int  # reproduces this chain: `TopologySampler(graph).sample_chain(seed, length)`
    target_length: int
    steps: list[ChainStep]

    @property
    def length(self) -> int:
        return len(self.tools)


class _Tentative:
    """A chain under construction: committed tools plus the priors being resolved for the next one."""

    def __init__(self, tools: list[str], steps: dict[str, list[InputSource]] | None = None) -> None:
        self.tools = list(tools)
        self.steps: dict[str, list[InputSource]] = dict(steps or {})
        self.pending: list[str] = []  # tools whose priors are being resolved (not yet appended)

    def copy(self) -> _Tentative:
        trial = _Tentative(self.tools, self.steps)
        trial.pending = list(self.pending)
        return trial

    def adopt(self, trial: _Tentative) -> None:
        self.tools, self.steps = trial.tools, trial.steps

    def busy(self, tool: str) -> bool:
        return tool in self.tools or tool in self.pending

    def servers(self, graph: ToolGraph) -> set[str]:
        # pending tools count: they will join, and their priors must fit beside them
        return {graph.env_of(t) for t in (*self.tools, *self.pending)}


class TopologySampler:
    """Samples `ToolChain`s from a `ToolGraph`."""

    def __init__(self, graph: ToolGraph, settings: ToolGraphSettings | None = None) -> None:
        self.graph = graph
        self.settings = settings or graph.settings
        self.all_tools = graph.tools()
        if not self.all_tools:
            raise ToolGraphError("the tool graph has no tools to sample from")

    # ---- public ---------------------------------------------------------------------------------

    def sample(self, n: int, length: tuple[int, int], seed: int = 0) -> list[ToolChain]:
        """`n` chains with lengths drawn from `length` (inclusive); fewer if the graph has too few long chains."""
        return list(self.iter_sample(n, length, seed))

    def iter_sample(self, n: int, length: tuple[int, int], seed: int = 0) -> Iterator[ToolChain]:
        lo, hi = length
        if lo < 1 or hi < lo:
            raise ToolGraphError(f"chain length range {lo}..{hi} is empty or starts below 1")
        master = random.Random(seed)
        made = 0
        for _ in range(n * self.settings.attempts_per_chain):
            if made >= n:
                return
            chain = self.sample_chain(master.getrandbits(63), length)
            if chain is not None:
                made += 1
                yield chain

    def sample_chain(self, seed: int, length: tuple[int, int]) -> ToolChain | None:
        """The chain of one seed: None when it ends (dead end, unsatisfiable start) below `length[0]`."""
        rng = random.Random(seed)
        target = rng.randint(*length)
        start = rng.choice(self.all_tools)
        chain = _Tentative([])
        if not self._admit(start, chain, rng):
            return None
        current = start
        while len(chain.tools) < target:
            nxt = self._walk(current, chain, rng)
            if nxt is None:
                break
            current = nxt
        tools = chain.tools[:target]  # priors may overshoot; a prefix keeps the invariant
        if len(tools) < length[0]:
            return None
        return self._finish(tools, chain, seed, target, rng)

    # ---- the walk -------------------------------------------------------------------------------

    def _walk(self, tool: str, chain: _Tentative, rng: random.Random) -> str | None:
        """Move to a random successor that can join the chain (trying others when one cannot)."""
        candidates = self.graph.successor_tools(tool, exclude=chain.tools)
        candidates = [c for c in candidates if self._server_ok(c, chain.servers(self.graph))]
        rng.shuffle(candidates)
        for cand in candidates:
            if self._admit(cand, chain, rng):
                return cand
        return None

    def _server_ok(self, tool: str, servers: set[str]) -> bool:
        return self.graph.env_of(tool) in servers or len(servers) < self.settings.max_servers

    def _admit(self, tool: str, chain: _Tentative, rng: random.Random) -> bool:
        """Resolve `tool`'s priors and append them and it to `chain`; False (chain untouched) if it cannot join."""
        if not self._server_ok(tool, chain.servers(self.graph)):
            return False
        trial = chain.copy()
        if not self._resolve(tool, trial, rng, depth=0):
            return False
        chain.adopt(trial)
        return True

    def _resolve(self, tool: str, chain: _Tentative, rng: random.Random, depth: int) -> bool:
        """Add priors for `tool`'s inputs, then `tool`, to `chain`. False if a required internal input
        stays unsatisfied (the caller discards `chain`)."""
        g, s = self.graph, self.settings
        chain.pending.append(tool)
        for param in g.inputs(tool):
            required = g.required(param)
            if not required and rng.random() < s.skip_optional_p:
                continue
            valid = g.validate_parameter(param, chain.tools)
            if valid and rng.random() < s.skip_satisfied_p:
                continue
            if depth < s.max_depth:
                self._add_prior(tool, param, chain, rng, depth)
            if required and not g.validate_parameter(param, chain.tools):
                return False
        chain.pending.remove(tool)
        chain.tools.append(tool)
        chain.steps[tool] = self._sources(tool, chain.tools[:-1])
        return True

    def _add_prior(self, tool: str, param: str, chain: _Tentative, rng: random.Random, depth: int) -> None:
        """Try producers of `param` in random order; keep the first whose own priors resolve."""
        servers = chain.servers(self.graph)
        candidates = [
            c
            for c in self.graph.tools_that_output(param, target_tool=tool)
            if not chain.busy(c) and self._server_ok(c, servers)
        ]
        rng.shuffle(candidates)
        for prior in candidates:
            trial = chain.copy()
            if self._resolve(prior, trial, rng, depth + 1):
                chain.adopt(trial)
                return

    def _sources(self, tool: str, earlier: list[str]) -> list[InputSource]:
        """Every input of `tool`: from the user, or from the earlier tool that provides it (internal ones
        always name their provider; an optional internal input without one is left out)."""
        g = self.graph
        out: list[InputSource] = []
        for param in g.inputs(tool):
            name, required = g.node(param)["name"], g.required(param)
            found = None if g.user_provided(param) else g.provider(param, earlier)
            if found is not None:
                provider, output = found
                out.append(
                    InputSource(
                        parameter=name,
                        required=required,
                        source="tool",
                        tool=provider,
                        output=g.node(output)["name"],
                        index=earlier.index(provider),
                    )
                )
            elif g.user_provided(param):
                out.append(InputSource(parameter=name, required=required, source="user"))
        return out

    # ---- turns ----------------------------------------------------------------------------------

    def _finish(self, tools: list[str], chain: _Tentative, seed: int, target: int, rng: random.Random) -> ToolChain:
        servers = list(dict.fromkeys(self.graph.env_of(t) for t in tools))
        return ToolChain(
            tools=tools,
            servers=servers,
            turns=split_turns(tools, rng, self.settings.turn_min, self.settings.turn_max),
            seed=seed,
            target_length=target,
            steps=[ChainStep(tool=t, inputs=chain.steps[t]) for t in tools],
        )


def split_into(tools: list[str], count: int, rng: random.Random) -> list[list[str]]:
    """`tools` cut into `count` consecutive non-empty turns at seeded places (fewer tools than that: one each)."""
    if not tools:
        return []  # no tools, no turns (not one empty turn)
    count = max(1, min(count, len(tools)))
    cuts = sorted(rng.sample(range(1, len(tools)), count - 1)) if count > 1 else []
    bounds = [0, *cuts, len(tools)]
    return [tools[a:b] for a, b in itertools.pairwise(bounds)]


def split_turns(tools: list[str], rng: random.Random, lo: int = 1, hi: int = 5) -> list[list[str]]:
    """Consecutive turns of lo..hi tools each (the last may be shorter than lo when too few remain)."""
    turns: list[list[str]] = []
    i = 0
    while i < len(tools):
        size = rng.randint(lo, hi)
        turns.append(tools[i : i + size])
        i += size
    return turns
