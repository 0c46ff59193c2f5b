"""Write bench/RESULTS.md and bench/latency_vs_concurrency.png from bench/out/*.json.

    .venv/bin/python bench/report.py

Reads what bench/load.py (load.json, soak.json, and load_backpressure.json from
``--out load_backpressure.json`` with lowered limits) and bench/json_vs_decision.py
(json_vs_decision.json) wrote; a missing file leaves its section out.
Plotting needs matplotlib (the `calibrate` extra, in requirements.lock).
"""

from __future__ import annotations

import datetime
from pathlib import Path

import matplotlib
import orjson

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["main", "plot", "markdown"]

BENCH = Path(__file__).resolve().parent
OUT = BENCH / "out"
PLOT = BENCH / "latency_vs_concurrency.png"
SCENARIOS = {"systemone": "System One, 1 question", "semif": "chat + semif (proxy)",
             "direct": "same read, llama-server's chat endpoint", "chat": "plain chat, max_tokens 8"}


def _read(name: str) -> dict | None:
    path = OUT / name
    return orjson.loads(path.read_bytes()) if path.exists() else None


def _table(header: list[str], rows: list[list[object]]) -> list[str]:
    cells = [[c if isinstance(c, str) else _num(c) for c in row] for row in rows]
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in cells), ""]


