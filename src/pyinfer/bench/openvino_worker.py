"""OpenVINO GenAI as a bench peer, run by another interpreter (one with `openvino-genai`
installed, never a pyinfer dependency): `python openvino_worker.py MODEL.gguf N_THREADS`.

It builds `openvino_genai.LLMPipeline(MODEL, "CPU", INFERENCE_NUM_THREADS=N_THREADS)` (which
reads the GGUF file itself), writes one JSON line {"ready": load seconds, "version": ...}, then
answers one JSON request per input line, each with one JSON line:

    {"op": "pp", "ids": [...]}          -> {"tok_s": len(ids) / seconds to the first token}
    {"op": "tg", "first": id, "n": n}   -> {"tok_s": n / seconds for n greedy tokens after id}

and {"error": "..."} for a request it cannot serve. This file imports nothing from pyinfer."""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    import numpy as np
    import openvino as ov
    import openvino_genai as og

    path, n_threads = sys.argv[1], int(sys.argv[2])
    t = time.perf_counter()
    pipe = og.LLMPipeline(path, "CPU", INFERENCE_NUM_THREADS=n_threads)
    ready = {"ready": time.perf_counter() - t, "version": og.__version__,
             "precision": str(ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT"))}
    print(json.dumps(ready), flush=True)

    def inputs(ids: list[int]):
        a = np.asarray(ids, dtype=np.int64).reshape(1, -1)
        return og.TokenizedInputs(ov.Tensor(a), ov.Tensor(np.ones_like(a)))

    def config(n: int):
        c = og.GenerationConfig()
        c.max_new_tokens = c.min_new_tokens = n
        c.ignore_eos = True
        c.do_sample = False
        return c

    for line in sys.stdin:
        out: dict[str, object]
        try:
            req = json.loads(line)
            if req["op"] == "pp":
                x, cfg = inputs(req["ids"]), config(1)
                t = time.perf_counter()
                pipe.generate(x, cfg)
                out = {"tok_s": len(req["ids"]) / (time.perf_counter() - t)}
            elif req["op"] == "tg":
                x, cfg = inputs([req["first"]]), config(req["n"])
                t = time.perf_counter()
                pipe.generate(x, cfg)
                out = {"tok_s": req["n"] / (time.perf_counter() - t)}
            else:
                out = {"error": f"unknown op {req['op']!r}"}
        except Exception as e:  # reported to the bench, which skips this peer
            out = {"error": f"{type(e).__name__}: {e}"[:500]}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
