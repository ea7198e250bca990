"""The studies of `pyinfer bench`. Each takes the Settings, measures (validating first,
warming up, alternating what it compares so drift hits all alike), and returns its report
(every raw sample included) and a Markdown summary."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from pyinfer import _C, quants
from pyinfer.bandwidth import measure_stream_bandwidth
from pyinfer.bench.common import (
    GB,
    Progress,
    Settings,
    cache_note,
    decode_row,
    kv_bytes_per_position,
    median,
    prompt_ids,
    table,
    timed_decode,
)
from pyinfer.bench.contention import study_contention
from pyinfer.bench.engines import (
    STARTUP_MODULES,
    Engine,
    PyinferEngine,
    load_seconds,
    peer_makers,
    resident_memory,
)
from pyinfer.bench.serve import study_serve
from pyinfer.bench.speculative import study_speculative
from pyinfer.bench.synthetic import PRESETS, synthetic_model
from pyinfer.gguf import GGUFReader
from pyinfer.gguf_types import GGMLType
from pyinfer.model import Model, kv_dtypes_for
from pyinfer.quantize import TARGET_TYPES, ensure_derived

Report = tuple[dict[str, Any], list[str]]


def _fmt_mb(n: float) -> str:
    return f"{n / 1e6:.1f}"


# -- ceiling ---------------------------------------------------------------------------------


def _time_call(fn: Any, min_s: float = 0.02, repeats: int = 5) -> list[float]:
    """Seconds per call, each sample averaging enough calls to last min_s."""
    fn()
    t = time.perf_counter()
    fn()
    inner = max(1, int(min_s / max(time.perf_counter() - t, 1e-7)))
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        out.append((time.perf_counter() - t) / inner)
    return out


def study_ceiling(s: Settings) -> Report:
    """Read bandwidth over an array far past the last-level cache at each thread count, and
    one core's peak matmul throughput on cache-resident operands (the compute ceiling)."""
    kernels = [("q4_1", "fast", True), ("q8_0", "fast", True), ("f32", "exact", False)]
    prog = Progress("ceiling", len(s.threads) + len(kernels))
    bw = []
    stream: list[dict[str, Any]] = []
    for nt in s.threads:
        r = s.bandwidth(nt, repeats=3 if s.quick else 10)
        bw.append({"threads": nt, "median_gbps": r["median_gbps"], "best_gbps": r["best_gbps"],
                   "gbps_samples": r["gbps"], "n_bytes": r["n_bytes"], "isa": r["isa"]})
        prog.step(f"read bandwidth, {nt} thread(s)")
        for kernel in ("copy", "triad"):
            r = measure_stream_bandwidth(kernel, n_threads=nt, repeats=3 if s.quick else 10)
            stream.append({"kernel": kernel, "threads": nt, "median_gbps": r["median_gbps"],
                           "best_gbps": r["best_gbps"], "gbps_samples": r["gbps"], "n_bytes": r["n_bytes"]})
    # M=64 rows of activations against a 256 x 1024 weight matrix: W is 160-1024 KiB, held
    # in L2, so the kernel's arithmetic, not memory, sets the pace.
    m_rows, n, k = 64, 256, 1024
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m_rows, k)).astype(np.float32)
    wf = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    compute = []
    for name, mode, packed in kernels:
        t = TARGET_TYPES[name]
        raw = quants.quantize(wf, t)
        w = _C.repack(raw, int(t), n, k) if packed else raw
        y = _C.matmul(x, w, int(t), n, k, precision=mode, packed=packed)
        ref = x @ quants.dequantize(raw, t).reshape(n, k).T
        err = float(np.abs(y - ref).max() / np.abs(ref).max())
        if not err < 0.05:
            raise RuntimeError(f"ceiling: {name} matmul differs from NumPy by {err:.3g} (relative)")
        secs = _time_call(lambda w=w, t=t, mode=mode, packed=packed: _C.matmul(x, w, int(t), n, k, precision=mode,
                                                                                packed=packed, n_threads=1))
        gops = [2 * m_rows * n * k / sec / 1e9 for sec in secs]
        compute.append({"weights": name, "mode": mode, "layout": "packed16" if packed else "blocks",
                        "M": m_rows, "N": n, "K": k, "threads": 1, "gops": median(gops), "gops_samples": gops,
                        "arith": "int8 dot products" if mode == "fast" else "float32 FMA"})
        prog.step(f"matmul {name}")
    peak = int8_peak_gops()
    if peak is not None:
        for c in compute:
            if c["mode"] == "fast":
                c["pct_of_int8_peak"] = 100 * c["gops"] / peak["gops"]
    md = ["## Ceiling", "", "Memory read bandwidth (each thread sums its own slice with the widest loads; "
          "this is the ceiling decode is compared with, since decode reads its weights):", ""]
    md += table(["threads", "median GB/s", "best GB/s", "passes", "array MiB"],
                [[b["threads"], f"{b['median_gbps']:.1f}", f"{b['best_gbps']:.1f}", len(b["gbps_samples"]),
                  b["n_bytes"] >> 20] for b in bw])
    md += ["", "STREAM copy and triad (bytes read plus written per pass, STREAM's count):", ""]
    md += table(["kernel", "threads", "median GB/s", "best GB/s"],
                [[x["kernel"], x["threads"], f"{x['median_gbps']:.1f}", f"{x['best_gbps']:.1f}"] for x in stream])
    md += ["", "One core's matmul throughput on cache-resident operands "
           f"(x[{m_rows}, {k}] @ W[{n}, {k}]^T; 2 ops per multiply-add):", ""]
    md += table(["weights", "mode", "layout", "arithmetic", "GOP/s", "% of int8 peak"],
                [[c["weights"], c["mode"], c["layout"], c["arith"], f"{c['gops']:.1f}",
                  f"{c['pct_of_int8_peak']:.0f}%" if "pct_of_int8_peak" in c else "-"] for c in compute])
    if peak is not None:
        md += ["", f"int8 peak: the {peak['isa']} path's int8 multiply-add instruction issued back to back on 12 "
               f"independent accumulators (`pyinfer._C.int8_peak`), one core: {peak['gops']:.1f} GOP/s. No kernel "
               "can pass it; the fast kernels also spend issue slots on the float scaling of each 32-element block."]
    return {"study": "ceiling", "bandwidth": bw, "stream": stream, "compute": compute, "int8_peak": peak}, md


