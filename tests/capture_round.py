"""The outcome loop on what SageMaker's Data Capture writes, against any proxy serving
``/invocations`` with decision records in its answers (``PROXY_DECISION_RECORDS=answer``):
the proxy ``make test`` starts (tests/integration/test_capture_loop.py) and the single
image run as SageMaker runs it (tests/containers/test_single.py).

A labelled set is served, some with an ``InferenceId`` AWS accepts but a decision id cannot
hold as it is, some without one, one sent twice (a client's retry), a jsonlines payload and
a streamed chat decision; each answer is written as Data Capture writes it (output only; the
stream BASE64) into the dated folders ``aws s3 sync`` leaves; records are recovered with
``records-from-capture``; outcomes keyed by decision id, by the capture's ``inferenceId``
and by its ``eventId``, in CSV as AWS documents ground truth, must give the same profile and
the same drift table whichever key the labels used."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import orjson

from proxy.recorder import SAGEMAKER_INFERENCE_ID, escape_id
from semif_tools.__main__ import main as tools_main
from semif_tools.calibrate.cli import main as calibrate
from semif_tools.calibrate.dataset import parse_item
from semif_tools.outcomes import write_outcomes

DATA = Path(__file__).resolve().parent / "data"
PER_SET = 14  # as test_records_loop: enough for the three-way split of each question type
CHAT = {
    "messages": [{"role": "user", "content": "Where is my parcel? It was due on Monday."}],
    "semif": {"options": ["billing", "shipping, returns"]},
    "stream": True,
}
STREAMED_ID = "chat 1"

# (decision id, inferenceId key, eventId key, label) for each labelled decision
Labels = list[tuple[str, str, str, str]]


def capture_line(event: str, response: httpx.Response, inference_id: str | None) -> bytes:
    """One Data Capture line of ``response``, output only, in AWS's documented shape: a
    JSON answer as text, any other type (the event stream) BASE64."""
    kind = response.headers["Content-Type"].partition(";")[0]
    if kind == "application/json":
        output = {"data": response.text, "encoding": "JSON"}
    else:
        output = {"data": base64.b64encode(response.content).decode(), "encoding": "BASE64"}
    meta = {"eventId": event, "inferenceTime": "2026-12-07T10:11:12Z"}
    if inference_id is not None:
        meta["inferenceId"] = inference_id
    return orjson.dumps(
        {
            "captureData": {
                "endpointOutput": {"observedContentType": kind, "mode": "OUTPUT", **output}
            },
            "eventMetadata": meta,
            "eventVersion": "0",
        }
    )


def serve_and_capture(url: str, out: Path) -> Labels:
    """Serve the labelled set through ``url``'s /invocations and write its capture under
    ``out/capture``; returns each labelled decision's keys and label."""
    items = []
    for name in ("tickets.jsonl", "sentiment.jsonl", "yesno.jsonl"):
        lines = (DATA / name).read_text(encoding="utf-8").splitlines()[:PER_SET]
        items += [json.loads(line) for line in lines]

    def gold(n: int, item: dict) -> str:  # the option name, as calibrate writes outcomes
        parsed = parse_item(item, f"item {n}")
        return parsed.names[parsed.gold]

    batch, singles = items[-2:], items[:-2]
    captured: list[bytes] = []
    labels: Labels = []
    with httpx.Client(base_url=url, timeout=600) as client:

        def invoke(body, inference_id: str | None, **kw) -> tuple[httpx.Response, str]:
            headers = kw.pop("headers", {})
            if inference_id is not None:
                headers[SAGEMAKER_INFERENCE_ID] = inference_id
            response = client.post("/invocations", headers=headers, **kw, json=body)
            assert response.status_code == 200, response.text
            event = f"ev-{len(captured)}"
            captured.append(capture_line(event, response, inference_id))
            return response, event

        for n, item in enumerate(singles):
            body = {k: item[k] for k in ("state", "questions")}
            # every other one with an InferenceId holding a space and a "/", as AWS allows
            inference_id = f"case {n}/a" if n % 2 == 0 else None
            response, event = invoke(body, inference_id)
            if n == 0:  # the client's retry, same InferenceId: the last one is kept
                response, event = invoke(body, inference_id)
            decision = escape_id(response.headers["X-Request-Id"])
            labels.append((decision, inference_id or decision, event, gold(n, item)))
        payload = b"".join(
            orjson.dumps({k: item[k] for k in ("state", "questions")}) + b"\n" for item in batch
        )
        response, event = invoke(
            None, "batch 1", content=payload, headers={"Content-Type": "application/jsonlines"}
        )
        for n, item in enumerate(batch):
            key = f"{escape_id('batch 1')}/{n}"
            labels.append((key, f"batch 1/{n}", f"{event}/{n}", gold(99 + n, item)))
        invoke(CHAT, STREAMED_ID)  # streamed: its record rides in the event stream
    folder = out / "capture" / "2026" / "12" / "07" / "10"  # as aws s3 sync leaves it
    folder.mkdir(parents=True)
    half = len(captured) // 2
    (folder / "a.jsonl").write_bytes(b"\n".join(captured[:half]) + b"\n")
    (folder / "b.jsonl").write_bytes(b"\n".join(captured[half:]) + b"\n")
    return labels


def records_from_capture(out: Path) -> Path:
    path = out / "records.jsonl"
    rc = tools_main(["records-from-capture", str(out / "capture"), "--out", str(path)])
    assert rc in (0, None)
    return path


def assert_every_decision_recovered(labels: Labels, records: Path) -> None:
    ids = [json.loads(line)["decision_id"] for line in records.read_text().splitlines()]
    # one record per line read (the retry's two included), and the streamed decision's
    assert set(ids) == {d for d, *_ in labels} | {escape_id(STREAMED_ID)}
    assert len(ids) == len(labels) + 2
    assert "case 0%2Fa" in ids  # the InferenceId as given, escaped where it names a decision


def assert_keyed_alike(out: Path, records: Path, labels: Labels, key: int, capfd) -> None:
    """Outcomes keyed by column ``key`` of the labels (1: inferenceId, 2: eventId) give the
    profile and the drift table that outcomes keyed by decision id give."""
    results = {}
    for how, index in (("decision_id", 0), ("aws", key)):
        outcomes = out / f"outcomes-{how}-{key}.jsonl"
        write_outcomes(outcomes, [(row[index], row[3]) for row in labels])
        first = orjson.loads(outcomes.read_bytes().splitlines()[0])
        assert first["groundTruthData"]["encoding"] == "CSV"
        name = f"p-{how}-{key}"
        common = ["--records", str(records), "--outcomes", str(outcomes)]
        rc = calibrate([*common, "--profile", name, "--out-dir", str(out), "--seed", "3"])
        assert rc == 0, capfd.readouterr().err
        profile = json.loads((out / f"{name}.json").read_text())
        for field in ("name", "created", "data_sha256"):
            profile.pop(field, None)
        table = out / f"drift-{how}-{key}.json"
        rc = tools_main(
            [
                "drift",
                *common,
                "--profile",  # one profile for both, so that the tables can be compared whole
                str(out / f"p-decision_id-{key}.json"),
                "--out",
                str(out / f"drift-{how}-{key}.html"),
                "--json",
                str(table),
            ]
        )
        assert rc in (0, None)
        results[how] = (profile, json.loads(table.read_text()))
    assert results["aws"][0] == results["decision_id"][0]
    assert results["aws"][1] == results["decision_id"][1]
    assert results["aws"][1]["windows"][0]["labelled"] == len(labels)
