"""Routing shared by the graphs: a failed node sets a status, and the next edge goes to END."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from langgraph.graph import END


def ok_or_end(next_node: str, failed: str) -> Callable[[Mapping[str, Any]], str]:
    """A conditional edge: END when the state's `status` is `failed`, else `next_node`."""

    def route(state: Mapping[str, Any]) -> str:
        return END if state.get("status") == failed else next_node

    return route
