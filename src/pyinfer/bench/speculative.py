"""The `speculative` study: decode with prompt-lookup drafts (Model.generate(draft=8)) beside
plain decode (draft=0) on chat requests of two kinds: tasks grounded in their input (copy,
correct, rename, extend: the reply repeats runs of the prompt), where drafts should pay, and
open questions, where they should cost nothing. Greedy, the two alternating per request;
each pair's outputs must be identical (the study fails otherwise)."""

from __future__ import annotations

import math
from typing import Any

from pyinfer.bench.common import Progress, Settings, median, table
from pyinfer.model import Model

Report = tuple[dict[str, Any], list[str]]

GROUNDED = {
    "correct spelling": (
        "Correct the spelling mistakes in this paragraph and write it out again in full:\n\n"
        "The libary will be closd on monday for the instalation of new shelfs. Books that are due that "
        "day can be returend on tuesday without a fine. We apologise for any inconvenence and thank you "
        "for your patiense."
    ),
    "rename in code": (
        "In the following Python code, rename the function `area` to `rectangle_area` and give back the "
        "whole code:\n\n```python\ndef area(width, height):\n    \"\"\"Return the area of a rectangle.\"\"\"\n"
        "    if width < 0 or height < 0:\n        raise ValueError(\"negative size\")\n    return width * height\n"
        "\n\nprint(area(3, 4))\nprint(area(10, 2))\n```"
    ),
    "quote and extend": (
        "Here is a short notice:\n\nVisitors must sign in at the front desk, wear the badge they are given "
        "at all times, and return it when they leave. Children under twelve must be accompanied by an "
        "adult.\n\nCopy the notice word for word, then add one sentence saying that the rules apply to "
        "contractors as well."
    ),
    "reformat a list": (
        "Rewrite this shopping list with one item per line, each line starting with a dash:\n\n"
        "two loaves of brown bread, a dozen eggs, a bag of rice, three tins of tomatoes, a jar of honey, "
        "a bottle of olive oil, a box of tea"
    ),
}
OPEN = {
    "story": "Tell me a short story about a dragon who learns to bake bread.",
    "facts": "Give me three facts about the Moon.",
}


def study_speculative(s: Settings) -> Report:
    """Decode tokens/s with and without drafts, per request, at the top thread count."""
    nt = max(s.threads)
    max_tokens = 32 if s.quick else 128
    m = Model.load(s.model, n_threads=nt, n_ctx=2048, precision="fast")
    prompts = [("grounded", k, v) for k, v in GROUNDED.items()] + [("open", k, v) for k, v in OPEN.items()]
    if s.quick:
        prompts = [prompts[0], prompts[-1]]
    prog = Progress("speculative", len(prompts) * s.repeats * 2)
    rows: list[dict[str, Any]] = []
    for kind, name, text in prompts:
        msgs = [{"role": "user", "content": text}]
        m.chat(msgs, max_tokens=4, temperature=0)  # warm the context pool and the template
        samples: dict[int, list[float]] = {0: [], 8: []}
        outs: dict[int, Any] = {}
        for _ in range(s.repeats):
            for draft in (0, 8):
                c = m.chat(msgs, max_tokens=max_tokens, temperature=0, draft=draft)
                samples[draft].append(c.timings.decode_tokens_per_s)
                if draft in outs and outs[draft].token_ids != c.token_ids:
                    raise RuntimeError(f"speculative: {name!r} gave different tokens on a repeat")
                outs[draft] = c
                prog.step(f"{name} draft={draft}")
        if outs[8].token_ids != outs[0].token_ids:
            raise RuntimeError(f"speculative: {name!r} with drafts gives other tokens than without")
        t = outs[8].timings
        plain, drafted = median(samples[0]), median(samples[8])
        rows.append({"kind": kind, "request": name, "tokens": len(outs[0].token_ids),
                     "plain_tokens_per_s": plain, "draft_tokens_per_s": drafted,
                     "speedup": drafted / plain if plain else None,
                     "draft_tokens": t.draft_tokens, "draft_accepted": t.draft_accepted,
                     "accepted_per_generated": t.draft_accepted / max(1, len(outs[8].token_ids)),
                     "plain_samples": samples[0], "draft_samples": samples[8]})
    summary = {}
    for kind in ("grounded", "open"):
        ups = [r["speedup"] for r in rows if r["kind"] == kind and r["speedup"]]
        if ups:
            summary[kind] = math.exp(sum(map(math.log, ups)) / len(ups))
    md = ["## Speculative decoding (prompt lookup)", "",
          f"Chat requests, greedy, {max_tokens} tokens at most, {nt} thread(s), precision fast: decode tokens/s "
          f"(median of {s.repeats}) with up to 8 drafted tokens per pass (`draft=8`, the default) and without "
          "(`draft=0`); the outputs of the two are identical. Accepted: drafted tokens kept, per token generated.",
          ""]
    md += table(["kind", "request", "tokens", "plain tok/s", "drafts tok/s", "speed-up", "drafted", "kept",
                 "kept / generated"],
                [[r["kind"], r["request"], r["tokens"], f"{r['plain_tokens_per_s']:.1f}",
                  f"{r['draft_tokens_per_s']:.1f}", "-" if r["speedup"] is None else f"{r['speedup']:.2f}x",
                  r["draft_tokens"], r["draft_accepted"], f"{r['accepted_per_generated']:.0%}"] for r in rows])
    if summary:
        md += ["", "Geometric mean speed-up: " + ", ".join(f"{k} {v:.2f}x" for k, v in summary.items()) + "."]
    return {"study": "speculative", "threads": nt, "max_tokens": max_tokens, "rows": rows,
            "geomean_speedup": summary}, md
