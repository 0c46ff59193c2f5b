"""Model names: the one table of what a request may call the served model.

    the SDKs' documented names   "jev-latest" (System One), "gpt-6-luna" (OpenAI Decisions)
    llama-server's model id      its --alias (make run: the GGUF's stem) or the GGUF path
    llama-server's aliases       as /v1/models lists them
    the GGUF file's stem         so a path never has to be sent
    configured aliases           --model-aliases a,b (PROXY_MODEL_ALIASES)

All are listed by ``GET /v1/models`` and accepted wherever a request names a
model; the GGUF path llama-server loaded is accepted too, never listed. Pure
data: with a llama-server router, each served model has its own ``ModelNames`` and
only the default one carries the SDKs' names (proxy/served.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import PurePath

__all__ = ["SDK_NAMES", "ModelNames", "model_names", "parse_aliases"]

SDK_NAMES = ("jev-latest", "gpt-6-luna")  # typesafe-sdk's default; the openai SDK's Decisions


@dataclass(frozen=True)
class ModelNames:
    listed: tuple[str, ...]  # in the order /v1/models lists them
    path: str = ""  # accepted, never listed

    def accepts(self, name: str | None) -> bool:
        return name in self.listed or (bool(self.path) and name == self.path)


def model_names(
    model_id: str, aliases: Sequence[str] = (), path: str = "", configured: Sequence[str] = ()
) -> ModelNames:
    """The served model's names (module docstring), each once, in a fixed order."""
    names = [*SDK_NAMES, *configured, model_id, *aliases, PurePath(model_id).stem]
    return ModelNames(tuple(dict.fromkeys(n for n in names if n)), path)


@lru_cache(maxsize=8)  # the setting's one string, parsed once
def parse_aliases(text: str) -> tuple[str, ...]:
    """``--model-aliases``: comma-separated names, blanks dropped."""
    return tuple(a.strip() for a in text.split(",") if a.strip())
