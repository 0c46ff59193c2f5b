"""Decision records: one JSON line per decision, for audits and for fitting and checking
calibration from production outcomes (docs/records.md).

Every decision (each chat decision, each question of a System One or Decisions request,
each rerank document read pointwise, each ``/invocations`` jsonlines line's) gets a
decision id that its answer carries, and, when ``--decision-records`` asks for it, a
record ``semif.decision/1`` (``records_of``, a pure function of the parsed request, its
outcomes and the request's context).

Ids: the request id is SageMaker's inference id (``X-Amzn-SageMaker-Inference-Id``) when
AWS would accept it as an ``InferenceId`` (1 to 64 printable ASCII characters, the first not
a space), else the client's ``X-Request-Id`` when it is 1 to 128 characters of
``[A-Za-z0-9._:-]``, else a new ``uuid4().hex``; a header refused is counted in
``semif_request_ids_replaced_total``. Answers send the id back in ``X-Request-Id``. A
decision id starts with the request id escaped (``escape_id``: ``%`` and ``/`` percent-
encoded, so that the first ``/`` of a decision id always ends its request part). A request
that holds one decision: the decision id is that alone; several: ``<escaped request
id>/<question id>``. A jsonlines line ``n`` (from 0): ``<escaped request id>/<n>``, and
``/<question id>`` after it when the line holds several.

Where records go (``proxy/record_sink.py``): a bounded queue (``--decision-records-buffer``) and
one writer thread per process, so that a stalled stdout or a slow disk never blocks the
event loop or fails a decision. When the queue is full a record is dropped, counted in
``semif_decision_records_dropped_total`` and logged at most once a minute; records
handed to the sink are counted in ``semif_decision_records_written_total``. One writer
for the whole proxy, so records of several kilobytes never interleave on one stream.
"""

from __future__ import annotations

import array
import hashlib
import hmac
import logging
import re
import secrets
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .config import Settings
from .deadlines import Deadline
from .decision.outcome import Outcome
from .decision.prompt import PROMPT_FORMAT_VERSIONS
from .decision.readout import choice_confidence, score_confidence
from .facts import Facts
from .metrics import Metrics
from .protocol.records import RECORD, DecisionInput, DecisionRecord, RecordedQuestion
from .record_sink import STDOUT, RecordWriter, sink_writer
from .service import Answered, Asked

__all__ = [
    "RECORD",
    "OFF",
    "STDOUT",
    "ANSWER",
    "SAGEMAKER_INFERENCE_ID",
    "Context",
    "Decided",
    "Recorder",
    "request_id",
    "escape_id",
    "decision_ids",
    "prompt_hash",
    "records_of",
    "record_key",
    "open_recorder",
]

OFF, ANSWER = "off", "answer"  # and STDOUT; anything else names a file
# InvokeEndpoint's InferenceId, should SageMaker pass it on to the container
SAGEMAKER_INFERENCE_ID = "X-Amzn-SageMaker-Inference-Id"
# what AWS accepts as an InferenceId (the API's pattern \A\S[\p{Print}]*\z, 1 to 64 long):
# printable ASCII, the first character not a space
_INFERENCE_ID = re.compile(r"[!-~][ -~]{0,63}")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# each header a request id may come from, first match wins: (header, rule, metric label)
_ID_HEADERS = (
    (SAGEMAKER_INFERENCE_ID, _INFERENCE_ID, "inference_id"),
    ("X-Request-Id", _REQUEST_ID, "request_id"),
)
_MIN_KEY = 16  # bytes a key file must hold
log = logging.getLogger("proxy.records")


# -- ids ----------------------------------------------------------------------------


def request_id(headers: Mapping[str, str], metrics: Metrics | None = None) -> str:
    """The request's id: SageMaker's inference id as given when AWS accepts it (1 to 64
    printable ASCII characters, the first not a space), else the client's ``X-Request-Id``
    when it is 1 to 128 characters of ``[A-Za-z0-9._:-]``, else a new ``uuid4().hex``. Each
    header present but refused is counted in ``metrics`` (``request_ids_replaced``, by
    header)."""
    for name, rule, label in _ID_HEADERS:
        given = headers.get(name)
        if given is None:
            continue
        if rule.fullmatch(given):
            return given
        log.debug("request id: the %s header is not a valid id; replaced", name)
        if metrics is not None:
            metrics.request_ids_replaced.labels(label).inc()
    return uuid.uuid4().hex


def escape_id(request: str) -> str:
    """A request id as it starts a decision id: ``%`` as ``%25`` and ``/`` as ``%2F``
    (percent-encoding, RFC 3986), so that a decision id's first ``/`` ends its request
    part; every other character as it is. Ids of ``[A-Za-z0-9._:-]`` are unchanged."""
    return request.replace("%", "%25").replace("/", "%2F")


