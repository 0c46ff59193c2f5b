"""Who may call which of llama-server's routes through the proxy: two lists.

``CLIENT`` holds what an ordinary client may reach: one that passes ``PROXY_API_KEY``,
or anyone when it is unset (the lists are the same either way). ``ADMIN`` holds the
routes that change llama-server for every later request, or reach past it (a URL
fetched, a tool run, a body handed to any route): they need ``X-Admin-Key`` with
``PROXY_ADMIN_KEY``, and are refused to everyone when that is unset. A method and path on
neither list is treated as ``ADMIN``: a route a new llama-server adds stays closed until
it is listed here.

The paths are written as llama-server's ``tools/server/server.cpp`` registers them
(``:name`` is one path segment); two patterns are ours: ``{file}`` is any path whose last
segment has an extension (the web UI's files: no API route has one) and ``{any}`` is
every path. ``HEAD`` is allowed wherever ``GET`` is. A path with an empty, ``.`` or
``..`` segment matches nothing (an upstream that normalised it could reach another
route). ``GET /health``, ``/v1/models`` and ``/metrics`` are the proxy's own answers
(``proxy/app.py``) and on neither list.

``scripts/routes_doc.py`` renders both lists, against every route of the pinned build
(``scripts/llama_routes.txt``, extracted by ``scripts/llama_routes.py``), into
docs/operations.md; ``tests/unit/test_route_access.py`` fails while a route of that
build is on neither list.
"""

from __future__ import annotations

import re
from functools import cache
from typing import NamedTuple

__all__ = ["ADMIN", "CLIENT", "Rule", "needs_admin", "rule_for"]


class Rule(NamedTuple):
    method: str
    path: str  # llama-server's pattern: ":name" one segment; "{file}", "{any}" ours
    why: str


_GENERATES = "a generation, its length capped by --relay-max-tokens"
_READS = "reads, changes nothing"
_COUNTS = "counts a request's tokens"
_BY_ID = (
    "acts on one stream or completion by an id only its own client holds (see "
    "[streams by id](#streams-and-completions-by-id))"
)

CLIENT: tuple[Rule, ...] = (
    Rule("GET", "/", "the web UI"),
    Rule("GET", "/index.html", "the web UI"),
    Rule("GET", "{file}", "the web UI's files (a name with an extension: no API route has one)"),
    Rule("OPTIONS", "{any}", "CORS preflights: llama-server answers them without running a route"),
    Rule("GET", "/v1/health", "llama-server's own health"),
    Rule("GET", "/props", _READS),
    Rule("GET", "/models", _READS),
    Rule("GET", "/slots", _READS),
    Rule("GET", "/lora-adapters", _READS),
    Rule("POST", "/completion", _GENERATES),
    Rule("POST", "/completions", _GENERATES),
    Rule("POST", "/v1/completions", _GENERATES),
    Rule("POST", "/chat/completions", _GENERATES),
    Rule("POST", "/v1/responses", _GENERATES),
    Rule("POST", "/responses", _GENERATES),
    Rule("POST", "/v1/messages", _GENERATES),
    Rule("POST", "/infill", "a generation (fill in the middle)"),
    Rule("POST", "/v1/audio/transcriptions", "a transcription"),
    Rule("POST", "/audio/transcriptions", "a transcription"),
    Rule("POST", "/embedding", "embeddings"),
    Rule("POST", "/embeddings", "embeddings"),
    Rule("POST", "/v1/embeddings", "embeddings"),
    Rule("POST", "/tokenize", _READS),
    Rule("POST", "/detokenize", _READS),
    Rule("POST", "/apply-template", _READS),
    Rule("POST", "/chat/completions/input_tokens", _COUNTS),
    Rule("POST", "/v1/chat/completions/input_tokens", _COUNTS),
    Rule("POST", "/responses/input_tokens", _COUNTS),
    Rule("POST", "/v1/responses/input_tokens", _COUNTS),
    Rule("POST", "/v1/messages/count_tokens", _COUNTS),
    Rule("POST", "/v1/chat/completions/control", _BY_ID),
    Rule("GET", "/v1/stream", _BY_ID),
    Rule("DELETE", "/v1/stream", _BY_ID),
    Rule("POST", "/v1/streams/lookup", _BY_ID),
)

_ROUTER = "router mode: "
ADMIN: tuple[Rule, ...] = (
    Rule("POST", "/props", "changes the server's properties for every later request"),
    Rule("POST", "/slots/:id_slot", "erases a slot's cache, or saves or restores it as a file"),
    Rule("POST", "/lora-adapters", "sets every LoRA adapter's scale for every later request"),
    Rule("POST", "/models", _ROUTER + "adds a model"),
    Rule("DELETE", "/models", _ROUTER + "removes a model"),
    Rule("POST", "/models/load", _ROUTER + "loads a model (memory)"),
    Rule("POST", "/models/unload", _ROUTER + "unloads a model (its decisions then fail)"),
    Rule("GET", "/models/sse", _ROUTER + "the operator's feed of model loads, held open"),
    Rule("GET", "/cors-proxy", "llama-server fetches a URL for the caller"),
    Rule("POST", "/cors-proxy", "llama-server fetches a URL for the caller"),
    Rule("GET", "/tools", "the server-side tools llama-server runs"),
    Rule("POST", "/tools", "runs a server-side tool (files, shell)"),
    Rule(
        "POST",
        "/predict",
        "Vertex AI's predict route (AIP_PREDICT_ROUTE's default): hands its body to any "
        "route, the ones above included",
    ),
)


def rule_for(method: str, path: str) -> tuple[bool, Rule] | None:
    """The rule a request matches, with whether it needs the admin key; None when it is on
    neither list (and so needs the admin key). ``HEAD`` matches the ``GET`` rules."""
    segments = path.split("/")[1:]
    if not path.startswith("/") or (path != "/" and any(s in ("", ".", "..") for s in segments)):
        return None
    wanted = "GET" if method == "HEAD" else method
    for admin, rules in ((True, ADMIN), (False, CLIENT)):
        for rule in rules:
            if rule.method == wanted and _pattern(rule.path).fullmatch(path):
                return admin, rule
    return None


def needs_admin(method: str, path: str) -> bool:
    """Whether a request needs ``X-Admin-Key``: an ``ADMIN`` route, or one on neither list."""
    found = rule_for(method, path)
    return found is None or found[0]


@cache
def _pattern(path: str) -> re.Pattern[str]:
    if path == "{any}":
        return re.compile(r"/.*")
    if path == "{file}":
        return re.compile(r"(?:/[^/]+)*/[^/]+\.[^/.]+")
    return re.compile(re.sub(r":[^/]+", "[^/]+", re.escape(path)))
