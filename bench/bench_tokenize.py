"""Tokenization throughput (MB/s, one thread) of pyinfer beside llama.cpp and transformers.

The text mixes English prose, Python source and Chinese/Japanese: the 41 reference texts
of ../shared/reference/tok_shared.json joined and repeated to about 1 MB. Each tokenizer
is checked against llama.cpp's ids on that text, warmed up, then timed over several runs;
the median is reported. Peers are measured only when importable (install them outside
the project, e.g. in a separate venv together with pyinfer):

    python bench/bench_tokenize.py [--model PATH] [--runs 7] [--json out.json]
"""

from __future__ import annotations

import os

# One thread for everyone, set before any peer library starts its pools.
for _var in ("OMP_NUM_THREADS", "RAYON_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

# shared/ lies beside the repository
REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "tok_shared.json"


def bench_text(target_bytes: int, reference: Path) -> str:
    cases = json.loads(reference.read_text(encoding="utf-8"))["cases"]
    base = "\n".join(c["text"] for c in cases)
    reps = -(-target_bytes // len(base.encode("utf-8")))
    return "\n".join([base] * reps)


def median_seconds(
    fn: Callable[[], object], runs: int, before: Callable[[], None] | None = None
) -> float:
    times = []
    for _ in range(runs):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _agreement(ids: list[int], ref: list[int]) -> str:
    if ids == ref:
        return "= llama.cpp"
    k = next((i for i, (a, b) in enumerate(zip(ids, ref)) if a != b), min(len(ids), len(ref)))
    return f"differs from llama.cpp from id {k} of {len(ref)} on"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF path or known model name (default model)")
    ap.add_argument("--mb", type=float, default=1.0, help="size of the text in MB (default 1)")
    ap.add_argument("--runs", type=int, default=7, help="timed runs per tokenizer (median)")
    ap.add_argument("--reference", type=Path, default=REFERENCE, help="tok_shared.json")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core: no helper threads

    from pyinfer.registry import resolve_model
    from pyinfer.tokenizer import Tokenizer

    path = resolve_model(args.model)
    text = bench_text(int(args.mb * 1e6), args.reference)
    data = text.encode("utf-8")
    nbytes = len(data)
    print(
        f"model: {path.name}\ntext: {nbytes / 1e6:.2f} MB (English, Python, CJK), "
        f"{args.runs} runs, median, one thread\n"
    )

    tok = Tokenizer.load(path)
    ids = tok.tokenize(text)
    if tok.detokenize(ids) != data:
        print("pyinfer: detokenize(tokenize(text)) != text", file=sys.stderr)
        return 1

    results: dict[str, dict] = {}

    def record(name: str, seconds: float, agree: str | None) -> None:
        results[name] = {"mb_per_s": nbytes / seconds / 1e6, "seconds": seconds, "ids": agree}

    # pyinfer: its per-word cache cleared before every run, so each run starts cold (the
    # warm figure, cache kept from the previous run, is reported beside it).
    record(
        "pyinfer",
        median_seconds(lambda: tok.tokenize(text), args.runs, before=tok.clear_cache),
        None,
    )
    tok.tokenize(text)
    record("pyinfer (warm cache)", median_seconds(lambda: tok.tokenize(text), args.runs), None)
    # With the cache off every word goes through the merge loop: the floor for new text.
    limit, tok._bpe.cache_limit = tok._bpe.cache_limit, 0
    record(
        "pyinfer (no cache)",
        median_seconds(lambda: tok.tokenize(text), max(1, args.runs // 2), before=tok.clear_cache),
        None,
    )
    tok._bpe.cache_limit = limit

    try:
        from llama_cpp import Llama
    except ImportError:
        print("llama.cpp: llama_cpp (llama-cpp-python) not importable, skipped")
    else:
        llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
        ref = llm.tokenize(data, add_bos=False, special=False)
        if ref != ids:
            print(f"pyinfer {_agreement(ids, ref)}", file=sys.stderr)
            return 1
        for r in results.values():
            r["ids"] = "= llama.cpp"
        record(
            "llama.cpp",
            median_seconds(
                lambda: llm.tokenize(text.encode("utf-8"), add_bos=False, special=False), args.runs
            ),
            "reference",
        )

    try:
        import transformers
        from transformers import AutoTokenizer
    except ImportError:
        print("transformers: not importable, skipped")
    else:
        transformers.logging.set_verbosity_error()
        hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        agree = _agreement(hf.encode(text, add_special_tokens=False), ids)
        record(
            "transformers",
            median_seconds(lambda: hf.encode(text, add_special_tokens=False), args.runs),
            agree,
        )

    peers = [p for p in ("llama.cpp", "transformers") if p in results]
    print(f"{'tokenizer':<22} {'MB/s':>8}" + "".join(f" {'/ ' + p:>15}" for p in peers) + "  ids")
    for name, r in results.items():
        ratios = "".join(f" {r['mb_per_s'] / results[p]['mb_per_s']:>14.2f}x" for p in peers)
        print(f"{name:<22} {r['mb_per_s']:>8.2f}{ratios}  {r['ids'] or ''}")
    print(
        "\npyinfer: word cache emptied before each run (repeats within the text still hit it);"
        "\n  warm cache: kept from the previous run; no cache: every word goes through BPE."
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"text_bytes": nbytes, "runs": args.runs, "results": results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
