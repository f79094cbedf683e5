"""Chat models per role: `openai` (any OpenAI-compatible endpoint), `local` (llama.cpp GGUF), `scripted`, and
providers other packages register (`envfactory.chat_models` entry points, e.g. `transformers`).

`chat_model(role)` reads `settings.llm_for(role)`; every model reports token usage in
`AIMessage.usage_metadata`, so one `UsageTracker` (`envfactory.llm.usage`) counts usage the same way for every
provider.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel

from envfactory.config import LLMSettings, Role, Settings
from envfactory.llm.errors import LLMConfigError
from envfactory.llm.llamacpp import LOCAL_HINT, LlamaCppChatModel
from envfactory.llm.openai_compat import openai_model
from envfactory.llm.scripted import shared_scripted
from envfactory.llm.usage import UsageTracker


def _resolve(path: Path, settings: Settings) -> Path:
    """Relative paths are tried from the working directory, then from the project root."""
    path = path.expanduser()
    if path.is_absolute() or path.exists():
        return path
    return settings.root / path


def setting_var(role: Role, field: str) -> str:
    """The environment variables that set `field` of the LLM settings, for everyone and for `role`."""
    return f"ENVFACTORY_LLM__{field} (or ENVFACTORY_LLM_ROLES__{role.upper()}__{field} for this role only)"


def _provider_entry_point(role: Role, provider: str) -> EntryPoint:
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group="envfactory.chat_models") if ep.name == provider]
    if not found:
        raise LLMConfigError(
            f"role '{role}': provider {provider} is not installed (no 'envfactory.chat_models' entry point "
            "named so): install the project with its train extra (pip install -e '.[train]')"
        )
    return found[0]


def _load_provider(role: Role, provider: str) -> Any:
    """The provider's factory, imported (`envfactory.chat_models` entry point)."""
    try:
        return _provider_entry_point(role, provider).load()
    except ImportError as e:
        raise LLMConfigError(f"role '{role}': provider {provider} cannot be imported: {e}") from None


def _entry_point_model(
    role: Role, cfg: LLMSettings, settings: Settings, callbacks: list[BaseCallbackHandler]
) -> BaseChatModel:
    """A provider another package registers (`envfactory.chat_models` entry points: name -> factory taking the
    role's settings, the settings and the callbacks): the library never imports it itself."""
    model: BaseChatModel = _load_provider(role, cfg.provider)(cfg, settings, callbacks)
    return model


def _check_entry_point_model(role: Role, cfg: LLMSettings, settings: Settings) -> None:
    """The provider found and imported, and its `check(cfg, settings)` run where it has one: what loading the model
    would refuse (a checkpoint that is not here), said before any work, without loading it."""
    check = getattr(_load_provider(role, cfg.provider), "check", None)
    if not callable(check):
        return
    try:
        check(cfg, settings)
    except (OSError, ValueError) as e:
        raise LLMConfigError(f"role '{role}': {e} (set {setting_var(role, 'MODEL')})") from None


def _local_gguf(role: Role, cfg: LLMSettings, settings: Settings) -> Path:
    """The role's GGUF file, checked: set, present, and llama-cpp-python importable (fail now, not mid-run)."""
    var = setting_var(role, "GGUF_PATH")
    if cfg.gguf_path is None:
        raise LLMConfigError(f"role '{role}': the local provider needs a GGUF file: set {var}")
    gguf = _resolve(cfg.gguf_path, settings)
    if not gguf.is_file():
        raise LLMConfigError(f"role '{role}': GGUF file {gguf} does not exist (set {var})")
    if importlib.util.find_spec("llama_cpp") is None:
        raise LLMConfigError(f"role '{role}': the local provider needs llama-cpp-python: {LOCAL_HINT}")
    return gguf


def check_configured(roles: Iterable[Role], settings: Settings) -> None:
    """Raise the `LLMConfigError` `chat_model` would raise for any of `roles`, without building a model (a GGUF
    file is not loaded): what a command checks before any work, so a missing model is one line, not a run of
    failures."""
    for role in roles:
        cfg = settings.llm_for(role)
        if cfg.provider == "local":
            _local_gguf(role, cfg, settings)
        elif cfg.provider == "transformers":
            _check_entry_point_model(role, cfg, settings)
        else:
            chat_model(role, settings)  # cheap: a client object or a parsed script; or "no LLM is configured"


def chat_model(role: Role, settings: Settings, usage: UsageTracker | None = None) -> BaseChatModel:
    """The chat model configured for `role`; with `usage`, its calls are counted under that role."""
    cfg = settings.llm_for(role)
    callbacks: list[BaseCallbackHandler] = [usage.handler(role)] if usage is not None else []
    if cfg.provider == "openai":
        return openai_model(role, cfg, callbacks)
    if cfg.provider == "local":
        gguf = _local_gguf(role, cfg, settings)
        return LlamaCppChatModel(
            gguf_path=gguf,
            n_ctx=cfg.n_ctx,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_tokens=cfg.max_tokens,
            callbacks=callbacks,
        )
    if cfg.provider == "transformers":
        return _entry_point_model(role, cfg, settings, callbacks)
    if cfg.provider == "scripted":
        if cfg.script is None:
            raise LLMConfigError(
                f"role '{role}': the scripted provider needs a script file: set {setting_var(role, 'SCRIPT')}"
            )
        script = _resolve(cfg.script, settings)
        if not script.is_file():
            var = setting_var(role, "SCRIPT")
            state = "is not a file" if script.exists() else "does not exist"
            raise LLMConfigError(f"role '{role}': script file {script} {state} (set {var})")
        return shared_scripted(script, callbacks=callbacks)
    raise LLMConfigError(
        f"no LLM is configured for role '{role}': set {setting_var(role, 'PROVIDER')} to openai (with "
        "ENVFACTORY_LLM__BASE_URL and ENVFACTORY_LLM__MODEL), local (with ENVFACTORY_LLM__GGUF_PATH) "
        "or scripted (with ENVFACTORY_LLM__SCRIPT)"
    )
