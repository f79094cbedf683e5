"""The LLM layer's errors (`envfactory.llm.errors`): what each one is caught as. The CLI prints any
`EnvFactoryError` as one line; the agents record a refused request as that step's failure and let every other
call error stop the run; a configuration error is never a call error."""

from __future__ import annotations

import pytest

from envfactory.errors import EnvFactoryError
from envfactory.llm.errors import LLMCallError, LLMConfigError, LLMRequestRefused


@pytest.mark.parametrize("error", [LLMConfigError, LLMCallError, LLMRequestRefused])
def test_every_llm_error_is_one_the_cli_reports(error: type[Exception]) -> None:
    assert issubclass(error, EnvFactoryError)


def test_a_refused_request_is_a_call_error_and_not_the_other_way_round() -> None:
    with pytest.raises(LLMCallError):
        raise LLMRequestRefused("HTTP 400: prompt longer than the context")
    assert not issubclass(LLMCallError, LLMRequestRefused)
    assert not issubclass(LLMConfigError, LLMCallError) and not issubclass(LLMCallError, LLMConfigError)
