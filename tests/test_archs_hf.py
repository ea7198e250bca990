"""The llama family's other members (qwen2, qwen3, phi3, Mistral-style llama files with a sliding
window) on small random-weight GGUFs written with the project's writer (the real tensor names,
shapes and metadata keys): the exact path's logits against float32 transformers loading the same
file, the fast path within a looser bound, the NumPy reference; their vocabularies' token ids
against the fast tokenizer transformers builds from the same file; refusals; `pyinfer info`.

torch, transformers and accelerate are test-only (the `test` extra): without them the
comparisons skip, except in CI (CI set), where they fail.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _optional import need

from pyinfer import Model, reference
from pyinfer.arch import ARCHITECTURES, UnsupportedModelError, describe
from pyinfer.bench.synthetic import Shape, generated_text, write_synthetic
from pyinfer.gguf import GGUFReader
from pyinfer.gguf_types import GGMLType, ValueType
from pyinfer.info import format_info, model_info
from pyinfer.tokenizer import Tokenizer

WINDOW = 8  # shorter than the test sequence, so a window is felt
N_ROT = 8  # phi3: RoPE on half of each 16-dim head
N_VOCAB = 512
# Per test name: the architecture written, and its writer's options. qwen3 keeps its real
# head dim of 128 at width 64 (q_dim 512 > n_embd), as transformers' Qwen3 config assumes.
CASES: dict[str, dict[str, Any]] = {
    "llama": {"arch": "llama", "vocab": "bpe"},
    "mistral": {"arch": "mistral", "vocab": "bpe", "sliding_window": WINDOW},
    "qwen2": {"arch": "qwen2", "vocab": "bpe"},
    "qwen3": {"arch": "qwen3", "vocab": "bpe", "key_length": 128},
    "phi3": {"arch": "phi3", "vocab": "spm", "sliding_window": WINDOW, "n_rot": N_ROT},
}
IDS = [int(i) for i in np.random.default_rng(1).integers(0, N_VOCAB, 40)]


def write_case(path: Path, case: str, ggml_type: GGMLType = GGMLType.Q8_0, **overrides: Any) -> Path:
    opts = dict(CASES[case], **overrides)
    shape = Shape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_vocab=N_VOCAB, n_ctx=256,
                  key_length=opts.pop("key_length", 0))
    return write_synthetic(path, shape, ggml_type, seed=2, tile_rows=1 << 20, **opts)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("archs")
    return {case: write_case(d / f"{case}.gguf", case) for case in CASES}


def hf_logits(path: Path, ids: list[int]) -> np.ndarray:
    """float32 transformers on the same file. Its GGUF loader does not read every key these
    files carry, so what the file says is set on the config it builds: the sliding window
    (`attention.sliding_window`, unmapped for llama and phi3) and phi3's RoPE dims
    (`rope.dimension_count`, unmapped); a llama file with a window runs as transformers'
    Mistral model (its loader picks that class by general.name alone), with the weights the
    loader read."""
    torch = need("torch")
    transformers = need("transformers")
    need("accelerate")  # transformers loads GGUF files only with it
    md = GGUFReader(path).metadata
    arch = md["general.architecture"]
    cfg = transformers.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    window = md.get(f"{arch}.attention.sliding_window", 0)
    if window:
        cfg.sliding_window = int(window)
    if arch == "phi3":
        cfg.rope_parameters["partial_rotary_factor"] = md["phi3.rope.dimension_count"] / (cfg.hidden_size //
                                                                                         cfg.num_attention_heads)
        cfg.pad_token_id = None  # Phi-3's default id 32000 is outside this vocabulary
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, config=cfg,
                                                              dtype=torch.float32)
    if arch == "llama" and window:
        d = cfg.to_dict()
        for k in ("model_type", "architectures", "transformers_version"):
            d.pop(k, None)
        mistral = transformers.MistralForCausalLM(transformers.MistralConfig(**d)).float()
        mistral.load_state_dict(model.state_dict())
        model = mistral
        assert model.config.sliding_window == window
    model.eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


# ---- logits --------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(files: dict[str, Path], case: str) -> None:
    """Exact path: within float32 rounding of transformers (~1e-6 of the logits' scale seen;
    1e-5 allowed), whole prompt and token by token through the KV cache. Fast path (int8
    activations on the Q8_0 matrices): within 6% of the scale (2-3% seen)."""
    path = files[case]
    want = hf_logits(path, IDS)
    scale = np.abs(want).max()
    exact = Model.load(path, precision="exact", n_threads=2, n_ctx=64)
    assert np.abs(exact.logits(IDS) - want).max() <= 1e-5 * scale, case
    ctx = exact.context(n_ctx=64)
    steps = np.array([ctx.eval([t]).copy() for t in IDS])
    assert np.abs(steps - want).max() <= 1e-5 * scale, case
    fast = Model.load(path, precision="fast", n_threads=2, n_ctx=64)
    err = np.abs(fast.logits(IDS) - want).max()
    assert err <= 0.06 * scale, (case, err / scale)


@pytest.mark.parametrize("case", list(CASES))
def test_reference_matches_exact_path(files: dict[str, Path], case: str) -> None:
    want = reference.forward(GGUFReader(files[case]), IDS)
    got = Model.load(files[case], precision="exact", n_threads=2, n_ctx=64).logits(IDS)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), case


def test_f32_file_matches_transformers(tmp_path: Path) -> None:
    """Unquantized weights: exact and fast paths alike within float32 rounding."""
    path = write_case(tmp_path / "phi3.gguf", "phi3", GGMLType.F32)
    want = hf_logits(path, IDS)
    for precision in ("exact", "fast"):
        got = Model.load(path, precision=precision, n_threads=2, n_ctx=64).logits(IDS)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), precision


def test_features_are_live(files: dict[str, Path], tmp_path: Path) -> None:
    """The window, partial RoPE, biases and head norms change the logits (so the agreement
    above is not of two passes that both ignore them); the window only after WINDOW positions."""
    def logits(path: Path) -> np.ndarray:
        return Model.load(path, precision="exact", n_threads=2, n_ctx=64).logits(IDS)

    # Mistral's file is llama's with the window key: the same weights.
    base, windowed = logits(files["llama"]), logits(files["mistral"])
    np.testing.assert_allclose(windowed[:WINDOW], base[:WINDOW], rtol=0, atol=1e-6)
    assert np.abs(windowed[WINDOW:] - base[WINDOW:]).max() > 1e-2
    phi_wide = logits(write_case(tmp_path / "phi3_wide.gguf", "phi3", sliding_window=0))
    phi = logits(files["phi3"])
    np.testing.assert_allclose(phi_wide[:WINDOW], phi[:WINDOW], rtol=0, atol=1e-6)
    assert np.abs(phi_wide[WINDOW:] - phi[WINDOW:]).max() > 1e-2
    full_rot = logits(write_case(tmp_path / "phi3_rot.gguf", "phi3", n_rot=0))
    assert np.abs(full_rot[1:] - phi[1:]).max() > 1e-2  # position 0 is not rotated either way
    np.testing.assert_allclose(full_rot[0], phi[0], rtol=0, atol=1e-6)
    # Biases and head norms: the forward pass with them and without (the reference's flags off).
    for case, flag in (("qwen2", "qkv_bias"), ("qwen3", "qk_norm")):
        m = reference.load_model(GGUFReader(files[case]))
        on = reference.forward(m, IDS)
        m["config"] = m["config"].__class__(**{**m["config"].__dict__, flag: False})
        assert np.abs(reference.forward(m, IDS) - on).max() > 1e-2, case
        np.testing.assert_allclose(logits(files[case]), on, rtol=0, atol=1e-5 * np.abs(on).max())


def test_configs_are_described(files: dict[str, Path]) -> None:
    c = {case: describe(GGUFReader(p)).config for case, p in files.items()}
    assert (c["mistral"].architecture, c["mistral"].sliding_window) == ("llama", WINDOW)
    assert c["llama"].sliding_window == 0 and not c["llama"].rope_neox
    assert c["qwen2"].qkv_bias and c["qwen2"].rope_neox and not c["qwen2"].qk_norm
    assert c["qwen3"].qk_norm and c["qwen3"].head_dim == 128 and not c["qwen3"].qkv_bias
    assert c["phi3"].ffn_fused and c["phi3"].rope_dim == N_ROT and c["phi3"].sliding_window == WINDOW
    assert set(ARCHITECTURES) >= {"llama", "qwen2", "qwen3", "phi3", "gemma3"}


def test_phi3_with_separate_qkv_matrices(files: dict[str, Path], tmp_path: Path) -> None:
    """llama.cpp also reads phi3 layers with attn_q/k/v instead of attn_qkv: the same model."""
    split = write_case(tmp_path / "split.gguf", "phi3", fused_qkv=False)
    assert "blk.0.attn_qkv.weight" not in GGUFReader(split).tensors
    for precision in ("exact", "fast"):
        got = Model.load(split, precision=precision, n_threads=2, n_ctx=64).logits(IDS)
        want = Model.load(files["phi3"], precision=precision, n_threads=2, n_ctx=64).logits(IDS)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


# ---- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("case", "extra", "message"), [
    ("qwen2", {"metadata": {"qwen2.attention.sliding_window": (4096, ValueType.UINT32)}},
     r"qwen2\.attention\.sliding_window = 4096 is not supported by the qwen2 architecture"),
    ("qwen3", {"metadata": {"qwen3.rope.dimension_count": (64, ValueType.UINT32)}},
     r"qwen3\.rope\.dimension_count = 64: RoPE on part of a head"),
    ("qwen2", {"metadata": {"qwen2.rope.scaling.type": "yarn"}}, r"qwen2\.rope\.scaling\.type = 'yarn'"),
    ("phi3", {"tensors": {"rope_factors_long.weight": np.ones(4, np.float32)}},
     r"tensor rope_factors_long\.weight is not used by the phi3 architecture"),
    ("phi3", {"metadata": {"phi3.rope.scaling.attn_factor": 1.19}}, r"phi3\.rope\.scaling\.attn_factor = 1\.19"),
    ("phi3", {"metadata": {"phi3.rope.dimension_count": (7, ValueType.UINT32)}},
     r"phi3\.rope\.dimension_count = 7: RoPE on part of a head"),
    ("llama", {"tensors": {"blk.0.attn_q_norm.weight": np.ones(16, np.float32)}},
     r"tensor blk\.0\.attn_q_norm\.weight is not used by the llama architecture"),
    ("qwen3", {"tensors": {"blk.0.attn_q.bias": np.ones(512, np.float32)}},
     r"tensor blk\.0\.attn_q\.bias is not used by the qwen3 architecture"),
])
def test_refused(tmp_path: Path, case: str, extra: dict, message: str) -> None:
    md = extra.get("metadata", {})
    written = {k: v for k, v in md.items() if k.endswith("rope.dimension_count")}
    path = write_case(tmp_path / "m.gguf", case, GGMLType.F32,
                      metadata={k: v for k, v in md.items() if k not in written}, tensors=extra.get("tensors"))
    r = GGUFReader(path)
    for k, v in written.items():  # the writer sets this key itself: change its value
        r.metadata[k] = v[0]
    with pytest.raises(UnsupportedModelError, match=message):
        describe(r)
    with pytest.raises(ValueError, match=message):
        Model(r)


@pytest.mark.parametrize(("case", "drop", "message"), [
    ("qwen2", "blk.1.attn_v.bias", "missing weight blk.1.attn_v.bias"),
    ("qwen3", "blk.0.attn_k_norm.weight", "missing weight blk.0.attn_k_norm.weight"),
    ("phi3", "blk.1.attn_qkv.weight", "missing weight blk.1.attn_q.weight"),  # neither fused nor split
])
def test_missing_tensor_is_named(tmp_path: Path, case: str, drop: str, message: str) -> None:
    path = write_case(tmp_path / "m.gguf", case, GGMLType.F32, omit=(drop,))
    with pytest.raises(ValueError, match=message):
        Model.load(path, precision="exact")


def test_unknown_architecture_lists_the_supported(files: dict[str, Path]) -> None:
    r = GGUFReader(files["qwen2"])
    r.metadata["general.architecture"] = "qwen2moe"
    with pytest.raises(UnsupportedModelError, match=r"'qwen2moe' is not supported \(supported: llama, qwen2, qwen3, "
                                                    r"phi3, gemma3\)"):
        Model(r)


# ---- vocabularies ----------------------------------------------------------------------------


def _texts() -> list[str]:
    text = generated_text(7, 400)
    return [text, *text.split("\n"), "  two spaces", "digits 1234567 and 12", "it's THEY'LL we'Re",
            "a\r\nb\t\tc   d\n\n\n", "", " "]


@pytest.mark.parametrize("case", ["llama", "qwen2", "phi3"])
def test_token_ids_match_transformers_tokenizer(files: dict[str, Path], case: str) -> None:
    """llama-bpe (Llama 3's split), qwen2 (digits one by one) and SentencePiece ids equal those
    of the fast tokenizer transformers builds from the file's vocabulary."""
    need("tokenizers")
    transformers = need("transformers")
    path = files[case]
    hf = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok = Tokenizer.load(path)
    assert tok.pre_name == {"llama": "llama-bpe", "qwen2": "qwen2", "phi3": "default"}[case]
    bad = [s for s in _texts() if tok.tokenize(s, add_bos=False) != hf.encode(s, add_special_tokens=False)]
    assert bad == [], case
    # BOS as the file says (and as transformers adds it).
    assert tok.tokenize("ab") == hf.encode("ab"), case
    ids = tok.tokenize(_texts()[0], add_bos=False)
    prefix = " " if tok.add_space_prefix else ""  # SentencePiece's space before the text comes back
    assert tok.detokenize(ids) == (prefix + _texts()[0]).encode()


def test_qwen2_and_llama3_splits_differ_on_numbers(files: dict[str, Path]) -> None:
    llama, qwen = Tokenizer.load(files["llama"]), Tokenizer.load(files["qwen2"])
    assert llama._bpe.split("x 12345") == ["x", " ", "123", "45"]
    assert qwen._bpe.split("x 12345") == ["x", " ", "1", "2", "3", "4", "5"]


def test_llama3_names_are_one_pre_tokenizer(files: dict[str, Path]) -> None:
    md = dict(GGUFReader(files["llama"]).metadata)
    text = _texts()[0]
    want = Tokenizer(md).tokenize(text)
    for name in ("llama3", "llama-v3"):
        assert Tokenizer(dict(md, **{"tokenizer.ggml.pre": name})).tokenize(text) == want


# ---- info and the command line -------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_info(files: dict[str, Path], case: str) -> None:
    info = model_info(GGUFReader(files[case]))
    assert info["unsupported"] is None and info["architecture"] == CASES[case]["arch"].replace("mistral", "llama")
    assert info["head_dim"] == (128 if case == "qwen3" else 16)
    text = format_info(info)
    assert "not supported" not in text and f"architecture    {info['architecture']}" in text


def test_info_command(files: dict[str, Path]) -> None:
    out = subprocess.run([sys.executable, "-m", "pyinfer", "info", str(files["phi3"])], capture_output=True,
                         text=True, check=True).stdout
    assert "architecture    phi3" in out and "not supported" not in out