def int8_peak_gops() -> dict[str, Any] | None:
    """One core's int8 dot-product instruction rate (2 ops per multiply-add), median of five
    timings; None where the active ISA has no such instruction."""
    try:
        rates = [2 * _C.int8_peak(0.05) / 1e9 for _ in range(5)]
    except RuntimeError:
        return None
    return {"isa": _C.get_isa(), "gops": median(rates), "gops_samples": rates}


# -- decode roofline and formats ----------------------------------------------------------------


def roofline_formats(s: Settings) -> list[str]:
    return ["f16", "q8_0", "q4_1"] if s.quick and s.model.stat().st_size > 20e6 else list(TARGET_TYPES)


def _decode_sweep(s: Settings, models: dict[str, Model], *, start: int, n_steps: int, title: str,
                  key: str) -> list[dict[str, Any]]:
    """Decode tokens/s of each model at each thread count, alternating models and read-
    bandwidth passes within every repeat so all see the same machine."""
    prog = Progress(title, len(s.threads) * s.repeats * (len(models) + 1) + len(models))
    ctxs = {}
    for name, m in models.items():  # validate (finite logits) and warm up; fill the prompt
        ctx = m.context(n_ctx=start + n_steps + 1, n_batch=max(start, 1))
        ids = prompt_ids(m, max(start, 1))
        logits = ctx.eval(ids)
        if not np.isfinite(logits).all():
            raise RuntimeError(f"{title}: {name} gives non-finite logits")
        ctx.truncate(start)
        timed_decode(ctx, ids[0], min(4, n_steps))
        ctxs[name] = (ctx, ids[0])
        prog.step(f"warm up {name}")
    rows: list[dict[str, Any]] = []
    for nt in s.threads:
        samples: dict[str, list[float]] = {name: [] for name in models}
        bw: list[float] = []
        for _ in range(s.repeats):
            bw += s.bandwidth(nt, repeats=2)["gbps"]
            prog.step(f"bandwidth {nt}t")
            for name, m in models.items():
                m.n_threads = nt
                ctx, first = ctxs[name]
                samples[name].append(n_steps / timed_decode(ctx, first, n_steps))
                prog.step(f"{name} {nt}t")
        ceiling = median(bw)
        for name, m in models.items():
            rows.append(decode_row(m, samples[name], start=start, n_steps=n_steps, ceiling_gbps=ceiling,
                                   **{key: name, "threads": nt, "ceiling_gbps_samples": bw,
                                      "repacked_bytes": m.repacked_bytes}))
    return rows


def _roofline_md(rows: list[dict[str, Any]], key: str, label: str, llc_bytes: int | None) -> list[str]:
    return table([label, "threads", "MB/token (weights + KV)", "tok/s", "GB/s", "ceiling GB/s", "% of ceiling",
                  "tok/s at ceiling"],
                 [[r[key], r["threads"], f"{_fmt_mb(r['weight_bytes_per_token'])} + {_fmt_mb(r['kv_bytes_per_token'])}",
                   f"{r['tokens_per_s']:.1f}", f"{r['achieved_gbps']:.1f}", f"{r['ceiling_gbps']:.1f}",
                   f"{r['pct_of_ceiling']:.0f}%", f"{r['ceiling_gbps'] * GB / r['bytes_per_token']:.0f}"]
                  for r in rows]) + cache_note(rows, llc_bytes)


def study_roofline(s: Settings) -> Report:
    """Decode tokens/s per weight format at each thread count against bytes read per token."""
    start, n_steps = (16, 8) if s.quick else (32, 32)
    # The file as given first (e.g. Q4_1 layers with a Q8_0 head), then every derived format.
    models = {"as stored": Model.load(s.model, n_threads=max(s.threads))}
    for fmt in roofline_formats(s):
        models[fmt] = Model.load(ensure_derived(s.model, fmt), n_threads=max(s.threads))
    rows = _decode_sweep(s, models, start=start, n_steps=n_steps, title="roofline", key="format")
    del models
    md = ["## Decode roofline", "",
          f"Decode from position {start}, {n_steps} steps, median of {s.repeats}; bytes per token = weights "
          "read by one step + the mean KV cache it reads; the ceiling is the read bandwidth measured "
          "between the decode runs at the same thread count.", ""]
    return {"study": "roofline", "rows": rows}, md + _roofline_md(rows, "format", "format", s.llc_bytes)


