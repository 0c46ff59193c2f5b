"""Write bench/RESULTS.md and bench/latency_vs_concurrency.png from bench/out/*.json.

    .venv/bin/python bench/report.py

Reads what bench/load.py wrote (load.json, soak.json, and load_backpressure.json from
``--out load_backpressure.json`` with lowered limits) and the printed reports of
bench/overhead.py, bench/cpu.py and bench/shared_state.py (bench/out/NAME.txt, their
first line the command), all written by `make results`; a missing file leaves its
section out. The file opens with one line naming what the figures were measured on:

    machine: <CPU> (<instruction-set level>), <cores> cores; llama.cpp <build>; <model>; <date>

from what bench/_machine.py recorded with the first run (the CPU's level: AVX2, AVX-512,
AVX-512 and AMX, ...; the llama.cpp build scripts/prepare.py chose, or LLAMA_SERVER's).
Plotting needs matplotlib (the `tools` extra).
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import matplotlib
import orjson

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["main", "plot", "markdown", "stamp"]

BENCH = Path(__file__).resolve().parent
OUT = BENCH / "out"
PLOT = BENCH / "latency_vs_concurrency.png"
SCENARIOS = {
    "systemone": "System One, 1 question",
    "semif": "chat + semif (proxy)",
    "direct": "same read, llama-server's chat endpoint",
    "chat": "plain chat, max_tokens 8",
}


def _read(name: str) -> dict | None:
    path = OUT / name
    return orjson.loads(path.read_bytes()) if path.exists() else None


def _table(header: list[str], rows: list[list[object]]) -> list[str]:
    cells = [[c if isinstance(c, str) else _num(c) for c in row] for row in rows]
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in cells),
        "",
    ]


def _num(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"
    return str(v)


def _build(m: dict) -> str:
    """The llama.cpp build, as bench/_machine.py records it ("b11434 source"); for runs
    recorded before it did, the release and kind from the choice's label ("source build
    b11434 (...)", "prebuilt wheel b10434 (...)") or llama-server's --version."""
    if m.get("llama_build"):
        return m["llama_build"]
    label = m.get("llama_server_choice", "").split(":")[0].split(" (")[0]
    named = re.search(r"\bb\d+\b", label)
    version = re.search(r"build (\d+)", m.get("llama_server_version", ""))
    if not (named or version):
        return "unknown build"
    release = named.group(0) if named else f"b{version.group(1)}"
    kind = {
        "source build": "source",
        "portable source build": "portable source",
        "prebuilt wheel": "wheel",
    }.get(label.replace(release, "").strip(), "")
    return f"{release} {kind}".strip()


def _model(m: dict) -> str:
    return m["model"].removesuffix(".gguf")


def stamp(m: dict) -> str:
    """One line: what the figures were measured on, and the day."""
    return (
        f"machine: {m['cpu']} ({m.get('cpu_level', 'level not recorded')}),"
        f" {m['cores']} cores; llama.cpp {_build(m)}; {_model(m)}; {m['date'][:10]}"
    )


def _machine(m: dict) -> list[str]:
    info = m.get("llama_build_info")
    return [
        "## Machine",
        "",
        f"- CPU: {m['cpu']}, instruction-set level {m.get('cpu_level', 'not recorded')},"
        f" {m['cores']} cores, {m['memory_gib']} GiB RAM, Linux {m['kernel']},"
        f" Python {m['python']}",
        f"- llama.cpp: {_build(m)}" + (f" (`/props` build_info `{info}`)" if info else ""),
        f"- llama-server: `{m['llama_server']}` ({m['llama_server_version']}),"
        f" flags `{' '.join(m['llama_server_flags'])}`",
        f"- chosen for this CPU: {m.get('llama_server_choice', 'not recorded')}".replace(
            "\n", "; "
        ),
        f"- model: {m['model']} ({m['model_bytes'] / 2**20:.0f} MiB)",
        f"- date: {m['date']} (the first run; each section gives its own)",
        "- client, proxy and llama-server share the machine (loopback); other work on the"
        " machine at the time of the run is not controlled for",
        "",
    ]


