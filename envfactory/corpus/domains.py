"""The one mapping from APIs.guru's categories (`info.x-apisguru-categories`) to the project's domains.

A spec gets the domain of its first category that maps to a specific domain; `utilities` (the
catch-all: cloud, developer tools, infrastructure) only when none does, or when it has no category.
APIs.guru tags whole providers at once, so a provider's services share a domain: every Google API
is tagged analytics + media (→ research), every AWS API cloud (→ utilities).
"""

from __future__ import annotations

from collections.abc import Iterable

from envfactory.env.metadata import DOMAINS, Domain

FALLBACK: Domain = "utilities"

CATEGORY_DOMAINS: dict[str, Domain] = {
    # commerce: selling, buying, the customer side of a shop
    "ecommerce": "commerce",
    "marketing": "commerce",
    # finance
    "financial": "finance",
    "payment": "finance",
    # travel: getting somewhere, places
    "transport": "travel",
    "location": "travel",
    # office: work, communication, customers' requests
    "collaboration": "office",
    "email": "office",
    "messaging": "office",
    "enterprise": "office",
    "project_management": "office",
    "time_management": "office",
    "forms": "office",
    "support": "office",
    "customer_relation": "office",
    # lifestyle: media, entertainment, people
    "media": "lifestyle",
    "entertainment": "lifestyle",
    "social": "lifestyle",
    # research: data, analysis, text, learning
    "open_data": "research",
    "analytics": "research",
    "machine_learning": "research",
    "text": "research",
    "search": "research",
    "education": "research",
    # utilities: infrastructure and tools
    "cloud": "utilities",
    "developer_tools": "utilities",
    "hosting": "utilities",
    "iot": "utilities",
    "security": "utilities",
    "tools": "utilities",
    "monitoring": "utilities",
    "backend": "utilities",
    "storage": "utilities",
    "telecom": "utilities",
}

assert set(CATEGORY_DOMAINS.values()) <= set(DOMAINS)


def domain_of(categories: Iterable[str]) -> Domain:
    """The domain of a spec with these categories (in the spec's order)."""
    mapped = [CATEGORY_DOMAINS.get(c.strip().lower()) for c in categories]
    return next((d for d in mapped if d is not None and d != FALLBACK), FALLBACK)
