"""Hand-built tool chains, written as the sampler writes them (input sources included)."""

from __future__ import annotations

from envfactory.toolgraph.sampler import ChainStep, InputSource, ToolChain


def user(name: str, required: bool = True) -> InputSource:
    return InputSource(parameter=name, required=required, source="user")


def from_tool(name: str, tool: str, output: str, index: int) -> InputSource:
    return InputSource(parameter=name, required=True, source="tool", tool=tool, output=output, index=index)


def chain(steps: list[tuple[str, list[InputSource]]], turns: list[int] | None = None, seed: int = 7) -> ToolChain:
    tools = [t for t, _ in steps]
    sizes = turns or [len(tools)]
    grouped, pos = [], 0
    for size in sizes:
        grouped.append(tools[pos : pos + size])
        pos += size
    return ToolChain(
        tools=tools,
        servers=list(dict.fromkeys(t.split(".")[0] for t in tools)),
        turns=grouped,
        seed=seed,
        target_length=len(tools),
        steps=[ChainStep(tool=t, inputs=i) for t, i in steps],
    )


def hotel_chain() -> ToolChain:
    """search → book (turn 1) | cancel (turn 2)."""
    return chain(
        [
            ("hotels.search_hotels", [user("city")]),
            (
                "hotels.book_room",
                [
                    from_tool("hotel_id", "hotels.search_hotels", "hotel_id", 0),
                    user("guest_name"),
                    user("check_in"),
                    user("nights"),
                ],
            ),
            ("hotels.cancel_booking", [from_tool("booking_id", "hotels.book_room", "booking_id", 1)]),
        ],
        turns=[2, 1],
    )