def study_formats(s: Settings) -> Report:
    """The model in every format `pyinfer quantize` writes: sizes, bytes per token, and how
    far each format's logits move from the source's."""
    fmts = list(TARGET_TYPES)
    prog = Progress("formats", len(fmts) + 1)
    src = Model.load(s.model, precision="exact", n_ctx=64)
    ids = prompt_ids(src, 16)
    ref = src.logits(ids)
    prog.step("source logits")
    rows: list[dict[str, Any]] = []
    for fmt in fmts:
        t = time.perf_counter()
        path = ensure_derived(s.model, fmt)
        convert_s = time.perf_counter() - t
        t = time.perf_counter()
        m = Model.load(path, precision="exact", n_ctx=64)
        load_s = time.perf_counter() - t
        got = m.logits(ids)
        with GGUFReader(path) as r:
            types: dict[str, int] = {}
            for ti in r.tensors.values():
                types[ti.type.name] = types.get(ti.type.name, 0) + 1
        rows.append({"format": fmt, "path": str(path), "file_size": path.stat().st_size,
                     "weight_bytes_per_token": m.weight_bytes_per_token, "tensor_types": types,
                     "convert_s": convert_s, "load_s": load_s, "repacked_bytes": m.repacked_bytes,
                     "max_rel_logit_error": float(np.abs(got - ref).max() / np.abs(ref).max()),
                     "top1_agreement": float((got.argmax(1) == ref.argmax(1)).mean())})
        prog.step(fmt)
    md = ["## Formats", "", f"`pyinfer quantize` of {s.model.name} into each format (norms stay F32); "
          "logits of a 16-token prompt on the exact path against the source's:", ""]
    md += table(["format", "file MB", "weights MB/token", "max logit error (relative)", "top-1 agreement",
                 "load s"],
                [[r["format"], _fmt_mb(r["file_size"]), _fmt_mb(r["weight_bytes_per_token"]),
                  f"{r['max_rel_logit_error']:.2e}", f"{r['top1_agreement']:.0%}", f"{r['load_s']:.2f}"]
                 for r in rows])
    return {"study": "formats", "source": str(s.model), "rows": rows}, md


# -- context -------------------------------------------------------------------------------


def study_context(s: Settings) -> Report:
    """Decode tokens/s against the context length for each KV-cache type: the KV cache read
    per step grows with the context until it rivals the weights."""
    n_steps = 8 if s.quick else 16
    probe = Model.load(s.model, n_ctx=64)
    top = 256 if s.quick else min(4096, probe.config.n_ctx_train)
    kinds = kv_dtypes_for(probe.config.head_dim)
    del probe
    points = [p for p in ([16, 64, 128, 256] if s.quick else [16, 128, 256, 512, 1024, 2048, 4096]) if p <= top]
    nt = max(s.threads)
    models = {kv: Model.load(s.model, n_threads=nt, n_ctx=top + n_steps + 1, kv_dtype=kv) for kv in kinds}
    ctxs = {kv: m.context() for kv, m in models.items()}
    prog = Progress("context", len(points) * (s.repeats * 3 + 1))
    rows: list[dict[str, Any]] = []
    for p in points:
        for kv, ctx in ctxs.items():  # extend each cache to p positions
            if ctx.n_past < p:
                ctx.eval(prompt_ids(models[kv], p - ctx.n_past, seed=p))
        prog.step(f"prefill to {p}")
        samples: dict[str, list[float]] = {kv: [] for kv in models}
        bw: list[float] = []
        for _ in range(s.repeats):
            bw += s.bandwidth(nt, repeats=2)["gbps"]
            prog.step(f"bandwidth at {p}")
            for kv, ctx in ctxs.items():
                samples[kv].append(n_steps / timed_decode(ctx, 1, n_steps))
                prog.step(f"{kv} at {p}")
        for kv, m in models.items():
            rows.append(decode_row(m, samples[kv], start=p, n_steps=n_steps, ceiling_gbps=median(bw),
                                   kv_dtype=kv, threads=nt, context=p,
                                   kv_bytes_per_position=kv_bytes_per_position(m), ceiling_gbps_samples=bw))
    md = ["## Context length", "", f"Decode tokens/s at {nt} thread(s), {n_steps} steps from each context length; "
          "KV MB/token is what one step reads of the cache.", ""]
    md += table(["KV type", "context", "weights MB", "KV MB", "tok/s", "GB/s", "% of ceiling"],
                [[r["kv_dtype"], r["context"], _fmt_mb(r["weight_bytes_per_token"]), _fmt_mb(r["kv_bytes_per_token"]),
                  f"{r['tokens_per_s']:.1f}", f"{r['achieved_gbps']:.1f}", f"{r['pct_of_ceiling']:.0f}%"]
                 for r in rows])
    md += cache_note(rows, s.llc_bytes)
    return {"study": "context", "rows": rows}, md


# -- batch ---------------------------------------------------------------------------------


# The AVX-512 fast kernels' arithmetic for one 32-element block of one activation row against
# 16 weight rows: 8 vpdpbusd, and the multiplies that scale the block's integer sums (d_w * d_a,
# then times the sum; the types with a minimum add m_w * d_a * sum(a); Q6_K first multiplies
# its two 16-element sums by their int8 scales). The multiplies issue on the pipes the dot
# products use, a slot each (Zen 4: one vmulps per four vpdpbusd cuts their rate by a fifth),
# so a multiply-add costs 10/8 to 12/8 of a dot-product slot. Unpacking is not counted: with
# many rows a group's columns are unpacked once for all of them.
INT8_SLOTS = {GGMLType.Q8_0: 10 / 8, GGMLType.Q4_0: 10 / 8, GGMLType.Q4_1: 11 / 8,
              GGMLType.Q5_0: 10 / 8, GGMLType.Q5_1: 11 / 8, GGMLType.Q4_K: 11 / 8,
              GGMLType.Q5_K: 11 / 8, GGMLType.Q6_K: 12 / 8}


