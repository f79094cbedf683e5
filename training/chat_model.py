"""A transformers checkpoint as a chat model: evaluate what `training/sft.py` / `training/grpo.py` wrote.

    ENVFACTORY_LLM_ROLES__EVAL__PROVIDER=transformers ENVFACTORY_LLM_ROLES__EVAL__MODEL=.envfactory/train/sft \\
        envfactory eval .envfactory/synth/run --out .envfactory/eval/sft

The `transformers` provider (registered through the `envfactory.chat_models` entry point, so the library never
imports training code) loads `model` — a checkpoint folder, a `.gguf` file or an alias of `training/loading.py` —
with the same tokenizer set-up as training (`chat_template: auto`), so a model is evaluated on prompts rendered
exactly as it was trained on: the tools in the template's `<tools>` block, its calls read back from the text
(Hermes `<tool_call>` blocks, parsed by the evaluation's text-call reader). One copy of the weights is loaded per
process and shared by every client (generation runs under a lock: torch already uses every core for one).
Sampling follows the role's `temperature` / `top_p` (0: greedy) and `max_tokens` new tokens per reply.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, convert_to_openai_messages
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, PrivateAttr

from training.loading import ChatTemplateMode, Dtype, TokenizerSetup, load_model_and_tokenizer

if TYPE_CHECKING:
    from collections.abc import Callable

    from langchain_core.callbacks import BaseCallbackHandler, CallbackManagerForLLMRun
    from langchain_core.tools import BaseTool
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from envfactory.config import LLMSettings, Settings


class LoadedModel:
    """A model and its tokenizer, prepared as for training, with the lock generation runs under."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, setup: TokenizerSetup | None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.setup = setup
        self.lock = threading.Lock()


_LOADED: dict[tuple[str, str, str], LoadedModel] = {}
_LOADING = threading.Lock()


def load_shared(spec: str, dtype: Dtype = "float32", chat_template: ChatTemplateMode = "auto") -> LoadedModel:
    """The process's one copy of `spec` (loaded on first use)."""
    key = (spec, dtype, chat_template)
    with _LOADING:
        if key not in _LOADED:
            model, tokenizer, setup = load_model_and_tokenizer(spec, dtype, chat_template)
            _LOADED[key] = LoadedModel(model, tokenizer, setup)
        return _LOADED[key]


def chat_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """OpenAI-style message dicts for `apply_chat_template`, tool-call arguments as objects (as in the export)."""
    out = cast(list[dict[str, Any]], convert_to_openai_messages(list(messages)))
    for message in out:
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            if isinstance(function.get("arguments"), str):
                with contextlib.suppress(json.JSONDecodeError):  # else the template writes the string as it is
                    function["arguments"] = json.loads(function["arguments"])
        if isinstance(message.get("content"), list):  # content blocks: the text parts
            message["content"] = "".join(b.get("text", "") for b in message["content"] if isinstance(b, dict))
    return out


class TransformersChat(BaseChatModel):
    """Greedy or sampled generation from a loaded checkpoint, the reply's text as the message (calls in it)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    spec: str
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 512
    _loaded: LoadedModel | None = PrivateAttr(default=None)

    @property
    def _llm_type(self) -> str:
        return "envfactory-transformers"

    @property
    def loaded(self) -> LoadedModel:
        if self._loaded is None:
            self._loaded = load_shared(self.spec)
        return self._loaded

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def render(self, messages: Sequence[BaseMessage], tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt the model sees: the conversation and the tools through its chat template, an open turn."""
        text = self.loaded.tokenizer.apply_chat_template(
            cast(Any, chat_messages(messages)),
            tools=cast(Any, tools or None),
            tokenize=False,
            add_generation_prompt=True,
        )
        return cast(str, text)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        import torch

        loaded = self.loaded
        prompt = self.render(messages, kwargs.get("tools"))
        tokenizer = loaded.tokenizer
        encoded = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        sample = self.temperature > 0
        options: dict[str, Any] = {"do_sample": sample, "max_new_tokens": self.max_tokens}
        if sample:
            options.update(temperature=self.temperature, top_p=self.top_p)
        else:  # greedy: the checkpoint's sampling defaults would only be warned about
            options.update(temperature=None, top_p=None, top_k=None)
        with loaded.lock, torch.inference_mode():
            output = loaded.model.generate(**encoded, **options, pad_token_id=tokenizer.pad_token_id)
        prompt_tokens = int(encoded["input_ids"].shape[1])
        new = output[0, prompt_tokens:]
        text = cast(str, tokenizer.decode(new, skip_special_tokens=True))
        for marker in stop or []:
            text = text.split(marker, 1)[0]
        usage = {
            "input_tokens": prompt_tokens,
            "output_tokens": int(new.shape[0]),
            "total_tokens": prompt_tokens + int(new.shape[0]),
        }
        message = AIMessage(content=text.strip(), usage_metadata=cast(Any, usage))
        return ChatResult(generations=[ChatGeneration(message=message)])


def from_settings(cfg: LLMSettings, settings: Settings, callbacks: list[BaseCallbackHandler]) -> BaseChatModel:
    """The `transformers` provider: `cfg.model` is the checkpoint (folder, `.gguf` or alias)."""
    spec = Path(cfg.model).expanduser()
    if not spec.is_absolute() and not spec.exists() and (settings.root / spec).exists():
        spec = settings.root / spec  # relative paths: from the working directory, then the project root
    return TransformersChat(
        spec=str(spec) if spec.exists() else cfg.model,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        max_tokens=cfg.max_tokens or 512,
        callbacks=callbacks,
    )
