"""The outcome loop on what SageMaker's Data Capture writes, on the real proxy and
llama-server: a labelled set served through ``/invocations`` with decision records in the
answers (``--decision-records answer``), some with an ``InferenceId`` AWS accepts but a
decision id cannot hold as it is, some without one, one sent twice (a client's retry), a
jsonlines payload and a streamed chat decision; each answer written as Data Capture
writes it (output only; the stream BASE64) into the dated folders ``aws s3 sync`` leaves;
records recovered with ``records-from-capture``; outcomes keyed by decision id, by the
capture's ``inferenceId`` and by its ``eventId``, in CSV as AWS documents ground truth;
``calibrate --records --outcomes`` and ``drift`` give the same profile and the same table
whichever key the labels used."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import orjson
import pytest

from proxy.records import SAGEMAKER_INFERENCE_ID, escape_id
from scripts.stack import stop
from semif_tools.__main__ import main as tools_main
from semif_tools.calibrate.cli import main as calibrate
from semif_tools.calibrate.dataset import parse_item
from semif_tools.outcomes import write_outcomes
from tests.conftest import launch_proxy

DATA = Path(__file__).resolve().parents[1] / "data"
PER_SET = 14  # as test_records_loop: enough for the three-way split of each question type
CHAT = {
    "messages": [{"role": "user", "content": "Where is my parcel? It was due on Monday."}],
    "semif": {"options": ["billing", "shipping, returns"]},
    "stream": True,
}


def _capture_line(event: str, response: httpx.Response, inference_id: str | None) -> bytes:
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


@pytest.fixture(scope="module")
def captured(llama, logs_dir, tmp_path_factory):
    """The capture folder and, for each labelled decision, its three keys and its label."""
    out = tmp_path_factory.mktemp("capture")
    items = []
    for name in ("tickets.jsonl", "sentiment.jsonl", "yesno.jsonl"):
        lines = (DATA / name).read_text(encoding="utf-8").splitlines()[:PER_SET]
        items += [json.loads(line) for line in lines]

    def gold(n: int, item: dict) -> str:  # the option name, as calibrate writes outcomes
        parsed = parse_item(item, f"item {n}")
        return parsed.names[parsed.gold]

    batch, singles = items[-2:], items[:-2]
    proc, url, log = launch_proxy(logs_dir, llama.url, "--decision-records", "answer")
    lines: list[bytes] = []
    labels: list[tuple[str, str, str, str]] = []  # decision id, inferenceId key, eventId key
    try:
        with httpx.Client(base_url=url, timeout=600) as client:

            def invoke(body, inference_id: str | None, **kw) -> httpx.Response:
                headers = kw.pop("headers", {})
                if inference_id is not None:
                    headers[SAGEMAKER_INFERENCE_ID] = inference_id
                response = client.post("/invocations", headers=headers, **kw, json=body)
                assert response.status_code == 200, response.text
                event = f"ev-{len(lines)}"
                lines.append(_capture_line(event, response, inference_id))
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
                None,
                "batch 1",
                content=payload,
                headers={"Content-Type": "application/jsonlines"},
            )
            for n, item in enumerate(batch):
                key = f"{escape_id('batch 1')}/{n}"
                labels.append((key, f"batch 1/{n}", f"{event}/{n}", gold(99 + n, item)))
            invoke(CHAT, "chat 1")  # streamed: its record rides in the event stream
    finally:
        stop(proc)
        log.close()
    folder = out / "capture" / "2026" / "12" / "07" / "10"  # as aws s3 sync leaves it
    folder.mkdir(parents=True)
    half = len(lines) // 2
    (folder / "a.jsonl").write_bytes(b"\n".join(lines[:half]) + b"\n")
    (folder / "b.jsonl").write_bytes(b"\n".join(lines[half:]) + b"\n")
    return out, labels


@pytest.fixture(scope="module")
def records(captured):
    out, _ = captured
    path = out / "records.jsonl"
    assert tools_main(["records-from-capture", str(out / "capture"), "--out", str(path)]) in (
        0,
        None,
    )
    return path


def test_every_decision_is_recovered_from_the_capture_the_retry_once(captured, records):
    _, labels = captured
    ids = [json.loads(line)["decision_id"] for line in records.read_text().splitlines()]
    # one record per line read (the retry's two included), and the streamed decision's
    assert set(ids) == {d for d, *_ in labels} | {escape_id("chat 1")}
    assert len(ids) == len(labels) + 2
    assert "case 0%2Fa" in ids  # the InferenceId as given, escaped where it names a decision


@pytest.mark.parametrize("key", [1, 2], ids=["inferenceId", "eventId"])
def test_outcomes_keyed_the_aws_way_give_the_profile_and_drift_of_decision_ids(
    captured, records, key, capfd
):
    out, labels = captured
    results = {}
    for how, index in (("decision_id", 0), ("aws", key)):
        outcomes = out / f"outcomes-{how}-{key}.jsonl"
        write_outcomes(outcomes, [(row[index], row[3]) for row in labels])
        assert (
            orjson.loads(outcomes.read_bytes().splitlines()[0])["groundTruthData"]["encoding"]
            == "CSV"
        )
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