def int8_slots_per_token(r: GGUFReader) -> float | None:
    """Dot-product issue slots, in multiply-adds, of one token's matmuls on the fast path (every
    layer matrix and the output head, the embedding table when tied); None if a matrix is of a
    type the int8 kernels do not take."""
    head = r.tensors.get("output.weight") or r.tensors.get("token_embd.weight")
    mats = [t for name, t in r.tensors.items() if name.startswith("blk.") and len(t.shape) == 2]
    total = 0.0
    for t in mats + ([head] if head is not None else []):
        if t.type not in INT8_SLOTS:
            return None
        total += t.n_elements * INT8_SLOTS[t.type]
    return total


def batch_ceilings(s: Settings, m: Model, nt: int, kv: float) -> dict[str, Any]:
    """What B sequences could reach at most: memory (B tokens per read of the weights, plus
    each sequence's KV cache) and, where the model's matrices all take the int8 kernels on the
    AVX-512 path, arithmetic (the int8 peak on nt cores over the slots a token takes)."""
    out: dict[str, Any] = {"threads": nt, "read_gbps": s.bandwidth(nt)["median_gbps"],
                           "weight_bytes_per_step": m.weight_bytes_per_token,
                           "kv_bytes_per_token": kv, "int8_tokens_per_s": None}
    slots = int8_slots_per_token(m.reader)
    peak = int8_peak_gops() if _C.get_isa() == "avx512" and slots is not None else None
    if peak is not None:
        out.update(int8_peak_gops_per_core=peak["gops"], int8_slots_per_token=slots,
                   int8_tokens_per_s=nt * peak["gops"] / 2 * 1e9 / slots)
    return out


def batch_ceiling(c: dict[str, Any], b: int) -> float:
    """Aggregate tokens/s bound at B sequences from batch_ceilings."""
    return min(batch_bounds(c, b).values())


def batch_bounds(c: dict[str, Any], b: int) -> dict[str, float]:
    """The bounds at B sequences: "memory" (tokens/s at the read bandwidth) and, where known,
    "int8" (the arithmetic's)."""
    out = {"memory": b * c["read_gbps"] * GB / (c["weight_bytes_per_step"] + b * c["kv_bytes_per_token"])}
    if c["int8_tokens_per_s"] is not None:
        out["int8"] = c["int8_tokens_per_s"]
    return out


def study_batch(s: Settings) -> Report:
    """B sequences decoding together: aggregate and per-sequence tokens/s. With the model's
    batched decode (Model.decode_batch: each weight read once per step for all B) beside the
    baseline of B contexts stepping in turn (each reads every weight again), alternating."""
    sizes = [1, 2, 4] if s.quick else [1, 2, 4, 8, 16, 32, 64]
    start, n_steps = 16, (4 if s.quick else 8)
    nt = max(s.threads)
    m = Model.load(s.model, n_threads=nt, n_ctx=start + n_steps + 1)
    batched = getattr(m, "decode_batch", None)  # absent in builds without batched decode
    modes = (["batched"] if batched is not None else []) + ["sequential"]
    ctxs = [m.context() for _ in range(max(sizes))]
    ids = prompt_ids(m, start)
    for c in ctxs:
        c.eval(ids)

    def step(mode: str, group: list[Any], toks: list[int]) -> list[int]:
        if mode == "batched":
            assert batched is not None
            return [int(t) for t in batched(group, toks).argmax(axis=1)]
        return [int(c.eval([tok]).argmax()) for c, tok in zip(group, toks)]

    if batched is not None:  # validate: one batched step gives each context's own greedy token
        probe = ctxs[:2]
        got = step("batched", probe, [1, 2])
        for c in probe:
            c.truncate(start)
        want = step("sequential", probe, [1, 2])
        for c in probe:
            c.truncate(start)
        if got != want:
            raise RuntimeError(f"batch: decode_batch gives {got}, one context at a time {want}")
    prog = Progress("batch", len(sizes) * s.repeats * len(modes))
    rows: list[dict[str, Any]] = []
    kv = kv_bytes_per_position(m) * (start + (n_steps + 1) / 2)
    w = m.weight_bytes_per_token
    for b in sizes:
        samples: dict[str, list[float]] = {mode: [] for mode in modes}
        for _ in range(s.repeats):
            for mode in modes:
                group, toks = ctxs[:b], [1] * b
                t = time.perf_counter()
                for _ in range(n_steps):
                    toks = step(mode, group, toks)
                samples[mode].append(b * n_steps / (time.perf_counter() - t))
                for c in group:
                    c.truncate(start)
                prog.step(f"B={b} {mode}")
        for mode in modes:
            agg = median(samples[mode])
            wt = w / b if mode == "batched" else w  # weights read per token generated
            rows.append({"batch": b, "mode": mode, "threads": nt, "aggregate_tokens_per_s": agg,
                         "per_sequence_tokens_per_s": agg / b, "aggregate_samples": samples[mode],
                         "weight_bytes_per_token": wt, "kv_bytes_per_token": kv,
                         "achieved_gbps": agg * (wt + kv) / GB})
    ceil = batch_ceilings(s, m, nt, kv)
    for r in rows:
        if r["mode"] == "batched":
            bounds = batch_bounds(ceil, r["batch"])
            r["ceiling_bound"] = min(bounds, key=lambda k: bounds[k])
            r["ceiling_tokens_per_s"] = bounds[r["ceiling_bound"]]
            r["pct_of_ceiling"] = 100 * r["aggregate_tokens_per_s"] / r["ceiling_tokens_per_s"]
    label = ("batched (Model.decode_batch) beside sequential (B contexts stepping in turn)" if batched is not None
             else "sequential only (B contexts stepping in turn; this build has no batched decode)")
    md = ["## Batch", "", f"Modes: {label}. {nt} thread(s), from position {start}, {n_steps} steps; "
          "GB/s counts weights once per step when batched.", ""]
    md += table(["B", "mode", "aggregate tok/s", "per-sequence tok/s", "MB read per token", "GB/s", "ceiling tok/s",
                 "% of ceiling"],
                [[r["batch"], r["mode"], f"{r['aggregate_tokens_per_s']:.1f}", f"{r['per_sequence_tokens_per_s']:.1f}",
                  _fmt_mb(r["weight_bytes_per_token"] + r["kv_bytes_per_token"]), f"{r['achieved_gbps']:.1f}",
                  f"{r['ceiling_tokens_per_s']:.0f}" if "ceiling_tokens_per_s" in r else "-",
                  f"{r['pct_of_ceiling']:.0f}%" if "pct_of_ceiling" in r else "-"] for r in rows])
    md += ["", f"Ceiling of B sequences: B tokens per read of the weights at the read bandwidth measured after "
           f"the runs ({ceil['read_gbps']:.1f} GB/s, {nt} thread(s)), each with its KV cache"]
    if ceil["int8_tokens_per_s"] is not None:
        md[-1] += (f", and at most {ceil['int8_tokens_per_s']:.0f} tok/s from arithmetic: the int8 peak "
                   f"({ceil['int8_peak_gops_per_core']:.0f} GOP/s per core) over the dot-product issue slots a token's "
                   f"matmuls take ({ceil['int8_slots_per_token'] / 1e6:.1f} M multiply-adds' worth: 8 dot steps and "
                   "2 to 4 multiplies per block of 32 and 16 weight rows)")
    md[-1] += "."
    base = next((r for r in rows if r["mode"] == modes[0] and r["batch"] == 1), None)
    big = next((r for r in rows if r["mode"] == modes[0] and r["batch"] == 16), None)
    if base is not None and big is not None:
        md += ["", f"B = 16: {big['aggregate_tokens_per_s'] / base['aggregate_tokens_per_s']:.2f}x one sequence "
               f"({modes[0]}); the ceiling at B = 16 is {batch_ceiling(ceil, 16) / batch_ceiling(ceil, 1):.2f}x the "
               "ceiling of one."]
    md += cache_note(rows, s.llc_bytes)
    return {"study": "batch", "mode": label, "modes": modes, "rows": rows, "ceilings": ceil}, md


