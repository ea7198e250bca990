"""The default model requantized to llama.cpp's Q4_K_M mix by `pyinfer.quantize`, against float32
transformers loading the same file.

SmolLM2's width of 576 is not a multiple of 256, so the mix is the one llama.cpp's quantizer
writes for it: Q4_K and Q6_K where a row holds whole 256-element super-blocks, Q5_0 and Q8_0
where it does not (and F32 vectors). transformers dequantizes the file with its own code (the
`gguf` package) and runs it in float32, so it checks pyinfer's K-quant, Q5_0 and Q8_0 kernels on
a real model's weights, independently of pyinfer's NumPy twins.

Bounds (tests/data/reference/README.md): the fast path's first-position logits no further from
transformers than llama.cpp's own are on the default model (0.6 over the top 40 of each prompt),
its perplexity within 0.5%; the exact path within 1e-3.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _optional import need
from _reference import load

from pyinfer import Model
from pyinfer.gguf import GGUFReader
from pyinfer.quantize import quantize_model

CASES = load("gen_llamacpp.json")["cases"]
PPL_IDS = load("ppl.json")["ids"]
WINDOW = 512
FAST_SPREAD = 0.6  # llama.cpp against transformers float32, max |diff| over the top 40
EXACT_TOL = 1e-3
PPL_REL = 0.005


@pytest.fixture(scope="module")
def requantized(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("q4_k_m") / "smollm2-q4_k_m.gguf"
    quantize_model(default_model, path, "q4_k_m")
    return path


def _windows() -> list[list[int]]:
    return [PPL_IDS[s:s + WINDOW] for s in range(0, len(PPL_IDS) - WINDOW + 1, WINDOW)]


def _nll(logits: np.ndarray, window: list[int]) -> np.ndarray:
    """Negative log-likelihood of each next token of the window (the first is not scored)."""
    lg = logits.astype(np.float64)
    lp = lg - np.logaddexp.reduce(lg, axis=1, keepdims=True)
    return -lp[np.arange(len(window) - 1), window[1:]]


@pytest.fixture(scope="module")
def hf(requantized: Path) -> dict[str, object]:
    """transformers' float32 first-position logits of every prompt and its NLL per window."""
    torch = need("torch")
    transformers = need("transformers")
    need("accelerate")  # transformers loads GGUF files only with it
    need("gguf")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        requantized.parent, gguf_file=requantized.name, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        first = [model(torch.tensor([c["prompt_ids"]])).logits[0, -1].double().numpy() for c in CASES]
        nll = np.concatenate([_nll(model(torch.tensor([w])).logits[0].numpy(), w) for w in _windows()])
    return {"first": first, "nll": nll}


def test_mix_is_llama_cpp_s(requantized: Path) -> None:
    """The file holds the types llama.cpp's quantizer chooses for SmolLM2's Q4_K_M."""
    with GGUFReader(requantized) as r:
        counts: dict[str, int] = {}
        for t in r.tensors.values():
            counts[t.type.name] = counts.get(t.type.name, 0) + 1
    assert counts == {"Q4_K": 16, "Q6_K": 14, "Q5_0": 166, "Q8_0": 15, "F32": 61}


@pytest.fixture(scope="module")
def models(requantized: Path) -> dict[str, Model]:
    return {p: Model.load(requantized, precision=p) for p in ("fast", "exact")}


@pytest.mark.parametrize("precision", ["fast", "exact"])
def test_first_position_logits(models: dict[str, Model], hf: dict[str, object], precision: str) -> None:
    m = models[precision]
    bound = FAST_SPREAD if precision == "fast" else EXACT_TOL
    worst = 0.0
    for case, want in zip(CASES, hf["first"]):
        got = np.asarray(m.logits(case["prompt_ids"])[-1], dtype=np.float64)
        top = np.argsort(-want)[:40]
        diff = float(np.abs(got[top] - want[top]).max())
        worst = max(worst, diff)
        assert diff <= bound, f"{precision}: max |diff| {diff:.3g} over the top 40 of {case['prompt_ids'][:8]}…"
    if precision == "fast":
        assert worst > 0  # the fast path's int8 activations do move the logits


def test_perplexity(models: dict[str, Model], hf: dict[str, object]) -> None:
    m = models["fast"]
    nll = np.concatenate([_nll(np.asarray(m.logits(w)), w) for w in _windows()])
    want = float(np.exp(hf["nll"].mean()))
    got = float(np.exp(nll.mean()))
    assert len(nll) == len(hf["nll"]) >= 2000
    assert abs(got - want) / want <= PPL_REL, f"perplexity {got:.4f} against transformers' {want:.4f}"
