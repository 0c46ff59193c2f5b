"""The error hierarchy and the one place that renders error bodies.

    ProxyError                      status  meaning
    ├── InvalidRequest              400     the client sent something we refuse; names the field
    │   ├── InvalidHeader           400     a request header we refuse; names the header
    │   ├── ProfileRefused          400     a calibration profile missing, broken or fitted for
    │   │                                   another model or prompt format
    │   ├── NotFound                404     no such model (GET /v1/models/{id})
    │   ├── RequestTooLarge         413     body over the configured size
    │   ├── UnsupportedEncoding     415     a Content-Encoding aiohttp does not decode
    │   └── Unprocessable           422     System One validation: a list of {loc, msg, type}
    ├── Unauthorized                401     missing or wrong bearer key
    ├── AdminOnly                   403     a route that needs X-Admin-Key, asked without it
    ├── Overloaded                  429     too many decisions in flight and queued (Retry-After)
    ├── InternalError               500     a failure no handler expected (a bug), logged under
    │                                       the request id it carries (X-Request-Id)
    ├── NotReady                    503     GET /health: llama-server loading or unreachable, or
    │                                       the self-check still running (Retry-After)
    └── UpstreamError                       llama-server could not give an answer
        ├── UpstreamUnavailable     503     unreachable or still loading (Retry-After)
        ├── UpstreamTimeout         504     no answer within the deadline
        ├── UpstreamBadResponse     502     answered, but with something we cannot use
        └── UpstreamRejected        400     refused the request we built (e.g. over context)

Foreign exceptions (aiohttp, JSON) are translated into these at the module that
meets them (``upstream.py``, the routes, the middleware); nothing else raises HTTP errors,
and every route's errors, the metrics' included, are these.

The bodies are built here, as plain data (``error_reply``: ``openai_error`` or
``system_one_error`` by the route's API), so that ``protocol/`` can raise these without
importing aiohttp; the middleware turns them into HTTP responses (``render_error``), and
``routes/invocations.py`` a failed jsonlines line into its record (``error_record``), both
after the middleware's ``handled`` has counted the failure.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "ProxyError",
    "InvalidRequest",
    "InvalidHeader",
    "ProfileRefused",
    "NotFound",
    "RequestTooLarge",
    "UnsupportedEncoding",
    "Unprocessable",
    "Unauthorized",
    "AdminOnly",
    "Overloaded",
    "InternalError",
    "NotReady",
    "UpstreamError",
    "UpstreamUnavailable",
    "UpstreamTimeout",
    "UpstreamBadResponse",
    "UpstreamRejected",
    "ErrorReply",
    "openai_error",
    "error_reply",
    "openai_error_body",
    "error_record",
    "system_one_error",
]


class ProxyError(Exception):
    status = 500
    error_type = "server_error"
    code: str = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def headers(self) -> dict[str, str]:
        return {}


class InvalidRequest(ProxyError):
    status = 400
    error_type = "invalid_request_error"
    code = "invalid_request"
    is_validation = True  # System One answers these as 422 validation errors


class InvalidHeader(InvalidRequest):
    """A request header we refuse (``param``: its name); System One's 422 puts it at
    ``loc: ["header", <name in lower case>]``, as FastAPI does."""

    code = "invalid_header"

    def __init__(self, message: str, header: str):
        super().__init__(message, param=header)


class ProfileRefused(InvalidRequest):
    """A named profile that does not exist, is broken, or was fitted for something else
    (``profile_store.py``; System One: a 422 validation entry at ``x_calibration``, as the
    API documents)."""

    code = "calibration_profile"


class NotFound(InvalidRequest):
    status = 404
    code = "model_not_found"


class RequestTooLarge(InvalidRequest):
    status = 413
    code = "request_too_large"


class UnsupportedEncoding(InvalidRequest):
    status = 415
    code = "unsupported_content_encoding"


class Unprocessable(InvalidRequest):
    """A System One request that fails validation; ``details`` are FastAPI-style entries."""

    status = 422
    code = "validation_error"

    def __init__(self, details: list[dict[str, Any]]):
        first = details[0]
        super().__init__(f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}")
        self.details = details


class Unauthorized(ProxyError):
    status = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class AdminOnly(ProxyError):
    """A llama-server route that needs the admin key (``routes/access.py``), asked without
    it or with a wrong one; ``param`` names the header."""

    status = 403
    error_type = "permission_error"
    code = "admin_key_required"


class InternalError(ProxyError):
    """A failure no handler expected (a bug): its traceback is logged under ``request_id``,
    which the answer carries in its message and in ``X-Request-Id``
    (``middleware.handled``)."""

    def __init__(self, request_id: str, what: str = "request"):
        super().__init__(f"the proxy failed to answer this {what} (request id {request_id})")
        self.request_id = request_id

    def headers(self) -> dict[str, str]:
        return {"X-Request-Id": self.request_id}


class _RetryLater(ProxyError):
    """An answer that tells the client when to try again (``Retry-After``)."""

    def __init__(self, message: str, *, code: str | None = None, retry_after_s: int = 2):
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


class Overloaded(_RetryLater):
    status = 429
    error_type = "rate_limit_error"
    code = "overloaded"


class NotReady(_RetryLater):
    """``GET /health`` before the proxy can answer decisions: ``code`` says why
    (``upstream_unavailable``: llama-server does not answer or loads its model;
    ``self_check_running``: the repeatability self-check holds the slots). A readiness
    answer, not a failure: neither logged nor counted as an upstream error."""

    status = 503
    error_type = "server_error"
    code = "not_ready"


class UpstreamError(ProxyError):
    status = 502
    error_type = "upstream_error"
    code = "upstream_error"


class UpstreamUnavailable(_RetryLater, UpstreamError):
    status = 503
    error_type = "upstream_error"
    code = "upstream_unavailable"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"


class UpstreamBadResponse(UpstreamError):
    status = 502
    code = "upstream_bad_response"


class UpstreamRejected(UpstreamError):
    """llama-server answered 4xx to a request the proxy built from the client's input."""

    status = 400
    error_type = "invalid_request_error"
    code = "upstream_rejected"