# -- prefill / TTFT ------------------------------------------------------------------------


def prefill_ops(r: GGUFReader, n: int) -> float:
    """Operations (2 per multiply-add) of a prefill of n tokens: every layer matrix for each
    token, attention over the causal triangle, the output head for the last token only."""
    from pyinfer.arch import describe

    c = describe(r).config
    layer = sum(t.n_elements for name, t in r.tensors.items() if name.startswith("blk.") and len(t.shape) == 2)
    attn = c.n_layer * 2 * c.n_head * c.head_dim * n * (n + 1) / 2  # QK^T and AV
    return 2.0 * (layer * n + attn + c.n_vocab * c.n_embd)


def study_prefill(s: Settings) -> Report:
    """Prefill tokens/s, GOP/s and time to first token against the prompt length."""
    lengths = [16, 64, 128] if s.quick else [16, 32, 64, 128, 256, 512, 1024, 2048]
    nt = max(s.threads)
    m = Model.load(s.model, n_threads=nt, n_ctx=max(lengths) + 8)
    ctx = m.context()
    prog = Progress("prefill", len(lengths) * s.repeats + 1)
    ctx.eval(prompt_ids(m, 16))  # warm up
    prog.step("warm up")
    rows: list[dict[str, Any]] = []
    for n in lengths:
        ids = prompt_ids(m, n, seed=n)
        pre, ttft = [], []
        for _ in range(s.repeats):  # alternate the bare prefill with a whole request
            ctx.reset()
            t = time.perf_counter()
            ctx.eval(ids)
            pre.append(time.perf_counter() - t)
            c = m.generate(ids, max_tokens=1, temperature=0)
            ttft.append(float(c.timings.ttft_s or 0.0))
            prog.step(f"{n} tokens")
        ops = prefill_ops(m.reader, n)
        sec = median(pre)
        rows.append({"prompt_tokens": n, "threads": nt, "prefill_s": sec, "prefill_s_samples": pre,
                     "prefill_tokens_per_s": n / sec, "ops": ops, "gops": ops / sec / 1e9,
                     "ttft_s": median(ttft), "ttft_s_samples": ttft})
    md = ["## Prefill and time to first token", "", f"{nt} thread(s); TTFT is a whole Model.generate request "
          "with max_tokens=1 (prefill, first sampling, bookkeeping).", ""]
    md += table(["prompt tokens", "prefill tok/s", "GOP/s", "TTFT ms"],
                [[r["prompt_tokens"], f"{r['prefill_tokens_per_s']:.0f}", f"{r['gops']:.1f}",
                  f"{r['ttft_s'] * 1e3:.1f}"] for r in rows])
    return {"study": "prefill", "rows": rows}, md


# -- model size ----------------------------------------------------------------------------