def _num(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"
    return str(v)


def _machine(m: dict) -> list[str]:
    return ["## Machine", "",
            f"- CPU: {m['cpu']} ({m.get('cpu_level', 'level not recorded')}), {m['cores']} cores, {m['memory_gib']} GiB RAM,"
            f" Linux {m['kernel']},"
            f" Python {m['python']}",
            f"- llama-server: `{m['llama_server']}` ({m['llama_server_version']}),"
            f" flags `{' '.join(m['llama_server_flags'])}`",
            f"- chosen for this CPU: {m.get('llama_server_choice', 'not recorded')}".replace(
                "\n", "; "),
            f"- model: {m['model']} ({m['model_bytes'] / 2**20:.0f} MiB)",
            "- client, proxy and llama-server share the machine (loopback); other work on the"
            " machine at the time of the run is not controlled for", ""]


def _load(load: dict) -> list[str]:
    rows = [[SCENARIOS.get(r["scenario"], r["scenario"]), r["concurrency"], r["requests"],
             r["throughput_rps"], r["p50_ms"], r["p95_ms"], r["p99_ms"], r["errors"],
             r["rejected_429"],
             f"{r['rss_before_kb'] / 1024:.1f} → {r['rss_after_kb'] / 1024:.1f}"]
            for r in sorted(load["results"], key=lambda r: (list(SCENARIOS).index(r["scenario"]),
                                                           r["concurrency"]))]
    ratio_rows = [[r["concurrency"], f"{r['p50']:.3f}", f"{r['p99']:.3f}", f"{r['throughput']:.3f}"]
                  for r in load["ratios"]]
    rss = load["proxy_rss_kb"]
    return ["## Load", "", f"`{load['command']}` ({load['machine']['date']})", "",
            *_table(["scenario", "concurrency", "requests", "req/s", "p50 ms", "p95 ms", "p99 ms",
                     "errors", "429", "proxy RSS MB"], rows),
            f"Proxy RSS over the whole run: {rss['start'] / 1024:.1f} MB at start,"
            f" {rss['end'] / 1024:.1f} MB at the end. Latencies are of status-200 answers;"
            " errors count every other status but 429 (its own column), and client-side"
            " failures. `semif` and `direct` send one identical prompt, which llama-server's"
            " prompt cache serves after the first time (the proxy reads it through"
            " `/completion` with its tokens, `direct` through the chat endpoint, which"
            " renders the template on every call); System One sends the states of"
            " tests/data/tickets.jsonl in turn, so it pays prompt evaluation.", "",
            "### Proxy vs direct llama-server, the same one-token read", "",
            *_table(["concurrency", "p50 proxy/direct", "p99 proxy/direct",
                     "throughput proxy/direct"], ratio_rows),
            f"![latency against concurrency]({PLOT.name})", ""]


def _backpressure(bp: dict) -> list[str]:
    rows = [[SCENARIOS.get(r["scenario"], r["scenario"]), r["concurrency"], r["requests"],
             r["ok"], r["rejected_429"], r["errors"], r["p50_ms"]] for r in bp["results"]]
    return ["### Backpressure with lowered limits", "",
            f"`{bp['command']}` ({bp['machine']['date']})", "",
            "The client ignores Retry-After and retries at once, so the 429 counts measure"
            " how fast the proxy refuses, not a realistic client.", "",
            *_table(["scenario", "concurrency", "requests", "200", "429", "errors",
                     "p50 ms (200s)"], rows)]


def _soak(soak: dict) -> list[str]:
    rows = [[SCENARIOS[name], p["requests"], p["throughput_rps"], p["p50_ms"], p["p99_ms"],
             p["errors"], ", ".join(f"{k}: {v}" for k, v in p["statuses"].items())]
            for name, p in soak["scenarios"].items()]
    after = soak["requests"] * (soak["duration_s"] - soak["warmup_s"]) / soak["duration_s"]
    per_minute = [f"{kb / 1024:.1f}" for t, kb in soak["rss_samples"][::6]]
    growth_b = soak["rss_growth_mb"] * 2**20 / max(after, 1)
    return ["## Soak", "", f"`{soak['command']}` ({soak['machine']['date']})", "",
            f"{soak['duration_s']:.0f} s at concurrency {soak['concurrency']}, the scenarios mixed"
            f" in turn: {soak['requests']} requests, **{soak['errors']} errors**.", "",
            *_table(["scenario", "requests", "req/s", "p50 ms", "p99 ms", "errors", "statuses"],
                    rows),
            f"Proxy RSS (MB), one sample a minute: {', '.join(per_minute)}.", "",
            f"After {soak['warmup_s']:.0f} s of warm-up the RSS was"
            f" {soak['rss_baseline_mb']:.1f} MB;"
            f" it ended **{soak['rss_growth_mb']:+.2f} MB** from there (peak"
            f" {soak['rss_peak_growth_mb']:+.2f} MB, least-squares slope"
            f" {soak['rss_slope_mb_per_min']:+.3f} MB/min). Bound: growth under"
            f" {soak['bound_mb']} MB — {'met' if soak['within_bound'] else '**not met**'}.", "",
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
            " the bound.", ""]


def _json(jvd: dict) -> list[str]:
    ways = jvd["ways"]
    sets = sorted(next(iter(ways.values()))["accuracy_by_set"])
    rows = [[{"systemone": "System One (proxy)", "json": "plain chat, JSON schema enum"}[w],
             s["items"], f"{s['accuracy']:.3f}", *(f"{s['accuracy_by_set'][k]:.3f}" for k in sets),
             s["invalid"], s["p50_ms"], s["p95_ms"], s["total_s"]]
            for w, s in ways.items()]
    ratio = ways["json"]["total_s"] / ways["systemone"]["total_s"]
    spread = "; ".join(f"{w}: " + ", ".join(f"{k} {_top_share(jvd['records'], w, k):.2f}"
                                             for k in sets) for w in ways)
    return ["## System One vs a JSON answer through plain chat", "",
            f"`{jvd['command']}` ({jvd['machine']['date']})", "",
            "The same items, one request each way per item, alternating which goes first;"
            " concurrency 1. The JSON way uses `response_format` (JSON schema, `answer` an enum of"
            " the options), temperature 0, `max_tokens` 64.", "",
            *_table(["way", "items", "accuracy", *(f"acc. {k}" for k in sets), "invalid",
                     "p50 ms", "p95 ms", "total s"], rows),
            f"The JSON way took {ratio:.2f}x the time of System One on the same items.", "",
            "Share of the most common answer per set (1.00: the model gave one answer to every"
            f" item): {spread}.", ""]


def _top_share(records: list[dict], way: str, set_name: str) -> float:
    answers = [r[way]["prediction"] for r in records if r["set"] == set_name]
    return max(answers.count(a) for a in set(answers)) / len(answers)


# Benchmarks that print their own report: bench/out/NAME.txt, its first line the command.
PRINTED = {"overhead": "Proxy overhead against direct llama-server",
           "cpu": "CPU per decision against a bare relay",
           "shared_state": "Reading the state once"}


def _printed(name: str, text: str) -> list[str]:
    command, _, body = text.partition("\n")
    return [f"## {PRINTED[name]}", "", f"`{command.removeprefix('$ ')}`", "", "```",
            body.strip(), "```", ""]


def markdown(load: dict | None, soak: dict | None, jvd: dict | None,
             bp: dict | None = None, printed: dict[str, str] | None = None) -> str:
    runs = [r for r in (load, bp, soak, jvd) if r]
    printed = printed or {}
    lines = ["# Benchmark results", "",
             f"Written {datetime.date.today().isoformat()} by `make results` (the benchmarks,"
             " then `.venv/bin/python bench/report.py` from bench/out/). Benchmarks, not tests:"
             " nothing gates on these figures.", "",
             *_machine(runs[0]["machine"]), "## Commands", "", "```",
             *(r["command"] for r in runs),
             *(text.partition("\n")[0].removeprefix("$ ") for text in printed.values()),
             ".venv/bin/python bench/report.py", "```", ""]
    for part, fn in ((load, _load), (bp, _backpressure), (soak, _soak), (jvd, _json)):
        if part:
            lines += fn(part)
    for name, text in printed.items():
        lines += _printed(name, text)
    return "\n".join(lines)


def plot(load: dict, path: Path = PLOT) -> None:
    fig, ax = plt.subplots(figsize=(7, 6))
    for i, (name, label) in enumerate(SCENARIOS.items()):
        rows = sorted((r for r in load["results"] if r["scenario"] == name and r["ok"]),
                      key=lambda r: r["concurrency"])
        if not rows:
            continue
        xs = [r["concurrency"] for r in rows]
        ax.plot(xs, [r["p50_ms"] for r in rows], "o-", color=f"C{i}", label=f"{label} p50")
        ax.plot(xs, [r["p99_ms"] for r in rows], "x--", color=f"C{i}", alpha=0.6,
                label=f"{label} p99")
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
    load, soak, jvd = _read("load.json"), _read("soak.json"), _read("json_vs_decision.json")
    if not (load or soak or jvd):
        raise SystemExit(f"nothing in {OUT}; run bench/load.py first")
    if load:
        plot(load)
        print(f"wrote {PLOT.relative_to(BENCH.parent)}")
    printed = {name: (OUT / f"{name}.txt").read_text() for name in PRINTED
               if (OUT / f"{name}.txt").exists()}
    (BENCH / "RESULTS.md").write_text(
        markdown(load, soak, jvd, _read("load_backpressure.json"), printed))
    print("wrote bench/RESULTS.md")


if __name__ == "__main__":
    main()
