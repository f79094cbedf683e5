"""The chat-model factory (`envfactory.llm.models`): a role's provider from the settings, and the configuration
errors that say which variable to set."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from envfactory.config import LLMSettings, Settings
from envfactory.llm.errors import LLMConfigError
from envfactory.llm.models import chat_model
from tests.support.llm import settings_with


def test_provider_none_explains_how_to_configure(tmp_path: Path) -> None:
    with pytest.raises(LLMConfigError) as e:
        chat_model("search", settings_with(tmp_path))
    msg = str(e.value)
    assert "no LLM is configured for role 'search'" in msg
    assert "ENVFACTORY_LLM__PROVIDER" in msg and "ENVFACTORY_LLM_ROLES__SEARCH__PROVIDER" in msg


def test_role_override_picks_the_provider(tmp_path: Path) -> None:
    script = tmp_path / "s.yaml"
    script.write_text("- coded\n")
    settings = Settings(root=tmp_path, llm_roles={"code": LLMSettings(provider="scripted", script=script)})
    assert chat_model("code", settings).invoke("x").content == "coded"
    with pytest.raises(LLMConfigError, match="role 'user'"):
        chat_model("user", settings)


def test_local_provider_errors(tmp_path: Path) -> None:
    with pytest.raises(LLMConfigError, match=r"needs a GGUF file: set ENVFACTORY_LLM__GGUF_PATH"):
        chat_model("code", settings_with(tmp_path, provider="local"))
    with pytest.raises(LLMConfigError, match=r"GGUF file .*missing\.gguf does not exist"):
        chat_model("code", settings_with(tmp_path, provider="local", gguf_path=tmp_path / "missing.gguf"))
    if importlib.util.find_spec("llama_cpp") is not None:
        pytest.skip("llama-cpp-python is installed here: the missing-package error cannot be shown")
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(LLMConfigError, match=r"pip install 'envfactory\[local\]'"):
        chat_model("code", settings_with(tmp_path, provider="local", gguf_path=gguf))