def study_model_size(s: Settings) -> Report:
    """Decode on synthetic llama models of growing size beside the benchmarked model, all far
    past the cache, on one line: random Q4_1 weights (speed does not depend on the values) and
    llama.cpp's Q4_K_M mix (Q4_K, with Q6_K for the head and some attn_v and ffn_down)."""
    models: list[tuple[str, str, GGMLType | str]] = [(s.model.name, "", GGMLType.Q4_1)]
    if s.quick:
        models += [("tiny", "tiny", GGMLType.Q4_1), ("tiny q4_k_m", "tiny", "q4_k_m")]
    else:
        models += [(p, p, GGMLType.Q4_1) for p in ("0.5b", "1b", "3b")]
        models += [(f"{p} q4_k_m", p, "q4_k_m") for p in ("1b", "3b", "8b")]
    start, n_steps = (16, 8) if s.quick else (16, 16)
    rows: list[dict[str, Any]] = []
    for name, preset, kind in models:
        path = synthetic_model(preset, kind) if preset else s.model
        m = Model.load(path, n_threads=max(s.threads), n_ctx=start + n_steps + 1)  # one model at a time
        r = _decode_sweep(s, {name: m}, start=start, n_steps=n_steps, title=f"size {name}", key="model")
        for row in r:
            row["n_params"] = PRESETS[preset].n_params if preset else None
            row["synthetic"] = bool(preset)
            row["weights"] = (kind if isinstance(kind, str) else kind.name.lower()) if preset else "file"
        rows += r
        del m
    md = ["## Model size", "", "Synthetic llama-shaped models with random weights (speed does not depend on "
          "weight values), Q4_1 and llama.cpp's Q4_K_M mix, decoding beside the benchmarked model.", ""]
    return {"study": "model_size", "rows": rows}, md + _roofline_md(rows, "model", "model", s.llc_bytes)


# -- peers ---------------------------------------------------------------------------------


# The chat request of the time-to-first-token series: two turns, short as a typical first
# message, so the prompt's evaluation (not the reply) is what is timed.
CHAT = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Name three planets in our solar system."}]
# Start-up targets, pyinfer / llama-cpp-python: time to first token at most half, load no
# slower, resident memory (less the repacked weights) no larger.
STARTUP_TARGETS = {"ttft": 0.5, "load": 1.0, "rss_less_repacked": 1.0}
# The context both engines are built with for the load and memory series (llama-cpp-python's
# default): the KV cache it allocates is part of what each loads.
STARTUP_N_CTX = 512
# Tokens a first-token request may run to: it is closed at its first text.
TTFT_MAX_TOKENS = 16


def _startup(s: Settings, nt: int, names: list[str], reps: int, skipped: dict[str, str], prog: Progress
             ) -> dict[str, dict[str, Any]]:
    """Load-time and resident-memory measurements of the named engines at nt threads, each
    engine's load alternating with the others' (the file is in the page cache after the first)."""
    out: dict[str, dict[str, Any]] = {n: {"load_s_samples": []} for n in names}
    live = list(names)
    for i in range(reps + 1):
        for name in list(live):
            try:
                dt = load_seconds(name, s.model, nt, STARTUP_N_CTX)
            except Exception as ex:  # a peer that cannot load this model is reported, not fatal
                skipped[f"{name} start-up"] = f"{type(ex).__name__}: {ex}"[:300]
                live.remove(name)
                del out[name]
                continue
            if i > 0:  # the first load of each warms the page cache and one-time setup
                out[name]["load_s_samples"].append(dt)
        prog.step(f"load {nt}t")
    for name in live:
        out[name]["load_s"] = median(out[name]["load_s_samples"])
        try:
            out[name].update(resident_memory(name, s.model, nt, STARTUP_N_CTX, CHAT[-1]["content"]))
        except Exception as ex:
            skipped[f"{name} memory"] = f"{type(ex).__name__}: {ex}"[:300]
        prog.step(f"memory {name} {nt}t")
    return out


def _ttft(engines: list[Engine], nt: int, reps: int, skipped: dict[str, str], prog: Progress
          ) -> dict[str, list[float]]:
    """Time to first token of the CHAT request through each engine that streams chat,
    alternating engines within each repeat, after one untimed request each."""
    live = []
    for e in engines:
        if type(e).ttft is Engine.ttft:
            continue
        try:
            e.ttft(CHAT, TTFT_MAX_TOKENS)
            live.append(e)
        except Exception as ex:  # reported, not fatal: a reply that starts with end-of-turn, say
            skipped[f"{e.name} time to first token"] = f"{type(ex).__name__}: {ex}"[:300]
    out: dict[str, list[float]] = {e.name: [] for e in live}
    for _ in range(reps):
        for e in live:
            out[e.name].append(e.ttft(CHAT, TTFT_MAX_TOKENS))
        prog.step(f"first token {nt}t")
    return out


def _ratio_cell(x: dict[str, Any], key: str, target: float | None = None) -> str:
    if key not in x:
        return "-"
    return f"{x[key]:.2f}x" + ("" if target is None else " (met)" if x[key] <= target else " (missed)")


