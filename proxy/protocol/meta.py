"""The proxy's own small answers: the model list, a model, health, liveness and SageMaker's
execution parameters (built in ``routes/meta.py`` and ``routes/invocations.py``)."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import Field

from .wire import Count, Open

__all__ = [
    "ModelObject",
    "ModelList",
    "Health",
    "Alive",
    "ExecutionParameters",
]


class ModelObject(Open):
    """OpenAI's model object for one name the served model answers to."""

    id: str
    object: Literal["model"]
    created: Count
    owned_by: str


class _ListedModel(Open):
    id: str  # llama-server's entries keep their own fields


class _SystemOneModel(Open):
    name: str
    description: str
    release_date: dt.date


class _SelfCheck(Open):
    """A model's repeatability self-check (decision/selfcheck.py)."""

    read_scheme: str
    repeatable: bool | None = Field(description="null until the check ran")
    detail: str
    checked_at: float = Field(description="unix time; 0 until the check ran")


class ModelList(Open):
    """llama-server's OpenAI list plus every name a model answers to, and the System One
    list (``models``), in one body."""

    object: Literal["list"] = "list"
    data: list[_ListedModel]
    models: list[_SystemOneModel]
    x_llama_build: str = Field(description="llama-server's build (/props build_info)")
    x_repeatable: dict[str, _SelfCheck] = Field(description="by model id")


class Health(Open):
    """Ready; not ready is a 503 in OpenAI's error shape (``NotReady``: code
    ``upstream_unavailable`` or ``self_check_running``)."""

    status: Literal["ok"]


class Alive(Open):
    status: Literal["alive"]


class ExecutionParameters(Open):
    MaxConcurrentTransforms: Count
    BatchStrategy: Literal["MULTI_RECORD"]
    MaxPayloadInMB: Count
