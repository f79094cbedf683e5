"""The LLM layer's errors: a role's settings that cannot produce a model, and a model call that failed."""

from __future__ import annotations

from envfactory.errors import ConfigError, ServiceError


class LLMConfigError(ConfigError):
    """The LLM settings for a role cannot produce a model (provider none, missing file or package)."""


class LLMCallError(ServiceError):
    """A model call failed for a transport reason (timeout, connection, HTTP error) after the client's retries."""


class LLMRequestRefused(LLMCallError):
    """The server refused this request itself (HTTP 400, 413, 422: e.g. a prompt longer than the model's context),
    and would refuse it again: the asking step fails with the reason rather than the whole run."""