def study_peers(s: Settings) -> Report:
    """pp and tg through pyinfer and every peer available, alternating engines within each
    repeat; reported as pyinfer's speed over each peer's, measured side by side. pyinfer's
    exact mode (float32 activations and sums) runs beside them, against float32 transformers
    where that is there. Beside them, start-up against llama-cpp-python: load time, resident
    memory, time to first token."""
    pp, tg = (64, 16) if s.quick else (512, 128)
    makers, skipped = (peer_makers(s.llama_bench, s.openvino_python, s.model, max(s.threads)) if s.peers
                       else ([], {"all": "disabled"}))
    startup_names = ["pyinfer"] + [n for n, _ in makers if n in STARTUP_MODULES]
    load_reps, ttft_reps = (2, 2) if s.quick else (5, 7)
    prog = Progress("peers", len(s.threads) * (s.repeats * (len(makers) + 2) + len(makers) + 2
                                               + load_reps + 1 + len(startup_names) + ttft_reps))
    rows: list[dict[str, Any]] = []
    startup: list[dict[str, Any]] = []
    rng = np.random.default_rng(0)
    # Room for the chat request too (its prompt is longer than pp in quick mode on a
    # byte-level synthetic model); the size of the cache does not change pp or tg.
    n_ctx = max(pp + tg + 8, STARTUP_N_CTX)
    for nt in s.threads:
        # Before the engines below are built, so no loaded model shares the memory.
        measured = _startup(s, nt, startup_names, load_reps, skipped, prog)
        engine = PyinferEngine(s.model, nt, n_ctx)
        engines: list[Engine] = [engine]
        n_vocab = engine.model.n_vocab
        prompt = [int(t) for t in rng.integers(min(100, n_vocab // 4), n_vocab, pp)]
        for name, mk in makers:
            try:
                e = mk(s.model, nt, n_ctx)
                e.pp(prompt[:16])  # validate it runs, and warm up
                e.tg(prompt[0], 4)
                engines.append(e)
            except Exception as ex:  # a peer that cannot run this model is reported, not fatal
                skipped[name] = f"{type(ex).__name__}: {ex}"[:300]
            prog.step(f"load {name} {nt}t")
        engines[0].pp(prompt[:16])
        engines[0].tg(prompt[0], 4)
        prog.step("warm up pyinfer")
        exact_engine = PyinferEngine(s.model, nt, n_ctx, precision="exact")
        exact_engine.pp(prompt[:16])
        exact_engine.tg(prompt[0], 4)
        prog.step("warm up pyinfer exact")
        samples: dict[str, dict[str, list[float]]] = {e.name: {"pp": [], "tg": []} for e in [*engines, exact_engine]}
        gen: list[float] = []
        drafted = 0
        for _ in range(s.repeats):
            for e in [*engines, exact_engine]:
                samples[e.name]["pp"].append(e.pp(prompt))
                samples[e.name]["tg"].append(e.tg(prompt[0], tg))
                prog.step(f"{e.name} {nt}t")
            py = engines[0]
            assert isinstance(py, PyinferEngine)
            rate, tried = py.generate_rate(tg)
            gen.append(rate)
            drafted += tried
        for e in [*engines, exact_engine]:
            rows.append({"engine": e.name, "threads": nt, "pp": median(samples[e.name]["pp"]),
                         "tg": median(samples[e.name]["tg"]), "pp_samples": samples[e.name]["pp"],
                         "tg_samples": samples[e.name]["tg"], **getattr(e, "info", {})})
        del exact_engine
        bare = rows[-len(engines) - 1]["tg"]
        rows.append({"engine": "pyinfer generate()", "threads": nt, "tg": median(gen), "tg_samples": gen,
                     "loop_overhead": 1 - median(gen) / bare, "draft_tokens": drafted})
        first = _ttft(engines, nt, ttft_reps, skipped, prog)
        built = {e.name: e for e in engines}
        for name in [*measured, *(n for n in built if n not in measured)]:
            row = dict(measured.get(name, {}))
            once = getattr(built[name], "load_s", None)
            if name not in measured and once is not None:
                row = {"load_s": once, "load_s_samples": [once]}
            if name in first:
                row.update(ttft_s=median(first[name]), ttft_s_samples=first[name])
            if row:
                startup.append({"engine": name, "threads": nt, **row})
        del engines
    # pyinfer's prefill against the compute ceiling: operations per second per core over one
    # core's int8 instruction peak (the model's quantized matmuls run on int8 dot products).
    reader = GGUFReader(s.model)
    peak = int8_peak_gops() if int8_slots_per_token(reader) is not None else None
    ops = prefill_ops(reader, pp)
    for r in rows:
        if r["engine"] == "pyinfer":
            r["pp_gops_per_core"] = ops * r["pp"] / pp / 1e9 / r["threads"]
            if peak is not None:
                r["pp_pct_of_int8_peak"] = 100 * r["pp_gops_per_core"] / peak["gops"]
    ratios = []
    exact_ratios = []  # pyinfer's exact mode over float32 transformers
    for r in rows:
        base = next(x for x in rows if x["engine"] == "pyinfer" and x["threads"] == r["threads"])
        exact = next(x for x in rows if x["engine"] == "pyinfer exact" and x["threads"] == r["threads"])
        if r["engine"] not in ("pyinfer", "pyinfer generate()", "pyinfer exact"):
            ratios.append({"peer": r["engine"], "threads": r["threads"], "pp_ratio": base["pp"] / r["pp"],
                           "tg_ratio": base["tg"] / r["tg"]})
        if r["engine"] == "transformers":
            exact_ratios.append({"peer": r["engine"], "threads": r["threads"], "pp_ratio": exact["pp"] / r["pp"],
                                 "tg_ratio": exact["tg"] / r["tg"]})
    # Start-up ratios are pyinfer's time or memory over the peer's: below 1, pyinfer is
    # faster or smaller. Memory is also compared less the repacked weights, the copy pyinfer
    # makes on purpose (the rest of the file stays mapped).
    ours = {r["threads"]: r for r in startup if r["engine"] == "pyinfer"}
    startup_ratios = []
    for r in startup:
        mine = ours.get(r["threads"])
        if mine is None or r["engine"] == "pyinfer":
            continue
        x: dict[str, Any] = {"peer": r["engine"], "threads": r["threads"]}
        for key in ("load_s", "ttft_s", "rss_mb"):
            if key in r and key in mine:
                x[key.rsplit("_", 1)[0] + "_ratio"] = mine[key] / r[key]
        if "rss_mb" in r and "rss_mb" in mine:
            x["rss_less_repacked_ratio"] = (mine["rss_mb"] - mine.get("repacked_mb", 0.0)) / r["rss_mb"]
        startup_ratios.append(x)
    md = ["## Peers", "", f"pp{pp}: one {pp}-token prompt from an empty cache; tg{tg}: {tg} single-token steps. "
          "Engines alternate within each repeat; ratios are pyinfer's tokens/s over the peer's "
          "(above 1: pyinfer is faster).", ""]
    md += table(["engine", "threads", f"pp{pp} tok/s", f"tg{tg} tok/s"],
                [[r["engine"], r["threads"], f"{r['pp']:.0f}" if "pp" in r else "-", f"{r['tg']:.1f}"] for r in rows])
    md += [""] + [f"pyinfer's pp{pp} at {r['threads']} thread(s): {r['pp_gops_per_core']:.1f} GOP/s per core"
                   + (f" = {r['pp_pct_of_int8_peak']:.0f}% of the int8 peak ({peak['gops']:.1f} GOP/s per core, "
                      "as in the ceiling study)" if peak is not None else "") + "."
                   for r in rows if "pp_gops_per_core" in r]
    if ratios:
        md += [""] + table(
            ["peer", "threads", f"pp{pp} pyinfer / peer", f"tg{tg} pyinfer / peer"],
            [[x["peer"], x["threads"], f"{x['pp_ratio']:.2f}x", f"{x['tg_ratio']:.2f}x"] for x in ratios])
    md += [""] + [f"pyinfer exact (`precision=\"exact\"`: float32 activations and sums, the dequantized weights) "
                  f"over float32 transformers at {x['threads']} thread(s): pp{pp} {x['pp_ratio']:.2f}x, "
                  f"tg{tg} {x['tg_ratio']:.2f}x." for x in exact_ratios]
    md += ["", "### Start-up", "",
           f"Load: median of {load_reps} loads each (`Model.load(path, n_threads=t, n_ctx={STARTUP_N_CTX})`, "
           f"`Llama(model_path=path, n_threads=t, n_ctx={STARTUP_N_CTX}, verbose=False)`), engines alternating, "
           "after one untimed load each: the file is already in the page cache (a cold start adds the disk "
           "read to both). Transformers, if there, loaded once (dequantizing to float32). "
           "RSS: what a fresh process gains importing the engine, loading the model and evaluating a short "
           "prompt (VmRSS; the weights it maps and touches count as file-backed); pyinfer's repacked weights "
           "are part of it. First token: a system + user chat "
           f"(\"{CHAT[-1]['content']}\") rendered with each engine's own template, streamed at temperature 0, "
           "from the call to the first chunk with text, from an empty cache each time (llama-cpp-python: "
           f"`reset()` first, no prompt cache); median of {ttft_reps}.", ""]

    def cell(r: dict[str, Any], key: str, scale: float, fmt: str) -> str:
        return format(r[key] * scale, fmt) if key in r else "-"

    md += table(["engine", "threads", "load ms", "RSS MB", "anon + file MB", "repacked MB", "first token ms"],
                [[r["engine"], r["threads"], cell(r, "load_s", 1e3, ".1f"), cell(r, "rss_mb", 1, ".0f"),
                  f"{r['anon_mb']:.0f} + {r['file_mb']:.0f}" if "anon_mb" in r else "-",
                  cell(r, "repacked_mb", 1, ".1f"), cell(r, "ttft_s", 1e3, ".1f")] for r in startup])
    if startup_ratios:
        md += ["", "Pyinfer's time or memory over the peer's (below 1: pyinfer is faster or smaller); "
               f"targets against llama.cpp: load at most {STARTUP_TARGETS['load']:.0f}x, RSS less the repacked "
               f"weights at most {STARTUP_TARGETS['rss_less_repacked']:.0f}x, first token at most "
               f"{STARTUP_TARGETS['ttft']}x.", ""]
        md += table(["peer", "threads", "load", "RSS", "RSS less repacked", "first token"],
                    [[x["peer"], x["threads"]] + [
                        _ratio_cell(x, k, STARTUP_TARGETS[t] if x["peer"] == "llama.cpp" and t else None)
                        for k, t in (("load_ratio", "load"), ("rss_ratio", None),
                                     ("rss_less_repacked_ratio", "rss_less_repacked"), ("ttft_ratio", "ttft"))]
                     for x in startup_ratios])
    if skipped:
        md += [""] + [f"- {k} skipped: {v}" for k, v in skipped.items()]
    return {"study": "peers", "pp_tokens": pp, "tg_tokens": tg, "rows": rows, "ratios": ratios,
            "exact_ratios": exact_ratios, "int8_peak": peak,
            "startup": startup, "startup_ratios": startup_ratios,
            "startup_settings": {"n_ctx": STARTUP_N_CTX, "load_repeats": load_reps, "ttft_repeats": ttft_reps,
                                 "chat": CHAT, "ttft_max_tokens": TTFT_MAX_TOKENS,
                                 "memory_prompt": CHAT[-1]["content"],
                                 "page_cache": "warm", "targets": STARTUP_TARGETS},
            "skipped": skipped}, md


STUDIES = {
    "ceiling": study_ceiling,
    "roofline": study_roofline,
    "formats": study_formats,
    "context": study_context,
    "batch": study_batch,
    "contention": study_contention,
    "prefill": study_prefill,
    "model_size": study_model_size,
    "peers": study_peers,
    "speculative": study_speculative,
    "serve": study_serve,
}
