"""Every route of the pinned llama-server, extracted from its source into
``scripts/llama_routes.txt`` (one ``METHOD PATH`` a line).

    python scripts/llama_routes.py          # rewrite scripts/llama_routes.txt
    python scripts/llama_routes.py --check  # exit 1 when it differs from the source
    python scripts/llama_routes.py --source DIR   # DIR/tools/server of another tree

The source is llama.cpp's ``tools/server`` as the set-up unpacks it for the b11434 source
build (``scripts/fetch.py``'s ``source_dir``; ``python scripts/prepare.py llama-server
--source`` unpacks and builds it). ``server.cpp`` registers the API routes
(``ctx_http.get("/props", ...)``, every branch, router mode's included);
``server-http.cpp`` adds the web UI's fixed paths and Vertex AI's predict route at its
default (``AIP_PREDICT_ROUTE``). The web UI's other files are named at build time and are
not in the source. The file is committed, so the docs and the unit tests
(``tests/unit/test_route_access.py``) need no source tree; a test reruns the extraction
where the source is unpacked.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts.fetch import SOURCE_BUILD, cache_root  # noqa: E402

__all__ = ["ROUTES", "extract", "read", "server_dir"]

ROUTES = ROOT / "scripts" / "llama_routes.txt"
_HEADER = (
    f"# llama-server {SOURCE_BUILD}'s routes (METHOD PATH), from tools/server/server.cpp and\n"
    "# server-http.cpp: written by scripts/llama_routes.py; do not edit\n"
)
# server.cpp: ctx_http.get ("/props", ...); del is DELETE
_API = re.compile(r'\bctx_http\.(get|post|put|patch|del)\s*\(\s*"([^"]+)"')
# server-http.cpp: srv->Get(params.api_prefix + "/index.html", ...), a literal path only
_HTTP = re.compile(
    r'\bsrv->(Get|Post|Put|Patch|Delete)\s*\(\s*params\.api_prefix\s*\+\s*"([^"]+)"\s*,'
)
_PREDICT = re.compile(r'getenv\(\s*"AIP_PREDICT_ROUTE"\s*,\s*"([^"]+)"')
_METHODS = {"del": "DELETE"}


def extract(server_cpp: str, server_http_cpp: str) -> list[tuple[str, str]]:
    """The routes the two files register, each once, in the order they first appear:
    server.cpp's, then server-http.cpp's fixed paths, then the predict route (POST)."""
    found = [(_METHODS.get(m, m.upper()), p) for m, p in _API.findall(server_cpp)]
    found += [(m.upper(), p) for m, p in _HTTP.findall(server_http_cpp)]
    found += [("POST", p) for p in _PREDICT.findall(server_http_cpp)]
    return list(dict.fromkeys(found))


def server_dir() -> Path | None:
    """``tools/server`` of the first unpacked b11434 source tree in the cache, if any."""
    for found in sorted(cache_root().glob(f"llama-server-{SOURCE_BUILD}-*/src/**/tools/server")):
        if (found / "server.cpp").is_file() and (found / "server-http.cpp").is_file():
            return found
    return None


def read(path: Path = ROUTES) -> list[tuple[str, str]]:
    """The committed routes."""
    rows = [line.split(" ", 1) for line in path.read_text().splitlines()]
    return [(r[0], r[1]) for r in rows if r[0] and not r[0].startswith("#")]


def render(routes: list[tuple[str, str]]) -> str:
    return _HEADER + "".join(f"{method} {path}\n" for method, path in routes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the file is stale")
    parser.add_argument("--source", type=Path, help="a tools/server folder to read instead")
    args = parser.parse_args(argv)
    where = args.source or server_dir()
    if where is None:
        print(
            f"no unpacked llama.cpp {SOURCE_BUILD} source under {cache_root()}: "
            "python scripts/prepare.py llama-server --source unpacks it",
            file=sys.stderr,
        )
        return 2
    routes = extract((where / "server.cpp").read_text(), (where / "server-http.cpp").read_text())
    wanted = render(routes)
    if args.check:
        if not ROUTES.exists() or ROUTES.read_text() != wanted:
            print(f"{ROUTES.relative_to(ROOT)} is stale: run {__file__}", file=sys.stderr)
            return 1
        return 0
    if not ROUTES.exists() or ROUTES.read_text() != wanted:
        ROUTES.write_text(wanted)
        print(f"wrote {ROUTES.relative_to(ROOT)}: {len(routes)} routes from {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