def decision_ids(request: str, qids: Sequence[str], line: int | None = None) -> dict[str, str]:
    """Each question's decision id: ``base`` alone for a single decision, else
    ``base/<question id>``, where ``base`` is the request id escaped (``escape_id``), and
    ``/<line>`` after it for jsonlines line ``line`` (from 0)."""
    base = escape_id(request) if line is None else f"{escape_id(request)}/{line}"
    if len(qids) == 1:
        return {qids[0]: base}
    return {qid: f"{base}/{qid}" for qid in qids}


@dataclass(frozen=True)
class Context:
    """What a record needs from the request beside its outcomes. ``arrived``:
    ``time.perf_counter()`` at arrival; ``line``: the jsonlines line (from 0);
    ``state``: the state text of System One, Decisions and rerank (an input);
    ``question_ids``: whether the API names its questions (chat and listwise rerank
    hold one unnamed decision: ``question_id`` null). Beside them, what the routes hand
    to the service with the request: ``deadline``, the one its decision runs under
    (proxy/deadlines.py; None: the server's), and ``facts``, where what the request
    learns as it is served is counted (proxy/facts.py; the middleware's)."""

    request_id: str
    api: str  # "chat" | "system_one" | "decisions" | "rerank" | "invocations"
    arrived: float
    line: int | None = None
    state: str | None = None
    question_ids: bool = True
    deadline: Deadline | None = None
    facts: Facts = field(default_factory=Facts)


# -- the record ---------------------------------------------------------------------


def prompt_hash(key: bytes, ids: Sequence[int]) -> str | None:
    """``hmac-sha256:`` and HMAC-SHA256(key, the token ids as 4-byte little-endian
    unsigned integers, one after another) in hex; None without ids (a read through
    the chat endpoint)."""
    if not ids:
        return None
    packed = array.array("I", ids)
    if packed.itemsize != 4:  # pragma: no cover - C's unsigned int is 4 bytes where we run
        packed = array.array("L", ids)
    if sys.byteorder == "big":  # pragma: no cover
        packed.byteswap()
    return "hmac-sha256:" + hmac.new(key, packed.tobytes(), hashlib.sha256).hexdigest()


