"""The offline tools package (semif_tools): its one retry policy, its one progress bar, and
its boundary with the server (proxy/ imports none of it, nor the tools extra)."""

from __future__ import annotations

import ast
import email.utils
import importlib
import inspect
import io
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import httpx
import pytest

import semif_tools
from proxy import __main__ as proxy_main
from semif_tools import __main__ as tools_main
from semif_tools import client
from semif_tools.progress import Bar

ROOT = Path(__file__).resolve().parents[2]


def _answers(*replies: httpx.Response | Exception) -> tuple[httpx.MockTransport, list[str]]:
    """A transport that gives ``replies`` in turn (an exception is raised), and the paths asked."""
    asked: list[str] = []
    left = list(replies)

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        reply = left.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    return httpx.MockTransport(handler), asked


@pytest.fixture
def waits(monkeypatch):
    """The policy's waits (sync and async), recorded instead of slept."""
    seen: list[float] = []

    async def asleep(seconds: float) -> None:
        seen.append(seconds)

    monkeypatch.setattr(client.send.retry, "sleep", seen.append)
    monkeypatch.setattr(client.send_async.retry, "sleep", asleep)
    return seen


def _send(*replies):
    transport, asked = _answers(*replies)
    with httpx.Client(transport=transport, base_url="http://proxy") as http:
        return client.send(http, "POST", "/v1/systemone", json={}), asked


def test_what_passes_is_retried_after_the_longer_of_back_off_and_retry_after(waits):
    resp, asked = _send(
        httpx.Response(429, headers={"Retry-After": "3"}),
        httpx.Response(503),
        httpx.Response(502),
        httpx.Response(504),
        httpx.Response(200, json={"ok": True}),
    )
    assert resp.status_code == 200 and len(asked) == 5
    assert waits == [3.0, 1.0, 2.0, 4.0]  # 3 s asked for; then 0.5 s doubling (1, 2, 4)


@pytest.mark.parametrize("status", [200, 400, 404, 422, 500])
def test_other_answers_are_not_retried(waits, status):
    resp, asked = _send(httpx.Response(status))
    assert resp.status_code == status and len(asked) == 1 and waits == []


def test_after_the_last_attempt_the_last_answer_is_returned(waits):
    resp, asked = _send(*[httpx.Response(429, headers={"Retry-After": "1"})] * client.ATTEMPTS)
    assert resp.status_code == 429 and len(asked) == client.ATTEMPTS
    assert waits == [1.0, 1.0, 2.0, 4.0, 8.0]


def test_an_unreachable_proxy_is_retried_but_a_timeout_is_not(waits):
    refused = httpx.ConnectError("refused")
    resp, asked = _send(refused, httpx.RemoteProtocolError("closed"), httpx.Response(200))
    assert resp.status_code == 200 and len(asked) == 3 and waits == [0.5, 1.0]
    with pytest.raises(httpx.ConnectError):
        _send(*[refused] * client.ATTEMPTS)
    waits.clear()
    with pytest.raises(httpx.ReadTimeout):
        _send(httpx.ReadTimeout("slow"), httpx.Response(200))
    assert waits == []


async def test_the_async_client_has_the_same_policy(waits):
    transport, asked = _answers(
        httpx.Response(503, headers={"Retry-After": "2"}), httpx.Response(200)
    )
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as http:
        resp = await client.send_async(http, "GET", "/v1/models")
    assert resp.status_code == 200 and len(asked) == 2 and waits == [2.0]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("7", 7.0),
        ("0", 0.0),
        ("3600", client.RETRY_AFTER_CAP_S),
        ("", None),
        ("soon", None),
        ("-1", None),
        (email.utils.formatdate(time.time() - 60, usegmt=True), 0.0),
    ],
)
def test_retry_after_is_seconds_or_an_http_date(value, seconds):
    assert client.retry_after_s(httpx.Response(429, headers={"Retry-After": value})) == seconds


def test_retry_after_as_a_date_to_come():
    date = email.utils.formatdate(time.time() + 20, usegmt=True)
    assert 15 <= client.retry_after_s(httpx.Response(503, headers={"Retry-After": date})) <= 20


