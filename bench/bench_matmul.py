"""Matmul throughput: the decode GEMV against the machine's read bandwidth, and prefill GEMM.

Per weight type, a GEMV (M = 1, fast mode) over a weight matrix of --mib MiB (default 128:
four times a 32 MiB L3, so every call streams W from DRAM), on 1 and 2 threads, in GB/s of
weights read and as a fraction of pyinfer.measure_read_bandwidth measured in the same run
with the same thread count, its passes alternating with the GEMV calls; the int8 types (Q8_0,
Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) both as stored in GGUF ("blocks") and in the 16-row
interleaved layout of _C.repack ("packed16"; Q5_0, Q5_1 and the K-quants in that layout only,
the one their SIMD kernels take). Then GEMM GOP/s (2*M*N*K per call) at M = 16, 64, 512 for Q4_1 and Q8_0 in
fast mode, in both layouts. Each kernel is validated against pyinfer.reference before it is
timed, runs once to warm up, and reports the median of --repeats calls.

    python bench/bench_matmul.py [--threads 1 2] [--repeats 9] [--mib 128] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np

import pyinfer
from pyinfer import _C, quants
from pyinfer import reference as R

TYPES = {"q4_1": 3, "q8_0": 8, "q4_0": 2, "q5_0": 6, "q5_1": 7, "q4_k": 12, "q5_k": 13, "q6_k": 14,
         "f16": 1, "bf16": 30, "f32": 0}
BLOCK = {3: (32, 20), 8: (32, 34), 2: (32, 18), 6: (32, 22), 7: (32, 24), 12: (256, 144), 13: (256, 176),
         14: (256, 210), 1: (1, 2), 30: (1, 2), 0: (1, 4)}
EPS = float(np.finfo(np.float32).eps)
PACKABLE = {3, 8, 2, 6, 7, 12, 13, 14}
SIMD_BLOCKS = {3, 8, 2}  # the packable types with SIMD kernels on blocks as stored too


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def weights(w_type: int, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Raw bytes of W[n, k]: 256 random rows quantized, repeated to n rows (the GEMV only has
    to stream distinct memory; building 128 MiB of distinct quantized rows takes minutes)."""
    rng = np.random.default_rng(seed)
    tile_rows = min(n, 256)
    tile = quants.quantize(rng.standard_normal((tile_rows, k)).astype(np.float32), w_type)
    row_bytes = k // BLOCK[w_type][0] * BLOCK[w_type][1]
    tile = tile.reshape(tile_rows, row_bytes)
    reps = -(-n // tile_rows)
    return np.ascontiguousarray(np.tile(tile, (reps, 1))[:n]).reshape(-1)


def validate(x: np.ndarray, raw: np.ndarray, w_type: int, n: int, k: int, n_threads: int) -> None:
    """The first 256 rows against the NumPy reference, and the whole call against 1 thread."""
    rows = min(n, 256)
    row_bytes = raw.size // n
    y = _C.matmul(x, raw[: rows * row_bytes], w_type, rows, k, precision="fast")
    if w_type in (0, 1, 30):
        ref = R.matmul_exact(x, raw[: rows * row_bytes], w_type, rows, k)
        wd = quants.dequantize(raw[: rows * row_bytes], w_type).reshape(rows, k)
        bound = k * EPS * (np.abs(x).astype(np.float64) @ np.abs(wd.astype(np.float64)).T)
    else:
        ref, mag = R.matmul_fast_parts(x, raw[: rows * row_bytes], w_type, rows, k)
        bound = 2 * (k // 32 + 16) * EPS * mag
    if not np.all(np.abs(y - ref) <= bound):
        raise SystemExit(f"validation failed for type {w_type}: max error {np.abs(y - ref).max():.3g}")
    if n_threads > 1:
        y1 = _C.matmul(x, raw, w_type, n, k, precision="fast", n_threads=1)
        yt = _C.matmul(x, raw, w_type, n, k, precision="fast", n_threads=n_threads)
        if not np.array_equal(y1, yt):
            raise SystemExit(f"type {w_type}: {n_threads} threads differ from 1 thread")


def check_packed(x: np.ndarray, raw: np.ndarray, packed: np.ndarray, w_type: int, n: int, k: int,
                 n_threads: int) -> None:
    """The packed layout round-trips and gives the same bits as the scalar kernel on blocks."""
    if not np.array_equal(_C.unpack(packed, w_type, n, k), raw):
        raise SystemExit(f"type {w_type}: repack does not round-trip")
    isa = _C.get_isa()
    _C.set_isa("scalar")
    try:
        want = _C.matmul(x, raw, w_type, n, k, precision="fast")
    finally:
        _C.set_isa(isa)
    if not np.array_equal(_C.matmul(x, packed, w_type, n, k, precision="fast", packed=True, n_threads=n_threads), want):
        raise SystemExit(f"type {w_type}: packed result differs from the scalar reference kernel")


def time_matmul(repeats: int, *args, **kwargs) -> list[float]:
    """Seconds per _C.matmul(*args, **kwargs) call, after one warm-up call."""
    _C.matmul(*args, **kwargs)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _C.matmul(*args, **kwargs)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--mib", type=int, default=128, help="GEMV weight size in MiB")
    ap.add_argument("--k", type=int, default=2048, help="GEMV row length")
    ap.add_argument("--types", nargs="+", default=list(TYPES))
    ap.add_argument("--gemm-m", type=int, nargs="+", default=[16, 64, 512])
    ap.add_argument("--no-gemm", action="store_true")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    k = args.k
    print(f"ISA {_C.get_isa()}, GEMV K={k}, ~{args.mib} MiB of weights per type")

    gemv = []
    for tname in args.types:
        w_type = TYPES[tname]
        row_bytes = k // BLOCK[w_type][0] * BLOCK[w_type][1]
        n = (args.mib << 20) // row_bytes
        raw = weights(w_type, n, k)
        x = rng.standard_normal((1, k)).astype(np.float32)
        out = np.empty((1, n), np.float32)
        packed = _C.repack(raw, w_type, n, k) if w_type in PACKABLE else None
        for t in dict.fromkeys(args.threads):
            validate(x, raw, w_type, n, k, t)
            if packed is not None:
                check_packed(x, raw, packed, w_type, n, k, t)
            # Q5_0, Q5_1 and the K-quants have SIMD kernels in the packed layout only.
            blocks = [("blocks", raw, False)] if w_type not in PACKABLE or w_type in SIMD_BLOCKS else []
            layouts = blocks + ([("packed16", packed, True)] if packed is not None else [])
            # The probe's passes and the GEMV calls alternate, so a neighbour's load on this
            # shared machine falls on both alike instead of on whichever ran during it.
            probe_gbps: list[float] = []
            secs: dict[str, list[float]] = {layout: [] for layout, _, _ in layouts}
            for layout, w, is_packed in layouts:  # warm-up
                _C.matmul(x, w, w_type, n, k, precision="fast", n_threads=t, out=out, packed=is_packed)
            for _ in range(args.repeats):
                probe_gbps += pyinfer.measure_read_bandwidth(512 << 20, n_threads=t, repeats=1)["gbps"]
                for layout, w, is_packed in layouts:
                    t0 = time.perf_counter()
                    _C.matmul(x, w, w_type, n, k, precision="fast", n_threads=t, out=out, packed=is_packed)
                    secs[layout].append(time.perf_counter() - t0)
            probe = statistics.median(probe_gbps)
            for layout, _, _ in layouts:
                gbps = raw.nbytes / statistics.median(secs[layout]) / 1e9
                r = {"type": tname, "layout": layout, "n": n, "k": k, "bytes": int(raw.nbytes), "threads": t,
                     "seconds": secs[layout], "gbps": gbps, "probe_gbps": probe, "probe_samples": probe_gbps,
                     "fraction": gbps / probe}
                gemv.append(r)
                print(f"GEMV {tname:5s} {layout:8s} {t} thr: {gbps:5.1f} GB/s, probe "
                      f"{probe:5.1f} GB/s -> {100 * r['fraction']:5.1f}%")
        del raw, packed

    gemm = []
    if not args.no_gemm:
        gn, gk = 2048, 2048
        for tname in ("q4_1", "q8_0"):
            w_type = TYPES[tname]
            raw = weights(w_type, gn, gk, seed=2)
            packed = _C.repack(raw, w_type, gn, gk)
            for m in args.gemm_m:
                x = rng.standard_normal((m, gk)).astype(np.float32)
                for t in dict.fromkeys(args.threads):
                    validate(x[:4], raw, w_type, gn, gk, t)
                    check_packed(x[:4], raw, packed, w_type, gn, gk, t)
                    for layout, w, is_packed in [("blocks", raw, False), ("packed16", packed, True)]:
                        secs = time_matmul(max(3, args.repeats // 2), x, w, w_type, gn, gk, precision="fast",
                                           n_threads=t, packed=is_packed)
                        gops = 2 * m * gn * gk / statistics.median(secs) / 1e9
                        gemm.append({"type": tname, "layout": layout, "m": m, "n": gn, "k": gk, "threads": t,
                                     "seconds": secs, "gops": gops})
                        print(f"GEMM {tname:5s} {layout:8s} M={m:4d} {t} thr: {gops:6.1f} GOP/s")

    report = {
        "study": "matmul",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count()},
        "cpu": pyinfer.cpu_info(),
        "pyinfer": pyinfer.__version__,
        "commit": _commit(),
        "gemv": gemv,
        "gemm": gemm,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"matmul-{stamp}.json").write_text(json.dumps(report, indent=1))
    md = ["| GEMV type | layout | threads | GB/s | probe GB/s | % of probe |",
          "| --- | --- | --- | --- | --- | --- |"]
    md += [f"| {r['type']} | {r['layout']} | {r['threads']} | {r['gbps']:.1f} | {r['probe_gbps']:.1f} "
           f"| {100 * r['fraction']:.0f}% |" for r in gemv]
    md += ["", "| GEMM type | layout | M | threads | GOP/s |", "| --- | --- | --- | --- | --- |"]
    md += [f"| {r['type']} | {r['layout']} | {r['m']} | {r['threads']} | {r['gops']:.1f} |" for r in gemm]
    (args.out / f"matmul-{stamp}.md").write_text("\n".join(md) + "\n")
    print(f"wrote {args.out}/matmul-{stamp}.json and .md")


if __name__ == "__main__":
    main()
