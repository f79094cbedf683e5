"""The tool-aware chat template (`prompts/chat_templates/tool_chat.jinja`) for models that ship without one.

ChatML turns (`<|im_start|>role ... <|im_end|>`) with Hermes/Qwen-style tools: the tool list as JSON inside
`<tools>` in the system turn, calls as `<tool_call>{"name", "arguments"}</tool_call>`, results as
`<tool_response>` blocks in a user turn, `<think>` traces from `reasoning_content`. Every assistant reply and its
`<|im_end|>` sit inside `{% generation %}`, so `apply_chat_template(..., return_assistant_tokens_mask=True)` —
what TRL's `assistant_only_loss=True` uses — marks exactly the assistant's output, and TRL keeps the template
(it swaps in a training template only when the markers are missing).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict

from envfactory.errors import ConfigError
from envfactory.export.errors import ExportError
from envfactory.inputs import read_text

if TYPE_CHECKING:
    from envfactory.config import Settings

TEMPLATE_FILE = Path("chat_templates") / "tool_chat.jinja"
TURN_TOKENS = ("<|im_start|>", "<|im_end|>")
END_OF_TURN = "<|im_end|>"


class ChatTokenizer(Protocol):
    """What `ensure_chat_template` uses of a transformers tokenizer."""

    chat_template: Any
    eos_token: Any

    def get_vocab(self) -> dict[str, int]: ...

    def add_tokens(self, new_tokens: Any, special_tokens: bool = ...) -> int: ...


class ChatTemplateSetup(BaseModel):
    """What `ensure_chat_template` did. After `added_tokens`, resize the model's embeddings
    (`model.resize_token_embeddings(len(tokenizer))`); after a new `eos_token`, set the model's
    `generation_config.eos_token_id` to it so generation stops at the end of a turn."""

    model_config = ConfigDict(extra="forbid")

    installed: bool  # False: the tokenizer had a template and kept it
    added_tokens: list[str]
    eos_token: str | None  # the new end-of-sequence token, when it was changed


def tool_chat_template(settings: Settings) -> str:
    """The template text, from the settings' prompts folder (`ENVFACTORY_PROMPTS_DIR` overrides it)."""
    path = settings.prompts_path / TEMPLATE_FILE
    return read_text(path, error=lambda m: ExportError(f"chat template {m}"))


def ensure_chat_template(
    tokenizer: ChatTokenizer, settings: Settings | None = None, *, set_eos: bool = True
) -> ChatTemplateSetup:
    """Give a tokenizer without a chat template ours (read from `settings`' prompts folder, so they are needed
    then); one that has a template keeps it.

    The turn markers become single special tokens when the vocabulary lacks them, and (with `set_eos`) the
    end-of-turn marker becomes the EOS token, so a trained model stops after its reply (TRL's GRPO cuts
    completions at EOS)."""
    if tokenizer.chat_template:
        return ChatTemplateSetup(installed=False, added_tokens=[], eos_token=None)
    if settings is None:
        raise ConfigError("installing the tool chat template needs the settings (their prompts folder holds it)")
    tokenizer.chat_template = tool_chat_template(settings)
    vocab = tokenizer.get_vocab()
    added = [t for t in TURN_TOKENS if t not in vocab]
    if added:
        tokenizer.add_tokens(added, special_tokens=True)
    eos = None
    if set_eos and tokenizer.eos_token != END_OF_TURN:
        tokenizer.eos_token = END_OF_TURN
        eos = END_OF_TURN
    return ChatTemplateSetup(installed=True, added_tokens=added, eos_token=eos)