def _load(load: dict) -> list[str]:
    rows = [
        [
            SCENARIOS.get(r["scenario"], r["scenario"]),
            r["concurrency"],
            r["requests"],
            r["throughput_rps"],
            r["p50_ms"],
            r["p95_ms"],
            r["p99_ms"],
            r["errors"],
            r["rejected_429"],
            f"{r['rss_before_kb'] / 1024:.1f} → {r['rss_after_kb'] / 1024:.1f}",
        ]
        for r in sorted(
            load["results"], key=lambda r: (list(SCENARIOS).index(r["scenario"]), r["concurrency"])
        )
    ]
    ratio_rows = [
        [r["concurrency"], f"{r['p50']:.3f}", f"{r['p99']:.3f}", f"{r['throughput']:.3f}"]
        for r in load["ratios"]
    ]
    rss = load["proxy_rss_kb"]
    return [
        "## Load",
        "",
        f"`{load['command']}` ({load['machine']['date']})",
        "",
        *_table(
            [
                "scenario",
                "concurrency",
                "requests",
                "req/s",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "errors",
                "429",
                "proxy RSS MB",
            ],
            rows,
        ),
        f"Proxy RSS over the whole run: {rss['start'] / 1024:.1f} MB at start,"
        f" {rss['end'] / 1024:.1f} MB at the end. Latencies are of status-200 answers;"
        " errors count every other status but 429 (its own column), and client-side"
        " failures. `semif` and `direct` send one identical prompt, which llama-server's"
        " prompt cache serves after the first time (the proxy reads it through"
        " `/completion` with its tokens, `direct` through the chat endpoint, which"
        " renders the template on every call); System One sends the states of"
        " tests/data/tickets.jsonl in turn, so it pays prompt evaluation.",
        "",
        "### Proxy vs direct llama-server, the same one-token read",
        "",
        *_table(
            ["concurrency", "p50 proxy/direct", "p99 proxy/direct", "throughput proxy/direct"],
            ratio_rows,
        ),
        f"![latency against concurrency]({PLOT.name})",
        "",
    ]


def _backpressure(bp: dict) -> list[str]:
    rows = [
        [
            SCENARIOS.get(r["scenario"], r["scenario"]),
            r["concurrency"],
            r["requests"],
            r["ok"],
            r["rejected_429"],
            r["errors"],
            r["p50_ms"],
        ]
        for r in bp["results"]
    ]
    return [
        "### Backpressure with lowered limits",
        "",
        f"`{bp['command']}` ({bp['machine']['date']})",
        "",
        "The client ignores Retry-After and retries at once, so the 429 counts measure"
        " how fast the proxy refuses, not a realistic client.",
        "",
        *_table(
            ["scenario", "concurrency", "requests", "200", "429", "errors", "p50 ms (200s)"], rows
        ),
    ]


def _soak(soak: dict) -> list[str]:
    rows = [
        [
            SCENARIOS[name],
            p["requests"],
            p["throughput_rps"],
            p["p50_ms"],
            p["p99_ms"],
            p["errors"],
            ", ".join(f"{k}: {v}" for k, v in p["statuses"].items()),
        ]
        for name, p in soak["scenarios"].items()
    ]
    after = soak["requests"] * (soak["duration_s"] - soak["warmup_s"]) / soak["duration_s"]
    per_minute = [f"{kb / 1024:.1f}" for t, kb in soak["rss_samples"][::6]]
    growth_b = soak["rss_growth_mb"] * 2**20 / max(after, 1)
    return [
        "## Soak",
        "",
        f"`{soak['command']}` ({soak['machine']['date']})",
        "",
        f"{soak['duration_s']:.0f} s at concurrency {soak['concurrency']}, the scenarios mixed"
        f" in turn: {soak['requests']} requests, **{soak['errors']} errors**.",
        "",
        *_table(["scenario", "requests", "req/s", "p50 ms", "p99 ms", "errors", "statuses"], rows),
        f"Proxy RSS (MB), one sample a minute: {', '.join(per_minute)}.",
        "",
        f"After {soak['warmup_s']:.0f} s of warm-up the RSS was"
        f" {soak['rss_baseline_mb']:.1f} MB;"
        f" it ended **{soak['rss_growth_mb']:+.2f} MB** from there (peak"
        f" {soak['rss_peak_growth_mb']:+.2f} MB, least-squares slope"
        f" {soak['rss_slope_mb_per_min']:+.3f} MB/min). Bound: growth under"
        f" {soak['bound_mb']} MB — {'met' if soak['within_bound'] else '**not met**'}.",
        "",
        f"Why {soak['bound_mb']} MB: a healthy proxy steps up a few MB while CPython's arenas"
        " and glibc's heap grow to the peak concurrency (the load run above), then stays flat;"
        f" {soak['bound_mb']} MB is well clear of that. A leak that grows with requests crosses"
        f" it within this run if it keeps {soak['bound_mb'] * 2**20 / max(after, 1):.0f} bytes"
        f" or more per request (over the ~{after:.0f} requests after warm-up): retaining a"
        " request, its task or its upstream response would, each being several KB with its"
        " headers and buffers. Smaller leaks show in the slope instead: the growth measured"
        f" here is {growth_b:.0f} bytes per request, and at"
        f" {max(soak['rss_slope_mb_per_min'], 1e-9):.3f} MB/min would take"
        f" {soak['bound_mb'] / max(soak['rss_slope_mb_per_min'], 1e-9) / 60:.0f} h to reach"
        " the bound.",
        "",
    ]


