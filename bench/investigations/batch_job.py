"""A batch job killed and resumed: `python -m semif_tools batch` over N lines (the labelled
requests of tests/data, cycled, ids job-0000...), SIGKILLed once K records are written,
then run again with --resume; prints each part's lines per second and checks that the
output holds every id once, all answered.

    .venv/bin/python bench/investigations/batch_job.py [--lines 1000] [--kill-after 300]
        [--concurrency N]

It starts llama-server and the proxy as `make run` does (4 slots). The batch command's
own progress bar and summary go to this script's output.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: the shared helpers

from _machine import describe  # noqa: E402
from _servers import ROOT, llama_server, proxy  # noqa: E402

DATA = sorted((ROOT / "tests" / "data").glob("*.jsonl"))


def job_lines(n: int) -> list[str]:
    """``n`` requests: tests/data's System One bodies (without their gold), cycled."""
    bodies = []
    for path in DATA:
        for line in path.read_text().splitlines():
            if line.strip():
                body = json.loads(line)
                body.pop("gold", None)
                bodies.append(body)
    return [json.dumps({"id": f"job-{i:04d}", **bodies[i % len(bodies)]}) for i in range(n)]


def records(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a torn last line, which --resume drops
    return out


def run(
    url: str, src: Path, dst: Path, extra: list[str], kill_after: int | None
) -> tuple[float, int | None]:
    """One run of the batch command; with ``kill_after``, SIGKILL it once that many
    records are in ``dst``. Seconds taken and the exit code (None when killed)."""
    cmd = [sys.executable, "-m", "semif_tools", "batch", str(src), str(dst), "--url", url, *extra]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT)
    if kill_after is None:
        proc.wait()
        return time.monotonic() - started, proc.returncode
    while proc.poll() is None:
        if dst.exists() and dst.read_bytes().count(b"\n") >= kill_after:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return time.monotonic() - started, None
        time.sleep(0.05)
    return time.monotonic() - started, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--kill-after", type=int, default=300)
    parser.add_argument("--concurrency", type=int, help="default: the server's slots")
    args = parser.parse_args()
    extra = [] if args.concurrency is None else ["--concurrency", str(args.concurrency)]
    with tempfile.TemporaryDirectory() as tmp, llama_server() as upstream, proxy(upstream) as url:
        src, dst = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
        src.write_text("\n".join(job_lines(args.lines)) + "\n")
        first_s, code = run(url, src, dst, extra, args.kill_after)
        assert code is None, f"the job ended (exit {code}) before {args.kill_after} records"
        before = len(records(dst))
        second_s, code = run(url, src, dst, [*extra, "--resume"], None)
        done = records(dst)
    ids = [r["id"] for r in done]
    latest = {r["id"]: r for r in done}
    answered = sum(1 for r in latest.values() if "answer" in r)
    print(describe())
    print(
        f"{args.lines} lines; killed with SIGKILL after {before} records in {first_s:.1f} s "
        f"({before / first_s:.2f} lines/s); resumed: {len(done) - before} records in "
        f"{second_s:.1f} s ({(len(done) - before) / second_s:.2f} lines/s), exit {code}"
    )
    print(
        f"output: {len(done)} records, {len(set(ids))} distinct ids, {answered} answered; "
        f"ids written twice: {len(ids) - len(set(ids))}"
    )
    if code != 0 or len(latest) != args.lines or answered != args.lines:
        sys.exit("the resumed job did not leave every line answered once")


if __name__ == "__main__":
    main()
