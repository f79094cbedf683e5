"""A tiny randomly initialised Gemma 3 with the real Gemma tokenizer, for training smoke tests that run in seconds.

The tokenizer is the offline Gemma 3 270M GGUF's (extracted once, cached; see `training.loading`), given
EnvFactory's tool chat template (`<|im_start|>`/`<|im_end|>` become tokens 262144/262145 and `<|im_end|>` the
EOS). The model is a `Gemma3ForCausalLM` with the tokenizer's full vocabulary (so every id it can produce is
valid), 2 layers (one sliding-window, one global), hidden size 64, tied embeddings: ~17 M parameters, nearly all
in the embedding. It is saved with the tokenizer to a folder any `--model` accepts.

    python -m training.tiny_model [--out DIR] [--layers 2] [--hidden 64]
"""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from envfactory.config import get_settings
from envfactory.export.chat_template import tool_chat_template
from training.loading import (
    align_model,
    cache_root,
    gemma_gguf_path,
    gguf_tokenizer_dir,
    prepare_tokenizer,
    publish_folder,
)


class TinyModelConfig(BaseModel):
    """The tiny model's shape (Gemma3TextConfig fields)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layers: int = Field(default=2, ge=1)
    hidden: int = Field(default=64, ge=8)
    intermediate: int = Field(default=128, ge=8)
    heads: int = Field(default=2, ge=1)
    kv_heads: int = Field(default=1, ge=1)
    head_dim: int = Field(default=32, ge=4)
    sliding_window: int = Field(default=512, ge=16)
    max_positions: int = Field(default=32768, ge=256)
    seed: int = 0

    def key(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]


def _complete(folder: Path) -> bool:
    return all((folder / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer_config.json"))


def build_tiny_model(out: Path | None = None, config: TinyModelConfig | None = None, *, force: bool = False) -> Path:
    """Build (or reuse) the tiny model folder; returns it. Default folder: the training cache."""
    import torch
    from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig

    config = config or TinyModelConfig()
    tokenizer_dir = gguf_tokenizer_dir(gemma_gguf_path())
    # the folder saves the tool template it was built with: a changed template is a new folder, not a stale one
    template = hashlib.sha256(tool_chat_template(get_settings()).encode()).hexdigest()[:8]
    tokens = tokenizer_dir.name.rsplit("-", 1)[-1]
    target = out or cache_root() / f"tiny-gemma3-{config.key()}-{tokens}-{template}"
    if _complete(target) and not force:
        return target

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    prepare_tokenizer(tokenizer, "auto")
    layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(config.layers)]
    model_config = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden,
        intermediate_size=config.intermediate,
        num_hidden_layers=config.layers,
        num_attention_heads=config.heads,
        num_key_value_heads=config.kv_heads,
        head_dim=config.head_dim,
        query_pre_attn_scalar=config.head_dim,
        sliding_window=config.sliding_window,
        layer_types=layer_types,
        max_position_embeddings=config.max_positions,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(config.seed)
    model = Gemma3ForCausalLM(model_config)
    align_model(model, tokenizer)

    def write(folder: Path) -> None:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    return publish_folder(target, write, _complete, replace=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="folder (default: the training cache)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--force", action="store_true", help="rebuild even if the folder is complete")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = build_tiny_model(args.out, TinyModelConfig(layers=args.layers, hidden=args.hidden), force=args.force)
    print(path)


if __name__ == "__main__":
    main()