# Benchmarks that print their own report: bench/out/NAME.txt, its first line the command.
PRINTED = {
    "overhead": "Proxy overhead against direct llama-server",
    "cpu": "CPU per decision against a bare relay",
    "shared_state": "Reading the state once",
}


def _printed(name: str, text: str, written: str = "") -> list[str]:
    command, _, body = text.partition("\n")
    when = f" ({written})" if written else ""
    return [
        f"## {PRINTED[name]}",
        "",
        f"`{command.removeprefix('$ ')}`{when}",
        "",
        "```",
        body.strip(),
        "```",
        "",
    ]


def _written(path: Path) -> str:
    """When a printed report was written (its file's modification time, UTC)."""
    return datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.UTC).isoformat(
        timespec="seconds"
    )


def markdown(
    load: dict | None,
    soak: dict | None,
    bp: dict | None = None,
    printed: dict[str, str] | None = None,
    written: dict[str, str] | None = None,
) -> str:
    """RESULTS.md. ``printed``: the printed reports by name, ``written``: when each was."""
    runs = [r for r in (load, bp, soak) if r]
    printed, written = printed or {}, written or {}
    machine = runs[0]["machine"] if runs else None
    lines = [
        "# Benchmark results",
        "",
        stamp(machine) if machine else "machine: not recorded (no bench/load.py run)",
        "",
        f"Written {datetime.date.today().isoformat()} by `make results` (the benchmarks,"
        " then `.venv/bin/python bench/report.py` from bench/out/). Benchmarks, not tests:"
        " nothing gates on these figures.",
        "",
        *(_machine(machine) if machine else []),
        "## Commands",
        "",
        "```",
        *(r["command"] for r in runs),
        *(text.partition("\n")[0].removeprefix("$ ") for text in printed.values()),
        ".venv/bin/python bench/report.py",
        "```",
        "",
    ]
    for part, fn in ((load, _load), (bp, _backpressure), (soak, _soak)):
        if part:
            lines += fn(part)
    for name, text in printed.items():
        lines += _printed(name, text, written.get(name, ""))
    return "\n".join(lines)


def plot(load: dict, path: Path = PLOT) -> None:
    fig, ax = plt.subplots(figsize=(7, 6))
    for i, (name, label) in enumerate(SCENARIOS.items()):
        rows = sorted(
            (r for r in load["results"] if r["scenario"] == name and r["ok"]),
            key=lambda r: r["concurrency"],
        )
        if not rows:
            continue
        xs = [r["concurrency"] for r in rows]
        ax.plot(xs, [r["p50_ms"] for r in rows], "o-", color=f"C{i}", label=f"{label} p50")
        ax.plot(
            xs, [r["p99_ms"] for r in rows], "x--", color=f"C{i}", alpha=0.6, label=f"{label} p99"
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    levels = sorted({r["concurrency"] for r in load["results"]})
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("latency, ms (log)")
    m = load["machine"]
    ax.set_title(f"{m['model']} on {m['cores']} cores ({m['cpu']})", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    load, soak = _read("load.json"), _read("soak.json")
    if not (load or soak):
        raise SystemExit(f"nothing in {OUT}; run bench/load.py first (or make results)")
    if load:
        plot(load)
        print(f"wrote {PLOT.relative_to(BENCH.parent)}")
    files = {name: OUT / f"{name}.txt" for name in PRINTED if (OUT / f"{name}.txt").exists()}
    (BENCH / "RESULTS.md").write_text(
        markdown(
            load,
            soak,
            _read("load_backpressure.json"),
            {name: path.read_text() for name, path in files.items()},
            {name: _written(path) for name, path in files.items()},
        )
    )
    print("wrote bench/RESULTS.md")


if __name__ == "__main__":
    main()
