"""Error bodies as ``errors.py`` builds them: OpenAI's ``{"error": {...}}``, System
One's ``{"detail": [{loc, msg, type}]}`` for validation and ``{"detail": "..."}``
otherwise, and a failed jsonlines line's record."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from .wire import Open

__all__ = ["OpenAIError", "ValidationError", "DetailError", "ErrorRecord"]


class _ErrorFields(Open):
    message: str
    type: str
    param: str | None = Field(None, description="the refused field, dotted: messages.0.content")
    code: str | int | None = Field(None, description="llama-server's own errors: its status")


class OpenAIError(Open):
    error: _ErrorFields


class _InvalidField(Open):
    loc: list[str | int] = Field(description='where: "body", then the path into it')
    msg: str
    type: str


class ValidationError(Open):
    detail: Annotated[list[_InvalidField], Field(min_length=1)]


class DetailError(Open):
    detail: str


class _RecordFields(_ErrorFields):
    status: int = Field(description="the status the line would have had alone")
    detail: list[_InvalidField] | None = Field(None, description="a System One validation error's")


class ErrorRecord(Open):
    """A failed line of an application/jsonlines answer."""

    error: _RecordFields
