"""Settings: one frozen object, read once at start-up from flags and environment.

Every default lives in ``Settings``; ``load_settings`` is the only code that
reads the environment. Each flag has an environment variable of the same
meaning (named in ``--help``); a flag given on the command line wins.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields

__all__ = ["Settings", "build_parser", "environment_variable", "load_settings"]

log = logging.getLogger("proxy")


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8080
    upstream_url: str = "http://127.0.0.1:8081"
    upstream_api_key: str | None = None
    api_key: str | None = None
    admin_api_key: str | None = None  # unlocks the llama-server routes not on the client list
    connect_timeout_s: float = 3.0
    request_timeout_s: float = 55.0  # under SageMaker's 60 s invocation limit
    max_body_bytes: int = 6 * 1024 * 1024  # SageMaker's real-time payload limit
    relay_max_tokens: int = 2048  # a relayed generation's length when it names none; 0: no cap
    retry_after_s: int = 2
    n_probs: int = 16  # first read (at least 4 per label); widened only when a label is missing
    question_fanout: int = 1  # questions of one request read at once after the first
    max_active_decisions: int = 16
    max_queued_decisions: int = 64
    decision_deadline_s: float = 50.0  # from arrival; under SageMaker's 60 s
    max_decision_deadline_s: float = 3600.0  # what a request may ask: Batch Transform's most
    invocations_timeout_s: float = 600.0  # a jsonlines payload in all: Batch Transform's default
    max_state_chars: int = 400_000
    rerank_max_documents: int = 256
    rerank_max_document_chars: int = 20_000
    calibration_dir: str = "config/calibration"
    calibration_profile: str = ""  # applied when a request names none; "" for no default
    max_connections: int = 0  # 0: llama-server's slots + 2 (proxy/upstream.py Lanes)
    shutdown_timeout_s: float = 25.0  # SIGKILL follows SIGTERM after 30 s on SageMaker
    model_aliases: str = ""  # more names for the served model, comma-separated (proxy/names.py)
    default_model: str = ""  # a llama-server router's model for requests naming none
    upstream_ubatch: int = 0  # llama-server's -ub when 2 to 63: the prefix read (proxy/kv.py)
    decision_records: str = "off"  # off | stdout | answer | a file path (proxy/recorder.py)
    decision_records_inputs: bool = False  # the conversation or state in each record
    decision_records_key_file: str = ""  # the prompt hashes' HMAC key ("": random per start)
    decision_records_buffer: int = 10_000  # records queued for the sink; dropped beyond
    check_verdicts: str = "~/.cache/semif-sidecar/self-check.json"  # off: in memory only

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port {self.port} is not a TCP port")
        if self.max_active_decisions < 1 or self.max_queued_decisions < 0:
            raise ValueError("max_active_decisions must be >= 1 and max_queued_decisions >= 0")
        if self.max_state_chars < 1:
            raise ValueError("max_state_chars must be at least 1")
        if self.rerank_max_documents < 1 or self.rerank_max_document_chars < 1:
            raise ValueError("the rerank limits must be at least 1")
        for name in (
            "connect_timeout_s",
            "request_timeout_s",
            "shutdown_timeout_s",
            "decision_deadline_s",
            "max_decision_deadline_s",
            "invocations_timeout_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if self.decision_deadline_s > self.max_decision_deadline_s:
            raise ValueError("decision_deadline_s must not exceed max_decision_deadline_s")
        if self.max_connections and self.max_connections < 3:
            raise ValueError("max_connections must be 0 (llama-server's slots + 2) or at least 3")
        if self.relay_max_tokens < 0:
            raise ValueError("relay_max_tokens must be 0 (no cap) or more")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be at least 1024")
        if self.n_probs < 1:
            raise ValueError("n_probs must be at least 1")
        if self.upstream_ubatch < 0:
            raise ValueError("upstream_ubatch must be 0 (unknown) or llama-server's -ub")
        if self.question_fanout < 0:
            raise ValueError("question_fanout must be 0 (one per llama-server slot) or more")
        mode = self.decision_records
        if mode not in ("off", "stdout", "answer") and "/" not in mode:
            # "Off", "none", "false", "stdout " ... would otherwise name a file quietly
            raise ValueError(
                "decision_records must be off, stdout, answer or a file path with a '/' "
                f"(e.g. ./records.jsonl), not {mode!r}"
            )
        if self.decision_records_buffer < 1:
            raise ValueError("decision_records_buffer must be at least 1")


# flag -> (environment variable, help)
_OPTIONS: dict[str, tuple[str, str]] = {
    "host": ("PROXY_HOST", "address to listen on"),
    "port": ("PROXY_PORT", "port to listen on"),
    "upstream_url": ("UPSTREAM_URL", "base URL of llama-server"),
    "upstream_api_key": ("UPSTREAM_API_KEY", "bearer key llama-server expects (never echoed)"),
    "api_key": ("PROXY_API_KEY", "require 'Authorization: Bearer <key>' from clients"),
    "admin_api_key": (
        "PROXY_ADMIN_KEY",
        "'X-Admin-Key' that unlocks the llama-server routes a client key may not call "
        "(POST /props, /slots/..., /lora-adapters, router mode's models, any route on "
        "neither list: docs/operations.md); unset: they are refused to everyone",
    ),
    "connect_timeout_s": ("PROXY_CONNECT_TIMEOUT", "seconds to connect to llama-server"),
    "request_timeout_s": ("PROXY_REQUEST_TIMEOUT", "seconds for a whole upstream call (504 after)"),
    "max_body_bytes": ("PROXY_MAX_BODY_BYTES", "largest request body accepted (413 above)"),
    "relay_max_tokens": (
        "PROXY_RELAY_MAX_TOKENS",
        "most tokens a relayed generation may ask for (max_tokens, max_completion_tokens, "
        "max_output_tokens, n_predict): inserted when a request names none, 400 above or for "
        "-1; 0: no cap (llama-server's own default: until the slot's context is full). 2048 "
        "holds a long chat answer and keeps a generation that never stops to minutes of one "
        "slot on a CPU",
    ),
    "retry_after_s": ("PROXY_RETRY_AFTER", "Retry-After seconds sent with 503"),
    "n_probs": ("PROXY_N_PROBS", "top log-probabilities asked for on the first read"),
    "question_fanout": (
        "PROXY_QUESTION_FANOUT",
        "questions of one request read in parallel after the first; 1 reads the shared state "
        "once (best on CPU), 0 uses every llama-server slot: with the segment scheme (a GPU's) "
        "each computes the state once, with the prefix scheme they wait for the slot reading it",
    ),
    "max_active_decisions": ("PROXY_MAX_ACTIVE", "decision requests served at once"),
    "max_queued_decisions": (
        "PROXY_MAX_QUEUED",
        "decision requests waiting for a turn (429 with Retry-After beyond)",
    ),
    "decision_deadline_s": (
        "PROXY_DEADLINE",
        "seconds a decision request may take from arrival (504 and cancelled after), unless "
        "it asks for another (X-Semif-Deadline, or semif-deadline= in "
        "X-Amzn-SageMaker-Custom-Attributes; an OpenAI SDK's timeout only shortens it)",
    ),
    "max_decision_deadline_s": (
        "PROXY_MAX_DEADLINE",
        "longest deadline a decision request may ask for; one asked beyond is cut to it. "
        "3600: Batch Transform's longest invocation",
    ),
    "invocations_timeout_s": (
        "PROXY_INVOCATIONS_TIMEOUT",
        "seconds a jsonlines /invocations payload may take in all (set it to the transform "
        "job's InvocationsTimeoutInSeconds); lines not answered by then get 504 records",
    ),
    "max_state_chars": ("PROXY_MAX_STATE_CHARS", "longest System One / Decisions state accepted"),
    "rerank_max_documents": (
        "PROXY_RERANK_MAX_DOCUMENTS",
        "documents one rerank request may rank (listwise: at most 255)",
    ),
    "rerank_max_document_chars": (
        "PROXY_RERANK_MAX_DOCUMENT_CHARS",
        "longest rerank document (and query) accepted",
    ),
    "calibration_dir": ("PROXY_CALIBRATION_DIR", "folder of calibration profiles (NAME.json)"),
    "calibration_profile": (
        "PROXY_CALIBRATION_PROFILE",
        "profile applied when a request names none ('' for none)",
    ),
    "max_connections": (
        "PROXY_MAX_CONNECTIONS",
        "calls in flight to llama-server at once, 2 of them for rendering and tokenising "
        "(0: its slots + 2, within its HTTP threads)",
    ),
    "shutdown_timeout_s": ("PROXY_SHUTDOWN_TIMEOUT", "seconds in-flight requests get on SIGTERM"),
    "model_aliases": (
        "PROXY_MODEL_ALIASES",
        "more names requests may give the served model, "
        "comma-separated; listed in /v1/models beside jev-latest and gpt-6-luna",
    ),
    "default_model": (
        "PROXY_DEFAULT_MODEL",
        "with llama-server in router mode (several "
        "models): the model of requests that name none or a default name "
        "(jev-latest, gpt-6-luna); '' for the first it lists",
    ),
    "upstream_ubatch": (
        "PROXY_UPSTREAM_UBATCH",
        "llama-server's physical batch (-ub) as it "
        "was started; 2 to 63 reads new conversations in one request, reusing "
        "any prefix a slot holds (docs/repeatability.md); 0: unknown, each "
        "shared segment is evaluated from position 0",
    ),
    "decision_records": (
        "PROXY_DECISION_RECORDS",
        "a JSON line per decision (docs/records.md): off; stdout (a cluster's log "
        "pipeline ships it); answer (in the answer: semif.record, x_record; for SageMaker "
        "Data Capture); or a file path with a '/' (./records.jsonl; appended to)",
    ),
    "decision_records_inputs": (
        "PROXY_DECISION_RECORDS_INPUTS",
        "put each decision's input (the conversation, or the state and question) in its "
        "record; off by default: records hold no text of the request",
    ),
    "decision_records_key_file": (
        "PROXY_DECISION_RECORDS_KEY_FILE",
        "file of the secret key (16 bytes or more) of the records' prompt_hash "
        "(HMAC-SHA256 of the prompt's tokens); '' for a random key per start, whose "
        "hashes compare within one run only",
    ),
    "decision_records_buffer": (
        "PROXY_DECISION_RECORDS_BUFFER",
        "records waiting for a slow sink, per process; beyond it a record is dropped, "
        "counted (semif_decision_records_dropped_total) and logged",
    ),
    "check_verdicts": (
        "PROXY_CHECK_VERDICTS",
        "file that keeps the repeatability self-check's verdicts (and the costs its reads "
        "taught) across restarts, keyed by llama-server's build, model and flags, the read "
        "scheme and the CPU (proxy/verdicts.py); a kept verdict makes the proxy ready "
        "without the check's reads; off keeps them in memory only (llama-server's restarts)",
    ),
}

# Settings that were removed: flag -> (environment variable, the one value that asked for
# what the proxy does anyway, what to do instead). Given that value, the proxy says the
# setting is gone and starts; given any other, it stops at start-up with the message, since
# ignoring it would quietly serve less than was asked for.
_REMOVED: dict[str, tuple[str, str, str]] = {
    "workers": (
        "PROXY_WORKERS",
        "1",
        "the proxy is one process; to serve more, run replicas, each beside its own "
        "llama-server, or raise llama-server's parallel slots (-np) "
        "(docs/performance.md#how-to-scale)",
    ),
}


def environment_variable(name: str) -> str:
    """The environment variable of the setting ``name`` (a ``Settings`` field)."""
    return _OPTIONS[name][0]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m proxy",
        description="Decision sidecar for llama-server: OpenAI chat completions with "
        "declared options ('semif') answered as per-option probabilities.",
    )
    defaults = Settings()
    for f in fields(Settings):
        env, text = _OPTIONS[f.name]
        default = getattr(defaults, f.name)
        if isinstance(default, bool):  # --name / --no-name
            parser.add_argument(
                "--" + f.name.replace("_", "-"),
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"{text} [env {env}: true or false] (default: {str(default).lower()})",
            )
            continue
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=_type_of(default, f.type),
            default=None,
            help=f"{text} [env {env}] (default: {default})",
        )
    for name in _REMOVED:
        parser.add_argument("--" + name.replace("_", "-"), dest=name, help=argparse.SUPPRESS)
    return parser


def load_settings(argv: Sequence[str] | None, environ: Mapping[str, str]) -> Settings:
    """Flags first, then environment variables, then the defaults in ``Settings``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for name, (env, harmless, instead) in _REMOVED.items():
        given, source = getattr(args, name), "--" + name.replace("_", "-")
        if given is None and environ.get(env, "") != "":
            given, source = environ[env], env
        if given is None:
            continue
        if given.strip() != harmless:
            parser.error(f"{source} was removed: {instead}")  # exits with status 2
        log.warning("%s was removed and is ignored (remove it): %s", source, instead)
    defaults = Settings()
    values = {}
    for f in fields(Settings):
        value = getattr(args, f.name)
        env = _OPTIONS[f.name][0]
        if value is None and environ.get(env, "") != "":
            value = _type_of(getattr(defaults, f.name), f.type)(environ[env])
        if value is not None:
            values[f.name] = value
    return Settings(**values)


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _boolean(text: str) -> bool:
    """An environment variable's boolean: 1/true/yes/on or 0/false/no/off (any case)."""
    word = text.strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise ValueError(f"{text!r} is not a boolean: use true or false")


def _type_of(default: object, annotation: object) -> Callable[[str], object]:
    if isinstance(default, bool):
        return _boolean
    if isinstance(default, (int, float)):
        return type(default)
    return str
