"""The NumPy forward pass (pyinfer/reference.py) against transformers float32 on the default
model: teacher-forced logits at the first generated position of every reference prompt.

This pins what the kernels' tests cannot: RoPE's pairing (adjacent pairs for llama-arch GGUFs),
the grouped-query head mapping, the norms and the tied output head.
"""

from __future__ import annotations

import numpy as np
import pytest

from pyinfer import reference as R

from _reference import load

CASES = load("gen_hf.json")["cases"]

# transformers float32 against this float64 pass: about 3e-5 on every prompt when written;
# reference/README.md asks a float32 path for 1e-3.
TOL = 1e-3


@pytest.fixture(scope="module")
def model(default_model):
    from pyinfer.gguf import GGUFReader

    return R.load_model(GGUFReader(default_model))


def test_reference_prompts_are_llama_cpp_prompts() -> None:
    """transformers ran on llama.cpp's prompt ids, so both files describe the same inputs."""
    llama = load("gen_llamacpp.json")["cases"]
    assert len(CASES) == len(llama) == 12
    assert [c["prompt_ids"] for c in CASES] == [c["prompt_ids"] for c in llama]


@pytest.mark.parametrize("i", range(len(CASES)))
def test_first_position_logits(model, i: int) -> None:
    case = CASES[i]
    logits = R.forward(model, case["prompt_ids"])
    assert logits.shape == (len(case["prompt_ids"]), 49152)
    last = logits[-1]
    step = case["first_step"]
    ids = np.array(step["top_ids"])
    diff = np.abs(last[ids] - np.array(step["top_logits"]))
    assert diff.max() <= TOL, f"max |diff| {diff.max():.2e} over the top-40"
    lse = np.log(np.sum(np.exp(last - last.max()))) + last.max()
    assert abs(lse - step["logsumexp"]) <= TOL
    assert int(np.argmax(last)) == ids[0]