def _utc(seconds: float) -> str:
    """``2026-12-03T10:11:12.345Z``: UTC to the millisecond."""
    at = datetime.fromtimestamp(seconds, UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def _confidence(kind: str, probabilities: Sequence[float]) -> float:
    """Score questions: ``score_confidence``; choice and yes/no: ``choice_confidence``
    (for yes/no, 2 max(p) - 1)."""
    if kind == "score":
        return score_confidence(probabilities)
    return choice_confidence(probabilities)


def records_of(
    context: Context,
    asked: Asked,
    outcomes: Mapping[str, Outcome],
    raw: Mapping[str, Sequence[float]],
    ids: Mapping[str, str],
    *,
    threshold: float | None,
    llama_build: str | None,
    answered_at: float,
    finished: float,
    key: bytes,
    inputs: bool = False,
) -> dict[str, DecisionRecord]:
    """Each decision's record (``protocol/records.py``'s model, built from values that are
    the proxy's own: ``model_construct``, nothing validated again), by question id.
    ``raw``: the probabilities after debiasing, before calibration; ``threshold``: the
    applied profile's (None: none); ``answered_at``: the answer's time (epoch seconds);
    ``finished``: its ``time.perf_counter()``, for the latency since ``context.arrived``."""
    at = _utc(answered_at)
    latency_ms = (finished - context.arrived) * 1000.0
    out: dict[str, DecisionRecord] = {}
    for qid, outcome in outcomes.items():
        decision = outcome.decision
        question = decision.question
        calibration = outcome.calibration
        fields: dict[str, Any] = {
            "record": RECORD,
            "decision_id": ids[qid],
            "request_id": context.request_id,
            "question_id": qid if context.question_ids else None,
            "time": at,
            "api": context.api,
            "model": outcome.model,
            "llama_build": llama_build or None,
            "prompt_format_version": PROMPT_FORMAT_VERSIONS[outcome.layout],
            "layout": outcome.layout,
            "read_scheme": outcome.read_scheme,
            "prompt_tokens": outcome.prompt_tokens,
            "prompt_hash": prompt_hash(key, outcome.prompt_ids),
            "question_type": question.kind,
            "options": list(question.names),
            "raw_probabilities": list(raw[qid]),
            "probabilities": list(decision.probabilities),
            "choice": decision.best_name,
            "confidence": _confidence(question.kind, decision.probabilities),
            "label_mass": decision.label_mass,
            "profile": calibration["profile"] if calibration else None,
            "calibration_method": calibration["method"] if calibration else None,
            "threshold": threshold if calibration else None,
            "route": outcome.route,
            "route_reason": outcome.route_reason,
            "debias": outcome.debias,
            "repeatable": outcome.repeatable,
            "latency_ms": latency_ms,
        }
        if inputs:
            fields["input"] = _input(context, asked, qid)
        out[qid] = DecisionRecord.model_construct(**fields)
    return out


def _input(context: Context, asked: Asked, qid: str) -> DecisionInput:
    """The decision's input, as the operator asked (--decision-records-inputs): the
    conversation (chat), or the state and the question as the prompt showed it."""
    if context.state is None:
        return DecisionInput.model_construct(messages=list(asked.messages))
    question = asked.questions[qid]
    shown = RecordedQuestion.model_construct(
        type=question.kind, instructions=question.instructions, options=list(question.shown)
    )
    return DecisionInput.model_construct(state=context.state, question=shown)


# -- the recorder -------------------------------------------------------------------


@dataclass(frozen=True)
class Decided:
    """What an answer carries: each question's decision id and, with
    ``--decision-records answer``, its record as the answer's JSON carries it
    (``DecisionRecord.dump``; else None)."""

    ids: dict[str, str]
    records: dict[str, dict[str, Any]] | None = None


def record_key(settings: Settings) -> bytes:
    """The HMAC key of the prompt hashes: the key file's bytes (surrounding whitespace
    stripped, at least 16 bytes), else a random key for this start, said once."""
    path = settings.decision_records_key_file
    if path:
        key = Path(path).read_bytes().strip()
        if len(key) < _MIN_KEY:
            raise ValueError(
                f"the decision records' key file {path} holds {len(key)} bytes; "
                f"it needs at least {_MIN_KEY}"
            )
        return key
    log.info(
        "decision records: no key file (--decision-records-key-file): prompt hashes use a "
        "random key and compare within this run only"
    )
    return secrets.token_bytes(32)


class Recorder:
    """Decision ids for every answer and, as ``--decision-records`` says, records: none
    (``off``), in the answer (``answer``), or queued for ``writer``."""

    def __init__(
        self,
        mode: str,
        *,
        key: bytes = b"",
        inputs: bool = False,
        writer: RecordWriter | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.mode = mode
        self._key = key
        self._inputs = inputs
        self._writer = writer
        self._metrics = metrics

    def decided(
        self, context: Context, asked: Asked, answered: Answered, llama_build: str | None
    ) -> Decided:
        """The decision ids of ``answered``; its records made and sent where they go."""
        ids = decision_ids(context.request_id, list(answered), context.line)
        if self.mode == OFF:
            return Decided(ids)
        profile = answered.profile
        try:
            made = records_of(
                context,
                asked,
                answered,
                answered.raw,
                ids,
                threshold=profile.threshold.threshold if profile is not None else None,
                llama_build=llama_build,
                answered_at=time.time(),
                finished=time.perf_counter(),
                key=self._key,
                inputs=self._inputs,
            )
            records = {qid: record.dump() for qid, record in made.items()}
        except Exception:  # noqa: BLE001 - a record's bug must not fail the decision
            log.exception("decision records of request %s could not be made", context.request_id)
            if self._metrics is not None:
                self._metrics.records_dropped.inc(len(ids))
            return Decided(ids)
        if self.mode == ANSWER:
            if self._metrics is not None:
                self._metrics.records_written.inc(len(records))
            return Decided(ids, records)
        if self._writer is not None:
            for record in records.values():
                self._writer.put(record)
        return Decided(ids)

    def close(self, timeout_s: float = 5.0) -> None:
        if self._writer is not None:
            self._writer.close(timeout_s)


def open_recorder(
    settings: Settings,
    metrics: Metrics | None,
    *,
    write_to: Callable[[bytes], None] | None = None,
    key: bytes | None = None,
) -> Recorder:
    """The recorder ``settings`` ask for. ``write_to``: where the lines go instead of the
    sink ``settings`` name (tests: a sink that stalls); ``key``: the prompt hashes' key
    instead of the one ``settings`` give."""
    mode = settings.decision_records
    if mode == OFF:
        return Recorder(OFF)
    secret = key if key is not None else record_key(settings)
    writer = None
    if mode != ANSWER:
        write, on_close = (write_to, None) if write_to is not None else sink_writer(mode)
        writer = RecordWriter(write, settings.decision_records_buffer, metrics, on_close=on_close)
    return Recorder(
        mode, key=secret, inputs=settings.decision_records_inputs, writer=writer, metrics=metrics
    )