def openai_error_body(err: ProxyError) -> dict[str, Any]:
    return {
        "error": {
            "message": err.message,
            "type": err.error_type,
            "param": err.param,
            "code": err.code,
        }
    }


def error_record(err: ProxyError) -> dict[str, Any]:
    """One failed jsonlines line: OpenAI's error fields plus the status it would have had
    alone (and System One's ``detail[]`` for a validation error)."""
    record: dict[str, Any] = {"status": err.status, **openai_error_body(err)["error"]}
    if isinstance(err, Unprocessable):
        record["detail"] = err.details
    return {"error": record}


class ErrorReply(NamedTuple):
    """An error answer as data: its status, its JSON body and its extra headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str]


def openai_error(err: ProxyError) -> ErrorReply:
    return ErrorReply(err.status, openai_error_body(err), err.headers())


def system_one_error(err: ProxyError) -> ErrorReply:
    """System One errors: 422 ``{"detail": [{loc, msg, type}]}``, others ``{"detail": msg}``."""
    if isinstance(err, Unprocessable):
        detail: Any = err.details
    elif isinstance(err, InvalidRequest) and err.status == 400 and err.is_validation:
        where = ["body", *(err.param.split(".") if err.param else [])]
        if isinstance(err, InvalidHeader):
            where = ["header", (err.param or "").lower()]
        detail = [
            {
                "loc": where,
                "msg": err.message,
                "type": err.code,
            }
        ]
        return ErrorReply(422, {"detail": detail}, {})
    else:
        detail = err.message
    return ErrorReply(err.status, {"detail": detail}, err.headers())


def error_reply(api: str, err: ProxyError) -> ErrorReply:
    """``err`` as its API answers it: System One's shape on ``"systemone"`` routes, OpenAI's
    on every other (the proxy's own meta routes included); the one choice of error shape,
    which the middleware renders into HTTP."""
    return system_one_error(err) if api == "systemone" else openai_error(err)
