"""A stand-in for llama-server that misbehaves on demand, served from a thread.

It answers the model, template and tokenizer calls like SmolLM2 would, and
/v1/chat/completions according to ``mode``: "good", "slow", "truncated",
"invalid_json", "error_500" or "loading".
"""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web

from proxy.kv import common_prefix
from tests.conftest import free_port

__all__ = ["StandIn"]

_CONTEXT = "<|im_end|>\n<|im_start|>assistant\n"
_GOOD = {
    "model": "standin",
    "choices": [
        {
            "logprobs": {
                "content": [
                    {
                        "top_logprobs": [
                            {"id": 49 + i, "token": chr(65 + i), "logprob": -0.5 - i}
                            for i in range(26)
                        ]
                    }
                ]
            }
        }
    ],
    "usage": {"prompt_tokens": 30},
}


class StandIn:
    """``tokens=True``: tokenise any other text one token per character and answer
    ``/completion`` with a simulated slot cache (what the proxy's repeatable reads
    use; without it the proxy reads through the chat endpoint, as for images)."""

    def __init__(self, tokens: bool = False) -> None:
        self.tokens = tokens
        self.total_slots = 2  # what /props reports
        self._slots: dict[int, list[int]] = {}
        self.mode = "good"
        self.delay_s = 5.0
        self.read_s = 0.0  # how long /completion takes to answer (a model's read)
        # report llama-server's timings (prompt_ms) for /completion, as if each evaluated
        # token took this long: the proxy's cost model then fills and admission estimates
        # each decision's cost, as beside llama-server (0: no timings, nothing estimated)
        self.token_ms = 0.0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cancelled = 0  # slow answers whose client went away
        self.hits = 0  # requests received, on any path
        self.seen: list[tuple[str, str]] = []  # each request's method and path, in order
        self.hits_chat = 0  # chat completions received
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._failed: BaseException | None = None  # why it could not start serving
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> StandIn:
        self._thread.start()
        if not self._ready.wait(10) or self._failed is not None:
            if self._failed is not None:  # its thread has ended: nothing runs the loop
                self._thread.join(10)
                self._loop.close()
            raise RuntimeError(f"the stand-in did not start on {self.url}") from self._failed
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(middlewares=[self._count])
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/props", self._props)
        app.router.add_get("/health", self._health)
        app.router.add_post("/apply-template", self._template)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/completion", self._completion)
        runner = web.AppRunner(app, handler_cancellation=True)
        try:
            self._loop.run_until_complete(runner.setup())
            self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        except BaseException as exc:  # noqa: BLE001 (a port in use, say: __enter__ raises it)
            self._failed = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    @web.middleware
    async def _count(self, request: web.Request, handler):
        self.hits += 1
        self.seen.append((request.method, request.path))
        return await handler(request)

    async def _props(self, request: web.Request) -> web.Response:
        return web.json_response({"total_slots": self.total_slots})

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "standin", "meta": {"n_vocab": 49152}}]})

    async def _template(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"prompt": body["messages"][-1]["content"] + _CONTEXT})

    async def _tokenize(self, request: web.Request) -> web.Response:
        text = (await request.json())["content"]
        base = [2, 198, 1, 520, 9531, 198]
        tail = text[len(_CONTEXT) :] if text.startswith(_CONTEXT) else None
        if tail is None:
            return web.json_response({"tokens": [ord(c) for c in text] if self.tokens else [0] * 3})
        if tail == "":
            return web.json_response({"tokens": base})
        if len(tail) == 1 and tail.isupper():
            return web.json_response({"tokens": [*base, 49 + ord(tail) - 65]})
        return web.json_response({"tokens": [*base, 7, 7]})

    async def _completion(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.read_s:
            await asyncio.sleep(self.read_s)
        tokens, slot = body["prompt"], body.get("id_slot", 0)
        held = self._slots.get(slot, []) if body.get("cache_prompt", True) else []
        # a whole cached prompt: its last token again
        reused = min(common_prefix(held, tokens), len(tokens) - 1)
        self._slots[slot] = list(tokens)
        timings: dict[str, float] = {"cache_n": reused, "prompt_n": len(tokens) - reused}
        if self.token_ms:
            timings["prompt_ms"] = self.token_ms * (len(tokens) - reused)
        answer = {"model": "standin", "timings": timings}
        if body.get("n_probs"):
            self.hits_chat += 1
            answer["completion_probabilities"] = [
                {"top_logprobs": _GOOD["choices"][0]["logprobs"]["content"][0]["top_logprobs"]}
            ]
        return web.json_response(answer)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.hits_chat += 1
        if self.mode == "slow":
            try:
                await asyncio.sleep(self.delay_s)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            return web.json_response(_GOOD)
        if self.mode == "truncated":
            resp = web.StreamResponse(
                headers={"Content-Type": "application/json", "Content-Length": "4000"}
            )
            await resp.prepare(request)
            await resp.write(b'{"model": "standin", "choices": [{"logp')
            request.transport.close()
            return resp
        if self.mode == "invalid_json":
            return web.Response(
                text='{"model": "standin", "choices": [', content_type="application/json"
            )
        if self.mode == "error_500":
            return web.json_response(
                {"error": {"code": 500, "message": "CUDA out of memory"}}, status=500
            )
        if self.mode == "loading":
            return web.json_response(
                {"error": {"code": 503, "message": "Loading model"}}, status=503
            )
        return web.json_response(_GOOD)


if __name__ == "__main__":  # python -m tests.standin [PORT] [--tokens] [--slots N] [--read-ms MS]
    # [--token-ms MS]
    import argparse
    import signal

    parser = argparse.ArgumentParser(prog="python -m tests.standin")
    parser.add_argument("port", type=int, nargs="?")
    parser.add_argument(
        "--tokens",
        action="store_true",
        help="tokenise text one token per character: the proxy then reads "
        "through /completion (see StandIn)",
    )
    parser.add_argument("--slots", type=int, default=2, help="total_slots /props reports")
    parser.add_argument(
        "--read-ms", type=float, default=0.0, help="how long /completion takes (default: none)"
    )
    parser.add_argument(
        "--token-ms",
        type=float,
        default=0.0,
        help="report timings as if each evaluated token took MS: the proxy then estimates "
        "each decision's cost for admission, as beside llama-server (default: no timings)",
    )
    args = parser.parse_args()
    standin = StandIn(tokens=args.tokens)
    standin.total_slots = args.slots
    standin.read_s = args.read_ms / 1000
    standin.token_ms = args.token_ms
    if args.port is not None:
        standin.port = args.port
        standin.url = f"http://127.0.0.1:{standin.port}"
    stopping = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stopping)  # held for sigwait, in every thread
    with standin:
        signal.sigwait(stopping)
