"""``python -m semif_tools batch`` against the real proxy: killed mid-job, resumed, every line
answered exactly once; a bad line is an error record, never the end of the job."""

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"
ROOT = Path(__file__).resolve().parents[2]


def _job(tmp_path: Path) -> Path:
    lines = (DATA / "yesno.jsonl").read_text().splitlines()[:24]
    rows = [{k: v for k, v in json.loads(x).items() if k != "gold"} for x in lines]
    rows[5]["id"] = "named"
    rows.insert(
        7,
        {
            "messages": [{"role": "user", "content": "Ticket: refund please"}],
            "semif": {"options": ["billing", "shipping"]},
        },
    )
    text = "\n".join(json.dumps(r) for r in rows) + "\n{broken\n"
    src = tmp_path / "in.jsonl"
    src.write_text(text)
    return src


def _batch(src, out, url, *extra):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "semif_tools",
            "batch",
            str(src),
            str(out),
            "--url",
            url,
            "--concurrency",
            "2",
            *extra,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_killed_job_resumes_without_repeating_a_line(proxy_url, tmp_path):
    src, out = _job(tmp_path), tmp_path / "out.jsonl"
    first = _batch(src, out, proxy_url)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not out.exists() or out.read_text().count("\n") < 6):
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=10)  # reaped, its pipes closed
    with out.open("a") as f:
        f.write('{"id": 99, "sta')  # as if the kill had torn a line
    answered_before = out.read_text().count("\n")
    assert 6 <= answered_before < 26
    second = _batch(src, out, proxy_url, "--resume")
    stdout, stderr = second.communicate(timeout=300)
    assert second.returncode == 1, stderr  # the broken line is an error: not every line ok
    records = [json.loads(x) for x in out.read_text().splitlines()]
    ids = Counter(json.dumps(r["id"]) for r in records)
    assert len(records) == 26 and max(ids.values()) == 1  # each line once, none repeated
    assert '"named"' in ids and "99" not in ids
    broken = next(r for r in records if r["id"] == 26)
    assert broken["status"] is None and "not JSON" in broken["error"]["message"]
    chat = next(r for r in records if r["id"] == 8)
    assert chat["status"] == 200 and chat["answer"]["semif"]["choice"] in ("billing", "shipping")
    assert all(r["status"] == 200 for r in records if r["id"] != 26)
    assert f"{answered_before} already done (--resume)" in stdout
    assert "batch: 100%" in stderr  # the bar: stderr is a pipe, so its final state once
    assert "label mass p5 / p50 / p95" in stdout and f"ok {25 - answered_before}" in stdout


def test_an_existing_output_is_not_overwritten(proxy_url, tmp_path):
    src, out = _job(tmp_path), tmp_path / "out.jsonl"
    out.write_text('{"id": 1}\n')
    done = _batch(src, out, proxy_url)
    _, stderr = done.communicate(timeout=60)
    assert done.returncode == 2 and "--resume" in stderr and out.read_text() == '{"id": 1}\n'
