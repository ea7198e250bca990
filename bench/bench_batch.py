"""Batched decode: aggregate tokens/s of B sequences advanced together by Model.decode_batch.

Each sequence gets its own context and a prompt of a different length (so positions differ),
then --steps decode steps of one token per sequence, greedy, all B in one forward pass per
step. The baseline is one sequence decoded by Context.eval in the same run. Decode reads every
weight once per step whatever B is, so the aggregate rate grows with B until the int8 dot
products, not memory, bound the step: the prefill rate (pp512) is that compute roof, and it
is printed beside the table.

    python bench/bench_batch.py [--threads 1 2] [--batch 1 2 4 8 16 32] [--steps 32] [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from pyinfer.model import Model
from pyinfer.registry import resolve_model

PROMPT = 16


def single_rate(model: Model, steps: int) -> float:
    ctx = model.context(n_ctx=PROMPT + steps + 8)
    ctx.eval(list(range(100, 100 + PROMPT)))
    tok, t = 1, time.perf_counter()
    for _ in range(steps):
        tok = int(ctx.eval([tok]).argmax())
    return steps / (time.perf_counter() - t)


def batch_rate(model: Model, b: int, steps: int) -> float:
    ctxs = [model.context(n_ctx=PROMPT + b + steps + 8) for _ in range(b)]
    for i, c in enumerate(ctxs):  # prompts of different lengths: every sequence at its own position
        c.eval(list(range(100 + i, 100 + i + PROMPT + i % 8)))
    toks = np.ones(b, np.int64)
    model.decode_batch(ctxs, toks)  # warm-up step
    t = time.perf_counter()
    for _ in range(steps):
        toks = model.decode_batch(ctxs, toks).argmax(axis=1)
    return b * steps / (time.perf_counter() - t)


def prefill_rate(model: Model) -> float:
    ctx = model.context(n_ctx=520)
    ids = list(np.random.default_rng(0).integers(100, 40000, 512))
    ctx.eval(ids[:64])
    ctx.reset()
    t = time.perf_counter()
    ctx.eval(ids)
    return 512 / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    path = resolve_model(args.model)
    results = []
    for nt in args.threads:
        model = Model.load(path, n_threads=nt)
        single_rate(model, 8)  # warm-up
        base = single_rate(model, args.steps)
        pp = prefill_rate(model)
        print(f"{nt} thread(s): one sequence {base:.1f} tok/s; prefill (the compute roof) {pp:.1f} tok/s")
        print("    B   aggregate tok/s   per sequence   x one sequence")
        for b in args.batch:
            r = batch_rate(model, b, args.steps)
            results.append({"threads": nt, "batch": b, "tok_s": r, "single_tok_s": base, "pp512_tok_s": pp})
            print(f"  {b:3d}   {r:15.1f}   {r / b:12.1f}   {r / base:14.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
