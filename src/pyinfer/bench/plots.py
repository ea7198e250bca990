"""PNG plots of the studies' reports (needs matplotlib: the `[bench]` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> bool:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    _plt().close(fig)
    return True


def _roofline_axes(ax: Any, rows: list[dict[str, Any]], key: str) -> None:
    """Points (bytes/token, tokens/s) per thread count, and each ceiling's curve
    tokens/s = bandwidth / bytes."""
    threads = sorted({r["threads"] for r in rows})
    xs = np.array([r["bytes_per_token"] for r in rows])
    x = np.geomspace(xs.min() / 1.5, xs.max() * 1.5, 50)
    markers = "osD^v<>"
    for i, nt in enumerate(threads):
        sel = [r for r in rows if r["threads"] == nt]
        bw = float(np.median([r["ceiling_gbps"] for r in sel]))
        line, = ax.plot(x / 1e6, bw * 1e9 / x, "--", lw=1, label=f"ceiling {nt}t: {bw:.0f} GB/s / bytes")
        ax.scatter([r["bytes_per_token"] / 1e6 for r in sel], [r["tokens_per_s"] for r in sel],
                   color=line.get_color(), marker=markers[i % len(markers)], zorder=3, label=f"measured {nt}t")
        for r in sel:
            ax.annotate(f"{r[key]} {r['pct_of_ceiling']:.0f}%", (r["bytes_per_token"] / 1e6, r["tokens_per_s"]),
                        textcoords="offset points", xytext=(4, 3 if i == 0 else -10), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("MB read per decoded token (weights + KV cache)")
    ax.set_ylabel("decode tokens/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def plot_roofline(rep: dict[str, Any], path: Path) -> bool:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.6))
    _roofline_axes(ax, rep["rows"], "format")
    ax.set_title("Decode roofline by weight format (label: % of measured read bandwidth)", fontsize=9)
    return _save(fig, path)


def plot_model_size(rep: dict[str, Any], path: Path) -> bool:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.6))
    _roofline_axes(ax, rep["rows"], "model")
    ax.set_title("Decode against model size (synthetic Q4_1 models)", fontsize=9)
    return _save(fig, path)


def plot_ceiling(rep: dict[str, Any], path: Path) -> bool:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    b = rep["bandwidth"]
    ax.bar([str(x["threads"]) for x in b], [x["median_gbps"] for x in b], color="tab:blue")
    ax.set_xlabel("threads")
    ax.set_ylabel("read GB/s (median)")
    ax.set_title("Memory read bandwidth", fontsize=9)
    return _save(fig, path)


def plot_formats(rep: dict[str, Any], path: Path) -> bool:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    rows = rep["rows"]
    ax.bar([r["format"] for r in rows], [r["weight_bytes_per_token"] / 1e6 for r in rows], color="tab:green")
    ax.set_ylabel("MB of weights per token")
    ax2 = ax.twinx()
    ax2.plot([r["format"] for r in rows], [max(r["max_rel_logit_error"], 1e-8) for r in rows], "ko-")
    ax2.set_yscale("log")
    ax2.set_ylabel("relative logit error (dots)")
    ax.set_title("Formats: bytes per token and accuracy", fontsize=9)
    return _save(fig, path)


def plot_context(rep: dict[str, Any], path: Path) -> bool:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for kv in sorted({r["kv_dtype"] for r in rep["rows"]}):
        sel = [r for r in rep["rows"] if r["kv_dtype"] == kv]
        ax.plot([r["context"] for r in sel], [r["tokens_per_s"] for r in sel], "o-", label=f"KV {kv}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("decode tokens/s")
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title("Decode against context length", fontsize=9)
    return _save(fig, path)


def plot_batch(rep: dict[str, Any], path: Path) -> bool:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for mode in rep.get("modes", sorted({r["mode"] for r in rep["rows"]})):
        rows = [r for r in rep["rows"] if r["mode"] == mode]
        line, = ax.plot([r["batch"] for r in rows], [r["aggregate_tokens_per_s"] for r in rows], "o-",
                        label=f"{mode}: aggregate")
        ax.plot([r["batch"] for r in rows], [r["per_sequence_tokens_per_s"] for r in rows], "s--",
                color=line.get_color(), label=f"{mode}: per sequence")
    capped = [r for r in rep["rows"] if "ceiling_tokens_per_s" in r]
    if capped:
        ax.plot([r["batch"] for r in capped], [r["ceiling_tokens_per_s"] for r in capped], ":", color="gray",
                label="ceiling: bandwidth, then int8 arithmetic")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequences B")
    ax.set_ylabel("decode tokens/s")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the axes: the ceiling is top left
    ax.set_title("Batch: B sequences decoding", fontsize=9)
    return _save(fig, path)


def plot_prefill(rep: dict[str, Any], path: Path) -> bool:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    rows = rep["rows"]
    n = [r["prompt_tokens"] for r in rows]
    ax.plot(n, [r["prefill_tokens_per_s"] for r in rows], "o-", color="tab:blue", label="prefill tok/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("prefill tokens/s")
    ax2 = ax.twinx()
    ax2.plot(n, [r["ttft_s"] * 1e3 for r in rows], "s--", color="tab:red", label="TTFT")
    ax2.set_yscale("log")
    ax2.set_ylabel("time to first token (ms)")
    ax.set_title("Prefill speed (circles) and TTFT (squares)", fontsize=9)
    return _save(fig, path)


def plot_peers(rep: dict[str, Any], path: Path) -> bool:
    if not rep["ratios"]:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels = [f"{x['peer']} {x['threads']}t" for x in rep["ratios"]]
    i = np.arange(len(labels))
    ax.bar(i - 0.2, [x["pp_ratio"] for x in rep["ratios"]], 0.4, label=f"pp{rep['pp_tokens']}")
    ax.bar(i + 0.2, [x["tg_ratio"] for x in rep["ratios"]], 0.4, label=f"tg{rep['tg_tokens']}")
    ax.axhline(1, color="k", lw=0.8)
    ax.set_xticks(i, labels, fontsize=8)
    ax.set_ylabel("pyinfer tokens/s / peer's")
    ax.legend()
    ax.set_title("pyinfer against peers, measured side by side", fontsize=9)
    return _save(fig, path)


def plot_serve(rep: dict[str, Any], path: Path) -> bool:
    """Median TTFT (p99 dotted) and aggregate output tokens/s against concurrency, a line per
    engine, one colour each on both panels."""
    rows = rep["rows"]
    if not rows:
        return False
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.8))
    engines = list(dict.fromkeys(r["engine"] for r in rows))
    for i, name in enumerate(engines):
        sel = sorted((r for r in rows if r["engine"] == name and r["completed"]), key=lambda r: r["concurrency"])
        if not sel:
            continue
        c = [r["concurrency"] for r in sel]
        colour = f"C{i}"
        ax1.plot(c, [r["median_ttft_ms"] for r in sel], "o-", color=colour, label=f"{name} p50")
        ax1.plot(c, [r["p99_ttft_ms"] for r in sel], ":", color=colour, label=f"{name} p99")
        ax2.plot(c, [r["output_throughput"] for r in sel], "o-", color=colour, label=name)
    slo = rep.get("slo", {}).get("ttft_ms")
    if slo:
        ax1.axhline(slo, color="gray", lw=0.8, ls="--", label=f"SLO {slo:.0f} ms")
    levels = sorted({r["concurrency"] for r in rows})
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(x) for x in levels])
        ax.set_xlabel("concurrent streaming clients")
        ax.grid(True, which="both", alpha=0.3)
    ax1.set_yscale("log")
    ax1.set_ylabel("time to first token (ms)")
    ax1.set_title("TTFT (solid: p50, dotted: p99)", fontsize=9)
    ax2.set_ylabel("output tokens/s, all clients")
    ax2.set_title(f"Aggregate output tokens/s ({rep['plan']['max_tokens']} per reply)", fontsize=9)
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    return _save(fig, path)


def plot_speculative(rep: dict[str, Any], path: Path) -> bool:
    """Decode tokens/s per request, without and with drafts, the speed-up over each pair."""
    rows = rep["rows"]
    if not rows:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3.6))
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["plain_tokens_per_s"] for r in rows], 0.4, label="plain (draft=0)")
    ax.bar(x + 0.2, [r["draft_tokens_per_s"] for r in rows], 0.4, label="prompt lookup (draft=8)")
    for i, r in enumerate(rows):
        if r["speedup"]:
            ax.annotate(f"{r['speedup']:.2f}x", (i, max(r["plain_tokens_per_s"], r["draft_tokens_per_s"])),
                        ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [f"{r['request']}\n({r['kind']})" for r in rows], fontsize=7)
    ax.set_ylabel("decode tokens/s")
    ax.set_title(f"Speculative decoding by prompt lookup, greedy, {rep['threads']} thread(s)", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_contention(rep: dict[str, Any], path: Path) -> bool:
    """Decode tokens/s per condition, a bar per thread count."""
    rows = rep.get("rows")
    if not rows:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    conditions = list(dict.fromkeys(r["condition"] for r in rows))
    threads = sorted({r["threads"] for r in rows})
    width = 0.8 / len(threads)
    for i, t in enumerate(threads):
        ys = [next(r["tokens_per_s"] for r in rows if r["condition"] == c and r["threads"] == t) for c in conditions]
        ax.bar([j + i * width for j in range(len(conditions))], ys, width, label=f"{t} thread{'s' if t > 1 else ''}")
    ax.set_xticks([j + width * (len(threads) - 1) / 2 for j in range(len(conditions))], conditions)
    ax.set_ylabel("decode tokens/s")
    ax.set_title("Decode with a core shared")
    ax.legend()
    return _save(fig, path)


PLOTS: dict[str, Callable[[dict[str, Any], Path], bool]] = {
    "ceiling": plot_ceiling, "roofline": plot_roofline, "formats": plot_formats, "context": plot_context,
    "batch": plot_batch, "prefill": plot_prefill, "model_size": plot_model_size, "peers": plot_peers,
    "speculative": plot_speculative, "serve": plot_serve, "contention": plot_contention,
}
