"""Synthetic pools from the real pool's patterns, for benchmarks at scales the pool does not reach.

Variant v of an environment is a copy whose entity words — every x with an `x_id` parameter, and
the words of its record types (hotel, booking, ...) — are replaced by nouns drawn for that variant
(hotel → villa, booking → voucher), in tool names, parameter names, `$defs` names, references,
`required` lists and descriptions. What users say (cities, dates, names, amounts) stays as it is, as
in real large pools where ids differ per domain and common attributes repeat: so the share of
distinct parameter texts, which is what embedding costs, is realistic rather than 100 %.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

from envfactory.env.metadata import ToolSpec
from envfactory.toolgraph.params import ToolSource, input_params, output_params
from envfactory.words import record_words, tokens

_NOUN_TEXT = """
villa cabin lodge chalet cottage manor barge yacht kayak canoe glider scooter tram bus coach wagon
trailer parcel crate pallet bundle carton sample vial specimen reagent batch shipment cargo freight
depot dock pier garden orchard vineyard farm ranch barn silo meadow field plot greenhouse nursery
seed sapling harvest album track playlist podcast episode show movie trailer script scene studio
stage gallery exhibit mural course lesson module quiz exam grade cohort tutor mentor seminar lecture
workshop campus dorm locker invoice receipt voucher coupon rebate refund quote estimate contract
lease deed permit license badge pass ward clinic patient dose therapy scan referral visit nurse bed
shift roster crew squad team league match recipe dish menu pantry fridge oven grill bakery loaf cake
pastry snack meal diner bistro cafe canteen sensor beacon drone robot rover satellite antenna router
modem server cluster node bucket volume snapshot kennel pet puppy kitten stable horse saddle leash
collar aquarium tank reef pond hive colony nest burrow
"""
NOUNS: tuple[str, ...] = tuple(dict.fromkeys(_NOUN_TEXT.split()))  # unique, in order


def entity_words(sources: Sequence[ToolSource]) -> list[str]:
    """The words of one environment that name its entities (x of every `x_id`, record type words)."""
    words: set[str] = set()
    for s in sources:
        for p in (*input_params(s), *output_params(s)):
            toks = tokens(p.name)
            if len(toks) >= 2 and toks[-1] == "id":
                words.add(toks[-2])
        if s.return_type:
            words.update(record_words(s.return_type))
    return sorted(w for w in words if len(w) > 2)


def _replacer(mapping: dict[str, str]) -> re.Pattern[str]:
    alternatives = "|".join(sorted((re.escape(w) for w in mapping), key=len, reverse=True))
    # a whole word inside snake_case, CamelCase or prose, optionally plural: hotel, hotels, HotelSummary
    return re.compile(rf"(?<![A-Za-z])(?i:({alternatives}))(?=s?(?:[^a-z]|$))")


def _substitute(text: str, pattern: re.Pattern[str], mapping: dict[str, str]) -> str:
    def repl(m: re.Match[str]) -> str:
        word = m.group(1)
        new = mapping[word.lower()]
        if word.isupper() and len(word) > 1:
            return new.upper()
        return new.capitalize() if word[0].isupper() else new

    return pattern.sub(repl, text)


def _rewrite(value: Any, pattern: re.Pattern[str], mapping: dict[str, str]) -> Any:
    if isinstance(value, str):
        return _substitute(value, pattern, mapping)
    if isinstance(value, list):
        return [_rewrite(v, pattern, mapping) for v in value]
    if isinstance(value, dict):
        return {_substitute(k, pattern, mapping): _rewrite(v, pattern, mapping) for k, v in value.items()}
    return value


def variant(sources: Sequence[ToolSource], env: str, rng: random.Random) -> list[ToolSource]:
    """One synthetic copy of an environment's tools under the name `env`."""
    words = entity_words(sources)
    nouns = rng.sample(NOUNS, len(words)) if len(words) <= len(NOUNS) else [rng.choice(NOUNS) for _ in words]
    mapping = dict(zip(words, nouns, strict=True))
    out: list[ToolSource] = []
    for s in sources:
        spec = s.spec.model_dump(mode="json")
        if mapping:
            pattern = _replacer(mapping)
            spec = {k: v if k == "kind" else _rewrite(v, pattern, mapping) for k, v in spec.items()}
            ret = _substitute(s.return_type, pattern, mapping) if s.return_type else None
        else:
            ret = s.return_type
        out.append(
            ToolSource(
                env=env, domain=s.domain, env_description=s.env_description, spec=ToolSpec.model_validate(spec),
                return_type=ret,
            )
        )  # fmt: skip
    return out


def synthetic_sources(base: Sequence[ToolSource], n_tools: int, seed: int = 0) -> list[ToolSource]:
    """`n_tools` tools: the base pool itself first, then synthetic variants of its environments in turn."""
    by_env: dict[str, list[ToolSource]] = {}
    for s in base:
        by_env.setdefault(s.env, []).append(s)
    if not by_env:
        return []
    out = list(base)[:n_tools]
    v = 0
    while len(out) < n_tools:
        v += 1
        for env in sorted(by_env):
            if len(out) >= n_tools:
                break
            rng = random.Random(f"{seed}:{v}:{env}")
            out.extend(variant(by_env[env], f"{env}_v{v}", rng)[: n_tools - len(out)])
    return out