def test_the_client_speaks_to_the_proxy_with_its_key():
    with client.client("http://127.0.0.1:8080/", api_key="k", timeout_s=5) as http:
        assert str(http.base_url) == "http://127.0.0.1:8080"
        assert http.headers["Authorization"] == "Bearer k" and http.timeout.read == 5
    with client.client("http://127.0.0.1:8080") as http:
        assert "Authorization" not in http.headers


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_off_a_terminal_writes_its_final_state_once():
    stream = io.StringIO()
    with Bar(3, "reading", unit="item", stream=stream) as bar:
        bar.update(1)
        bar.update(1)
        assert stream.getvalue() == ""  # nothing while it runs
        bar.update(1)
    text = stream.getvalue()
    assert text.startswith("reading: 100%") and "3/3" in text and "item/s" in text
    assert text.count("\n") == 1 and "\r" not in text


def test_the_bar_on_a_terminal_is_drawn_as_it_moves():
    stream = _Terminal()
    with Bar(2, "batch", unit="line", stream=stream, mininterval=0) as bar:
        bar.update(1)
        assert "1/2" in stream.getvalue()
        bar.update(1)
    assert "\r" in stream.getvalue() and "2/2" in stream.getvalue()


def test_the_extra_is_the_one_pyproject_declares():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert sorted(r.split("==")[0] for r in extras["tools"]) == sorted(semif_tools.EXTRA)


def _module_level_imports(path: Path) -> set[str]:
    """The modules a file imports outside any function (what importing it imports)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.add(child.module)
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def test_the_server_imports_nothing_of_the_tools_extra():
    """Not httpx, matplotlib, tenacity nor tqdm at module level; semif_tools itself, at any
    level, is test_imports.py's check."""
    imported = {
        str(p.relative_to(ROOT)): sorted(
            m for m in _module_level_imports(p) if m.split(".")[0] in semif_tools.EXTRA
        )
        for p in sorted((ROOT / "proxy").rglob("*.py"))
    }
    assert not {k: v for k, v in imported.items() if v}
    # and what loading the server (and python -m proxy) imports, in a fresh interpreter
    tools = ("semif_tools", *semif_tools.EXTRA)
    probe = (
        "import sys, proxy.__main__, proxy.app; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1:])))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, *tools], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == "[]"


def test_the_commands_pyproject_declares_run_without_arguments():
    """Each ``[project.scripts]`` entry names a function that takes no argument it needs
    (the script calls it bare and exits with what it returns)."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {
        "semif-proxy": "proxy.__main__:cli",
        "semif-tools": "semif_tools.__main__:main",
    }
    for target in scripts.values():
        module, _, name = target.partition(":")
        inspect.signature(getattr(importlib.import_module(module), name)).bind()


def test_the_tools_command_runs_each_tool(capsys):
    assert set(proxy_main.MOVED) <= set(semif_tools.COMMANDS)
    with pytest.raises(SystemExit) as exc:
        tools_main.main(["batch", "--help"])
    assert exc.value.code == 0 and "python -m semif_tools batch" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        tools_main.main(["calibrate", "--help"])
    assert exc.value.code == 0 and "--profile" in capsys.readouterr().out
    assert tools_main.main(["serve"]) == 2
    assert "{calibrate,batch,drift,records-from-capture}" in capsys.readouterr().err


def _command(package: str, missing: str, *argv: str) -> subprocess.CompletedProcess:
    """``python -m PACKAGE ARGV`` in a fresh interpreter where ``missing`` cannot be imported."""
    code = (
        f"import sys, runpy; sys.modules[{missing!r}] = None; "
        f"runpy.run_module({package!r}, run_name='__main__', alter_sys=True)"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("command", "missing"),
    [("batch", "httpx"), ("batch", "tenacity"), ("batch", "tqdm"), ("calibrate", "matplotlib")],
)  # checked before anything is read
def test_a_missing_extra_is_said_with_the_install_line(command, missing):
    done = _command("semif_tools", missing, command, "in.jsonl", "out.jsonl", "--profile", "p")
    assert (
        done.returncode == 2 and f"{command} needs {missing}, of the tools extra" in done.stderr
    ), done.stderr
    assert "pip install 'semif-sidecar[tools]'" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("missing", ["semif_tools", "_nothing"])  # the tools installed or not
def test_the_servers_old_commands_say_the_new_one(missing):
    done = _command("proxy", missing, "calibrate", "my data.jsonl", "--profile", "p")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "    python -m semif_tools calibrate 'my data.jsonl' --profile p\n" in done.stderr
    assert "pip install 'semif-sidecar[tools]'" in done.stderr
