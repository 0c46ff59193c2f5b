"""Where a long decision's time goes: llama-server's prompt evaluation at the prefix
scheme's physical batch (-ub 63) against its default (-ub 512), side by side, and the
255-option question of the exactness test through the proxy.

    .venv/bin/python bench/investigations/long_prompts.py
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _machine import describe  # noqa: E402
from _servers import llama_server, proxy  # noqa: E402  (puts the repository on the path)

import scripts.stack as stack  # noqa: E402


def _flags(ubatch: int) -> list[str]:
    flags = list(stack.LLAMA_FLAGS)
    flags[flags.index("-ub") + 1] = str(ubatch)
    return flags


def batches() -> None:
    """Cold evaluations of 128 to 2,048 tokens, alternating the two servers, best of 2."""
    text = " ".join(f"word{i}" for i in range(2000))
    original = list(stack.LLAMA_FLAGS)
    with contextlib.ExitStack() as servers:
        urls = {}
        for ubatch in (63, 512):
            stack.LLAMA_FLAGS[:] = _flags(ubatch)
            urls[ubatch] = servers.enter_context(llama_server())
        stack.LLAMA_FLAGS[:] = original
        tokens = httpx.post(urls[63] + "/tokenize", json={"content": text}).json()["tokens"]
        print("tokens  -ub 63 ms  -ub 512 ms  ratio")
        for n in (128, 512, 1024, 2048):
            best = {63: float("inf"), 512: float("inf")}
            for _ in range(2):
                for ubatch, url in urls.items():
                    answer = httpx.post(
                        url + "/completion",
                        timeout=600,
                        json={
                            "prompt": tokens[:n],
                            "n_predict": 0,
                            "cache_prompt": False,
                            "id_slot": 0,
                        },
                    ).json()
                    best[ubatch] = min(best[ubatch], answer["timings"]["prompt_ms"])
            print(f"{n:6}  {best[63]:9.0f}  {best[512]:10.0f}  {best[63] / best[512]:5.2f}")


def many_options() -> None:
    """The 255-option question, new, replayed, and new again with the same options."""
    options = [f"team {i:03d}" for i in range(255)]
    with llama_server() as llama_url, proxy(llama_url) as url:
        for what, tag in (("new", "a"), ("replay", "a"), ("new again", "b")):
            body = {
                "model": "m",
                "semif": {"options": options},
                "messages": [
                    {
                        "role": "user",
                        "content": f"Route this ticket {tag}: my order arrived broken.",
                    }
                ],
            }
            started = time.perf_counter()
            resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
            took = time.perf_counter() - started
            answer = resp.json()
            print(
                f"255 options, {what:9}: {resp.status_code} in {took:5.1f} s, "
                f"{answer['semif']['reads']} reads, {answer['usage']['prompt_tokens']} prompt "
                f"tokens in all; {resp.headers.get('Server-Timing')}"
            )


if __name__ == "__main__":
    machine = describe()
    print(machine["date"], machine["cpu"], machine["cpu_level"], machine["llama_build"])
    batches()
    many_options()
