"""The only module that knows llama-server's HTTP endpoints and JSON.

Every call, decision reads and pass-through traffic (streams included), goes
through one aiohttp client session: pooled keep-alive connections, no cookie
jar, and never more calls in flight than llama-server has threads for (``Lanes``).
Everything returned is one of our own types; every failure leaves as an
``UpstreamError`` (see ``errors.py``), chaining the cause (aiohttp, OSError or
JSON):

    refused / reset / unresolvable, 503 loading -> UpstreamUnavailable (503)
    no answer in time                           -> UpstreamTimeout (504)
    4xx to a request built from client input    -> UpstreamRejected (400)
    5xx, 401/403, unparsable HTTP or JSON       -> UpstreamBadResponse (502)

Longer than 400 lines on purpose: it is the one boundary with llama-server (every
endpoint's JSON, the connection lanes, the translation of failures), and a second module
holding part of it would be a second place that knows llama-server's wire format.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from .config import Settings
from .errors import (
    UpstreamBadResponse,
    UpstreamError,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from .facts import Facts

__all__ = ["Upstream", "NextToken", "ModelInfo", "ModelList", "Relay", "parse_models"]

_log = logging.getLogger("proxy.upstream")

# Hop-by-hop and framing headers never copied between the two connections.
_HOP_HEADERS = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Content-Length",
        "Content-Encoding",
        "Host",
        "Authorization",
        "Server",
        "Date",
        "X-Admin-Key",  # the proxy's own secret, never passed on
    )
)

# llama-server closes idle connections after 5 s; drop ours before it does,
# or a request can be written into a connection that is closing.
_KEEPALIVE_S = 4.0
_ABSENT = object()
_UNTIMED = nullcontext()  # a call no request waits on (the self-check's, the app's)
# what a llama-server router answers for one model, named by ``?model=`` (its own
# /v1/models and /health are the router's)
_ROUTED_GETS = frozenset({"/props", "/slots"})
# calls that llama-server answers without a slot, at once: the quick lane's
_QUICK_PATHS = frozenset(
    {
        "/apply-template",
        "/tokenize",
        "/detokenize",
        "/props",
        "/slots",
        "/health",
        "/metrics",
        "/models",
        "/v1/models",
    }
)
_QUICK_CALLS = 2  # renderings, tokenisations and status calls in flight at once
_DEFAULT_SLOTS = 4  # llama-server's -np until its /props says (its own default)


class Lanes:
    """How many calls the proxy has in flight to llama-server at once: a quick lane of
    ``_QUICK_CALLS`` for what llama-server answers without a slot (rendering,
    tokenising, status) and a slot lane, one per llama-server slot this process reads
    through, for reads and relayed requests, which hold a connection while they wait
    for a slot and run; each a first come, first served ``asyncio.Semaphore``.

    llama-server (cpp-httplib) serves each open connection with one thread: a fixed
    pool of ``--threads-http`` (b11434: ``max(-np + 4, cores - 1)``) and extra threads
    started on demand, but the extra ones are started only when no thread is idle at
    the moment a connection arrives, so a burst of new connections beyond the fixed
    pool leaves some waiting until a busy thread is free: up to 5 s behind an idle
    keep-alive connection, a whole generation behind a busy one (a burst of 256
    requests saw planning calls wait 5, 10, ... 55 s; bench/investigations/
    connection_flood.py). Calls in flight bound the connections open (aiohttp reuses an
    idle one before opening another), so the proxy stays within the fixed pool:
    ``-np + 2``, plus one for the health check.

    ``max_connections`` (``--max-connections``), when set, fixes the slot lane at that
    many less the quick lane's; otherwise it follows the slots (``follow_slots``). A slot
    lane of two calls per slot (our launches raise ``--threads-http`` to match) lets a
    read wait in llama-server's queue behind another of its slot (``per_slot``)."""

    def __init__(self, max_connections: int = 0):
        self.quick = asyncio.Semaphore(_QUICK_CALLS)
        self._fixed = max(1, max_connections - _QUICK_CALLS) if max_connections else None
        self._slots: dict[object, int] = {}
        self.slot = asyncio.Semaphore(self._fixed or _DEFAULT_SLOTS)
        self.slot_size = self._fixed or _DEFAULT_SLOTS

    def follow_slots(self, slots: int, owner: object = None) -> None:
        """``owner`` reads through ``slots`` llama-server slots (behind a router each model
        has its own): the slot lane is their sum. A new size takes a new semaphore; the
        calls holding the old one finish on it (the lane is resized when llama-server's
        slots are first learnt or change, not per call)."""
        self._slots[owner] = slots
        size = self._fixed or max(1, sum(self._slots.values()))
        if size != self.slot_size:
            self.slot_size = size
            self.slot = asyncio.Semaphore(size)

    @property
    def per_slot(self) -> int:
        """Calls the slot lane has room for per slot, at most 2: with 2, a read can wait
        in llama-server's queue behind another of its slot (``kv.SlotBook.depth``)."""
        return max(1, min(2, self.slot_size // max(1, sum(self._slots.values()))))

    def for_path(self, path: str) -> asyncio.Semaphore:
        return self.quick if path.split("?", 1)[0] in _QUICK_PATHS else self.slot


@dataclass(frozen=True)
class NextToken:
    """Log-probabilities of the next token's top candidates, by token id, as
    llama-server sent them (only the values asked for are checked: see ``of``)."""

    logprobs: dict[Any, Any]
    model: str
    prompt_tokens: int
    prompt_evaluated: int  # prompt tokens actually computed (not served from cache)

    def of(self, token_ids: Sequence[int]) -> list[float] | None:
        """The log-probabilities of ``token_ids``; ``None`` if any is not in this read."""
        out = []
        for tid in token_ids:
            value = self.logprobs.get(tid, _ABSENT)
            if value is _ABSENT:
                return None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value > 0:
                raise UpstreamBadResponse(
                    f"llama-server sent {value!r} as the log-probability of token {tid}"
                )
            out.append(float(value))
        return out


@dataclass(frozen=True)
class Completion:
    """A ``/completion`` answer: the read, how many tokens came from the slot's cache and
    the seconds llama-server reports for it (``timings``: prompt plus predicted)."""

    read: NextToken
    cached: int
    seconds: float = 0.0


@dataclass(frozen=True)
class ModelInfo:
    id: str
    n_vocab: int | None
    n_ctx: int | None
    aliases: tuple[str, ...] = ()
    output_modalities: tuple[str, ...] = ("text",)
    created: int | None = None
    build: str = ""  # llama.cpp's build (/props build_info), "" when not told
    path: str = ""  # the GGUF path llama-server loaded (/props model_path)


@dataclass(frozen=True)
class ModelList:
    """llama-server's ``/v1/models`` answer: each model it lists, and the answer as sent
    (``body``: OpenAI's ``object`` and the rest; ``entries``: its ``data``), which the
    proxy passes on to clients with every field kept."""

    models: tuple[ModelInfo, ...]
    body: Mapping[str, Any]
    entries: tuple[Any, ...]


def parse_models(data: Any) -> ModelList:
    """A ``/v1/models`` answer read: its entries that name a model, as ``ModelInfo``."""
    if not isinstance(data, dict):
        raise UpstreamBadResponse("llama-server's /v1/models answer is not a JSON object")
    listed = data.get("data")
    entries: list[Any] = listed if isinstance(listed, list) else []
    models = tuple(_listed(e) for e in entries if isinstance(e, dict) and e.get("id") is not None)
    return ModelList(models, data, tuple(entries))


def _listed(entry: Mapping[str, Any]) -> ModelInfo:
    """One ``/v1/models`` entry: its id (required), vocabulary and context (``meta``, which
    a router lists only once the model is loaded), aliases, output modalities, creation."""
    meta, architecture = entry.get("meta") or {}, entry.get("architecture") or {}
    for name, value in (("meta", meta), ("architecture", architecture)):
        if not isinstance(value, dict):  # read as absent, n_ctx's checks would be skipped
            raise UpstreamBadResponse(
                f"llama-server's /v1/models entry {entry['id']!r} has a {name} that is not"
                " a JSON object"
            )
    aliases = entry.get("aliases")
    modalities = architecture.get("output_modalities")
    return ModelInfo(
        str(entry["id"]),
        _count(meta.get("n_vocab")),
        _count(meta.get("n_ctx")),
        tuple(str(a) for a in aliases) if isinstance(aliases, list) else (),
        tuple(str(m) for m in modalities)
        if isinstance(modalities, list) and modalities
        else ("text",),
        _count(entry.get("created")),
    )


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass
class Relay:
    """An upstream response being relayed: status, headers to copy, body chunks."""

    status: int
    headers: dict[str, str]
    is_stream: bool
    chunks: AsyncIterator[bytes]


class Upstream:
    def __init__(self, settings: Settings, session: aiohttp.ClientSession | None = None):
        self._base = settings.upstream_url.rstrip("/")
        self._retry_after = settings.retry_after_s
        self._down_since: float | None = None  # when llama-server stopped answering
        self._comebacks = [0]  # shared by for_model's copies: times llama-server came back
        self._ready_once = False  # its /health answered 200 once
        self.lanes = Lanes(settings.max_connections)  # shared by for_model's copies too
        self._lane_wait_s = settings.request_timeout_s
        # Streams may run longer than one call; they are bounded between chunks instead.
        self._stream_timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=settings.connect_timeout_s,
            sock_read=settings.request_timeout_s,
        )
        self._auth = (
            {"Authorization": f"Bearer {settings.upstream_api_key}"}
            if settings.upstream_api_key
            else {}
        )
        self._json_timeout = aiohttp.ClientTimeout(
            total=settings.request_timeout_s, sock_connect=settings.connect_timeout_s
        )
        self._read_timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=settings.connect_timeout_s
        )
        self._health_timeout = aiohttp.ClientTimeout(total=1.5)
        self._json_headers = {"Content-Type": "application/json", **self._auth}
        self.model: str | None = None  # a llama-server router's model these calls are for
        self._session = session or aiohttp.ClientSession(
            # the lanes bound the connections (limit=0: none of aiohttp's own)
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=_KEEPALIVE_S),
            cookie_jar=aiohttp.DummyCookieJar(),  # llama-server sets none; nothing to keep
            json_serialize=lambda o: orjson.dumps(o).decode(),
            skip_auto_headers=("User-Agent",),
        )

    def for_model(self, name: str) -> Upstream:
        """This client for one model of a llama-server in router mode (several models):
        every decision read names it (``model`` in POST bodies, ``?model=`` on
        ``/props`` and ``/slots``), as the router routes. Shares the connections."""
        bound = copy.copy(self)
        bound.model = name
        bound._down_since = None  # logged per model from here on
        return bound

    async def close(self) -> None:
        await self._session.close()

    # -- decision reads -------------------------------------------------------

    async def next_token(
        self,
        messages: list[dict[str, Any]],
        *,
        n_probs: int,
        template_kwargs: Mapping[str, Any] | None,
        slot: int | None = None,
        facts: Facts | None = None,
    ) -> NextToken:
        """One greedy token with the top ``n_probs`` log-probabilities of the raw logits
        (in llama-server slot ``slot``, when given; no grammar: see ``complete``)."""
        body: dict[str, Any] = {
            "messages": messages,
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": n_probs,
            "cache_prompt": True,
            "chat_template_kwargs": dict(template_kwargs or {}),
        }
        if slot is not None:
            body["id_slot"] = slot
        data = await self._request_json("POST", "/v1/chat/completions", body, facts=facts)
        try:
            first = data["choices"][0]["logprobs"]["content"][0]
            top = {e["id"]: e["logprob"] for e in first["top_logprobs"]}
            usage = data["usage"]
            prompt_tokens = int(usage["prompt_tokens"])
            cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
            model = str(data.get("model", ""))
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise UpstreamBadResponse(
                "llama-server's answer has no next-token log-probabilities"
            ) from exc
        return NextToken(top, model, prompt_tokens, max(0, prompt_tokens - cached))

    async def complete(
        self,
        tokens: Sequence[int],
        *,
        slot: int,
        cache: bool,
        n_probs: int = 0,
        facts: Facts | None = None,
    ) -> Completion:
        """Evaluate ``tokens`` in slot ``slot`` (``/completion``); with ``n_probs``, read the
        next token's top log-probabilities (of the raw logits: no grammar is sent, since
        one would only choose the generated token, which no decision uses, and on a CPU
        it can cost more than the read of the token itself)."""
        body: dict[str, Any] = {
            "prompt": list(tokens),
            "id_slot": slot,
            "cache_prompt": cache,
            "n_predict": 1 if n_probs else 0,
            "temperature": 0,
        }
        if n_probs:
            body["n_probs"] = n_probs
        # no per-call limit: a long prompt on a slow model reads for minutes, and every
        # caller bounds the read itself (a decision's deadline, the self-check's bound)
        data = await self._request_json(
            "POST", "/completion", body, timeout=self._read_timeout, facts=facts
        )
        try:
            timings = data["timings"]
            cached, evaluated = int(timings["cache_n"]), int(timings["prompt_n"])
            seconds = (
                float(timings.get("prompt_ms") or 0.0) + float(timings.get("predicted_ms") or 0.0)
            ) / 1000.0
            model = str(data.get("model", ""))
            top: dict[Any, Any] = {}
            if n_probs:
                first = data["completion_probabilities"][0]
                top = {e["id"]: e["logprob"] for e in first["top_logprobs"]}
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise UpstreamBadResponse(
                "llama-server's /completion answer has no timings or log-probabilities"
            ) from exc
        return Completion(NextToken(top, model, len(tokens), evaluated), cached, seconds)

    async def render(
        self,
        messages: list[dict[str, Any]],
        template_kwargs: Mapping[str, Any] | None,
        facts: Facts | None = None,
    ) -> str:
        """The prompt text the model's chat template makes of ``messages``."""
        body = {"messages": messages, "chat_template_kwargs": dict(template_kwargs or {})}
        data = await self._request_json("POST", "/apply-template", body, facts=facts)
        prompt = data.get("prompt") if isinstance(data, dict) else None
        if not isinstance(prompt, str):
            raise UpstreamBadResponse("llama-server's /apply-template answer has no prompt")
        return prompt

    async def tokenize(
        self, text: str, *, special: bool = False, facts: Facts | None = None
    ) -> list[int]:
        """``text``'s token ids; ``special``: with the model's BOS, as a prompt's start."""
        body = {"content": text, "add_special": special}
        data = await self._request_json("POST", "/tokenize", body, facts=facts)
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise UpstreamBadResponse("llama-server's /tokenize answer has no token ids")
        return tokens

    async def model_info(self, facts: Facts | None = None) -> ModelInfo:
        """The served model (a router's: the bound one) from ``/v1/models``, with its build
        and GGUF path from ``/props``."""
        data = await self._request_json("GET", "/v1/models", None, facts=facts)
        try:
            entries = data["data"]
            entry = (
                entries[0]
                if self.model is None
                else next(
                    e
                    for e in entries
                    if self.model == e.get("id") or self.model in (e.get("aliases") or ())
                )
            )
            info = _listed(entry)
        except StopIteration as exc:
            raise UpstreamBadResponse(
                f"llama-server's /v1/models answer no longer lists {self.model!r}"
            ) from exc
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise UpstreamBadResponse("llama-server's /v1/models answer names no model") from exc
        try:  # the build and the path are extras: a server without /props still serves
            props = await self._request_json("GET", "/props", None, facts=facts)
        except UpstreamError:
            return info
        if not isinstance(props, dict):
            return info
        build, path = props.get("build_info"), props.get("model_path")
        info = replace(
            info,
            build=build if isinstance(build, str) else "",
            path=path if isinstance(path, str) else "",
        )
        if info.n_ctx is None:  # a router lists a model's meta only once it is loaded
            n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
            if isinstance(n_ctx, int) and n_ctx > 0:
                info = replace(info, n_ctx=n_ctx)
        return info

    async def identity(self) -> dict[str, Any]:
        """What llama-server says of itself that can change its kernels' results: its
        build, the model (its path, ``/v1/models`` ``meta``: parameters, size, vocabulary,
        embedding width), its context and slots, and the chat template (which shapes every
        prompt). The key of a kept self-check verdict (proxy/verdicts.py)."""
        listed = await self._request_json("GET", "/v1/models", None)
        entries = listed.get("data") if isinstance(listed, dict) else None
        entry = next(
            (
                e
                for e in entries or ()
                if isinstance(e, dict)
                and (self.model is None or self.model in (e.get("id"), *(e.get("aliases") or ())))
            ),
            {},
        )
        try:
            props = await self._request_json("GET", "/props", None)
        except UpstreamError:  # a server without /props: its model list alone
            props = {}
        if not isinstance(props, dict):
            props = {}
        settings = props.get("default_generation_settings")
        return {
            "model": entry.get("id"),
            "meta": entry.get("meta"),
            "build": props.get("build_info"),
            "path": props.get("model_path"),
            "slots": props.get("total_slots"),
            "n_ctx": settings.get("n_ctx") if isinstance(settings, dict) else None,
            "template": props.get("chat_template"),
        }

    async def models_list(self) -> ModelList:
        """llama-server's ``/v1/models`` answer: every model it lists (a router's too)."""
        return parse_models(await self._request_json("GET", "/v1/models", None))

    async def is_router(self) -> bool:
        """Whether llama-server runs in router mode (several models, ``/props`` says
        ``role: router``); a server without ``/props`` is one model."""
        try:
            props = await self._request_json("GET", "/props", None)
        except (UpstreamUnavailable, UpstreamTimeout):
            raise  # not known yet: asked again
        except UpstreamError:  # no /props, or one that fails: one model, as model_info says
            return False
        return isinstance(props, dict) and props.get("role") == "router"

    async def reranks(self) -> bool | None:
        """Whether llama-server serves a reranker model (started with ``--reranking``: it
        answers ``/v1/rerank`` itself and cannot chat), from its answer to a one-document
        rerank: 200 from a reranker, 501 "not supported" (404 on older builds) from a
        chat model; ``None`` for any other answer (not known: ask again). Unavailable
        or loading: raised."""
        body: dict[str, Any] = {"query": "q", "documents": ["d"]}
        if self.model is not None:
            body["model"] = self.model
        try:
            status, raw = await self._call("POST", "/v1/rerank", orjson.dumps(body))
        except Exception as exc:  # noqa: BLE001 - translated, never swallowed
            raise self._translate(exc) from exc
        if status == 503:
            raise self._status_error(status, raw, "/v1/rerank")
        self._mark_up()
        return {200: True, 404: False, 501: False}.get(status)

    async def total_slots(self, facts: Facts | None = None) -> int | None:
        """How many requests llama-server computes at once (``-np``), if it says."""
        data = await self._request_json("GET", "/props", None, facts=facts)
        slots = data.get("total_slots") if isinstance(data, dict) else None
        return slots if isinstance(slots, int) and slots > 0 else None

    async def health(self) -> bool:
        try:
            async with self._session.get(
                self._base + "/health", headers=self._auth, timeout=self._health_timeout
            ) as resp:
                status = resp.status
                await resp.read()
        except TimeoutError:
            return False
        except (aiohttp.ClientError, OSError) as exc:
            self._mark_down(type(exc).__name__)
            return False
        if status == 200:
            self._mark_up()
            self._ready_once = True
        elif self._ready_once:  # ready before, loading now: it restarted between two calls
            self._mark_down(f"its /health answers {status}")
        return status == 200

    def _mark_down(self, why: str) -> None:
        """Log once when llama-server stops answering (not once per request)."""
        if self._down_since is None:
            self._down_since = time.monotonic()
            _log.warning(
                "llama-server at %s is unreachable (%s): it is not running or is restarting "
                "(its own log says why; under make run the supervisor starts it again). "
                "Requests get 503 with Retry-After until it answers.",
                self._base,
                why,
            )

    @property
    def epoch(self) -> int:
        """How many times llama-server came back after being unreachable (a restart: its
        slots are empty and its build may be another)."""
        return self._comebacks[0]

    def _mark_up(self) -> None:
        if self._down_since is not None:
            self._comebacks[0] += 1
            _log.info(
                "llama-server at %s answers again, after %.1fs unreachable",
                self._base,
                time.monotonic() - self._down_since,
            )
            self._down_since = None

    # -- pass-through ---------------------------------------------------------

    @asynccontextmanager
    async def relay(
        self,
        method: str,
        path: str,
        body: bytes | None,
        headers: Mapping[str, str],
        resend: bool = True,
    ) -> AsyncIterator[Relay]:
        """Send the client's bytes unchanged; yield the upstream answer to copy back.

        ``resend``: when llama-server drops the connection before any answer (a pooled
        connection it closed as we wrote), send the bytes once more on a fresh one. Safe
        for a request that only asks (an answer computed twice changes nothing but the
        slot's cache); the caller says no for one that controls the server."""
        out_headers = {k: v for k, v in headers.items() if k.lower() not in _HOP_HEADERS}
        out_headers.update(self._auth)

        async def send() -> aiohttp.ClientResponse:
            return await self._session.request(
                method,
                self._base + path,
                data=body,
                headers=out_headers,
                timeout=self._stream_timeout,
                auto_decompress=False,
            )

        try:
            lane = await self._enter_lane(path)
            try:
                try:
                    resp = await send()
                except aiohttp.ServerDisconnectedError:
                    if not resend:
                        raise
                    resp = await send()
                async with resp:
                    self._mark_up()
                    copy = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP_HEADERS}
                    if resp.status == 503 and "Retry-After" not in copy:
                        copy["Retry-After"] = str(self._retry_after)
                    if "Content-Encoding" in resp.headers:
                        copy["Content-Encoding"] = resp.headers["Content-Encoding"]
                    is_stream = resp.content_type == "text/event-stream"
                    connection = resp.connection
                    if is_stream and connection is not None and connection.protocol is not None:
                        # llama-server closes its end after an event stream without
                        # saying so (b11434): closed here too, never pooled dead
                        connection.protocol.force_close()
                    yield Relay(resp.status, copy, is_stream, self._chunks(resp))
            finally:
                lane.release()
        except UpstreamError:
            raise
        except Exception as exc:  # noqa: BLE001 - translated, never swallowed
            raise self._translate(exc) from exc

    async def _chunks(self, resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        try:
            async for chunk in resp.content.iter_any():
                yield chunk
        except Exception as exc:  # noqa: BLE001
            raise self._translate(exc) from exc

    # -- plumbing -------------------------------------------------------------

    async def _request_json(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        timeout: aiohttp.ClientTimeout | None = None,
        facts: Facts | None = None,
    ) -> Any:
        """``facts``: the request's that waits on this call (its time is counted there)."""
        if self.model is not None:  # a router routes POSTs by body, GETs by query
            if body is not None:
                body = {**body, "model": self.model}
            elif path in _ROUTED_GETS:
                path += "?model=" + quote(self.model, safe="")
        data = None if body is None else orjson.dumps(body)
        try:
            with facts.upstream if facts is not None else _UNTIMED:
                try:
                    status, raw = await self._call(method, path, data, timeout)
                except aiohttp.ServerDisconnectedError:
                    # A pooled connection the server closed as we wrote: these calls
                    # only read, so sending again once on a fresh connection is safe.
                    status, raw = await self._call(method, path, data, timeout)
        except Exception as exc:  # noqa: BLE001 - translated, never swallowed
            raise self._translate(exc) from exc
        self._mark_up()
        if status != 200:
            raise self._status_error(status, raw, path)
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise UpstreamBadResponse(f"llama-server answered {path} with invalid JSON") from exc

    async def _enter_lane(self, path: str) -> asyncio.Semaphore:
        """A place in ``path``'s lane (the caller releases it), waited for at most as long
        as the proxy waits for llama-server's answer (then a TimeoutError: UpstreamTimeout).
        A free place is taken without a timer: this runs for every call."""
        lane = self.lanes.for_path(path)
        if lane.locked():
            async with asyncio.timeout(self._lane_wait_s):
                await lane.acquire()
        else:
            await lane.acquire()  # returns at once
        return lane

    async def _call(
        self,
        method: str,
        path: str,
        data: bytes | None,
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> tuple[int, bytes]:
        lane = await self._enter_lane(path)
        try:
            async with self._session.request(
                method,
                self._base + path,
                data=data,
                headers=self._json_headers,
                timeout=timeout or self._json_timeout,
            ) as resp:
                return resp.status, await resp.read()
        finally:
            lane.release()

    def _status_error(self, status: int, raw: bytes, path: str) -> UpstreamError:
        message = _error_message(raw) or f"HTTP {status}"
        if status == 503:
            return UpstreamUnavailable(
                f"llama-server is not ready: {message}", retry_after_s=self._retry_after
            )
        if status in (401, 403):
            return UpstreamBadResponse(f"llama-server refused the proxy's credentials: {message}")
        if 400 <= status < 500:
            return UpstreamRejected(f"llama-server refused the request: {message}")
        return UpstreamBadResponse(f"llama-server failed on {path} (HTTP {status}): {message}")

    def _translate(self, exc: BaseException) -> UpstreamError:
        if isinstance(exc, UpstreamError):
            return exc
        if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
            return UpstreamTimeout("llama-server did not answer in time")
        # OSError: refused, reset, unreachable, a name that does not resolve (a
        # TimeoutError is an OSError too, which is why it is matched first)
        if isinstance(exc, (aiohttp.ClientConnectionError, OSError)):
            self._mark_down(type(exc).__name__)
            return UpstreamUnavailable(
                f"llama-server is unreachable: {type(exc).__name__}",
                retry_after_s=self._retry_after,
            )
        if isinstance(exc, aiohttp.ClientPayloadError):
            return UpstreamBadResponse("llama-server's answer was cut short")
        if isinstance(exc, aiohttp.ClientError):
            return UpstreamBadResponse(f"llama-server call failed: {type(exc).__name__}")
        raise exc


def _error_message(raw: bytes) -> str | None:
    """llama-server's error text from ``{"error": {"message": ...}}`` or a plain body."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        text = raw.decode("utf-8", "replace").strip()
        return text[:500] or None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        if isinstance(err, str):
            return err
    return None
