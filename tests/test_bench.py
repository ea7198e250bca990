"""`pyinfer bench --quick` on a tiny synthetic model (schema and internal consistency, never
speed), and `pyinfer quantize` round trips through pyinfer and the `gguf` package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pyinfer import _C
from pyinfer.bench import studies
from pyinfer.bench.engines import parse_llama_bench
from pyinfer.bench.synthetic import PRESETS, write_synthetic_llama
from pyinfer.gguf import GGUFReader
from pyinfer.model import Model
from pyinfer.quantize import TARGET_TYPES, derived_path, quantize_model

STUDIES = ["ceiling", "roofline", "formats", "context", "batch", "prefill", "model_size", "peers"]

# Relative bound on |logits - source logits| / max |source logits| after re-quantizing the
# tiny model's matrices: float formats lose only rounding, the 4-bit block formats a lot
# more (the source is Q4_1, so Q4_1 itself is exact but Q4_0 re-rounds every weight).
LOGIT_BOUND = {"f32": 1e-5, "f16": 5e-3, "bf16": 3e-2, "q8_0": 8e-2, "q4_0": 0.6, "q4_1": 1e-5}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf", "tiny")


@pytest.fixture(scope="module")
def bench_out(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One quick run of every study, as a user runs it, with the cache in a temporary home."""
    home = tmp_path_factory.mktemp("home")
    out = home / "results"
    env = {**os.environ, "PYINFER_HOME": str(home)}
    r = subprocess.run([sys.executable, "-m", "pyinfer", "bench", "--quick", "--model", str(tiny), "--out",
                        str(out), "--threads", "1", "2", "--no-peers"], capture_output=True, text=True,
                       cwd=home, env=env, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "roofline" in r.stderr and "[" in r.stderr  # progress went to stderr
    return out


def _load(out: Path, study: str) -> dict:
    return json.loads((out / f"{study}.json").read_text())


def test_every_study_writes_json_and_markdown(bench_out: Path) -> None:
    for study in STUDIES:
        rep = _load(bench_out, study)
        assert rep["study"] == study and rep["quick"] is True
        for key in ("machine", "cpu_features", "isa", "versions", "commit", "time", "threads", "elapsed_s"):
            assert key in rep, (study, key)
        assert rep["versions"]["pyinfer"]
        assert (bench_out / f"{study}.md").read_text().startswith("## ")
    assert "## Decode roofline" in (bench_out / "summary.md").read_text()


def test_plots_when_matplotlib_is_there(bench_out: Path) -> None:
    pytest.importorskip("matplotlib")
    for study in ("ceiling", "roofline", "formats", "context", "batch", "prefill", "model_size"):
        assert (bench_out / f"{study}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _check_decode_row(r: dict) -> None:
    assert len(r["tokens_per_s_samples"]) >= 2 and all(x > 0 for x in r["tokens_per_s_samples"])
    assert r["tokens_per_s"] == pytest.approx(float(np.median(r["tokens_per_s_samples"])))
    assert r["bytes_per_token"] == r["weight_bytes_per_token"] + r["kv_bytes_per_token"]
    assert r["achieved_gbps"] == pytest.approx(r["bytes_per_token"] * r["tokens_per_s"] / 1e9, rel=1e-9)
    assert r["ceiling_gbps"] == pytest.approx(float(np.median(r["ceiling_gbps_samples"])))
    assert r["pct_of_ceiling"] == pytest.approx(100 * r["achieved_gbps"] / r["ceiling_gbps"], rel=1e-9)


def test_roofline_is_internally_consistent(bench_out: Path, tiny: Path) -> None:
    rep = _load(bench_out, "roofline")
    rows = rep["rows"]
    assert {(r["format"], r["threads"]) for r in rows} == {(f, t) for f in ("as stored", *TARGET_TYPES) for t in (1, 2)}
    with GGUFReader(tiny) as g:
        n_layer, n_kv, hd = (g.metadata["llama.block_count"], g.metadata["llama.attention.head_count_kv"],
                             g.metadata["llama.embedding_length"] // g.metadata["llama.attention.head_count"])
    for r in rows:
        _check_decode_row(r)
        # float32 KV: K and V of every layer, mean context of the steps timed
        per_pos = n_layer * n_kv * hd * 2 * 4
        assert r["kv_bytes_per_token"] == pytest.approx(per_pos * (r["start_position"] + (r["n_steps"] + 1) / 2))
    by = {r["format"]: r["weight_bytes_per_token"] for r in rows}
    assert by["f32"] > by["f16"] == by["bf16"] > by["q8_0"] > by["q4_1"] > by["q4_0"]


def test_context_model_size_and_ceiling(bench_out: Path) -> None:
    ctx = _load(bench_out, "context")["rows"]
    assert {r["kv_dtype"] for r in ctx} == {"float32", "float16"}
    for r in ctx:
        _check_decode_row(r)
    f32 = {r["context"]: r["kv_bytes_per_position"] for r in ctx if r["kv_dtype"] == "float32"}
    f16 = {r["context"]: r["kv_bytes_per_position"] for r in ctx if r["kv_dtype"] == "float16"}
    assert all(f32[c] == 2 * f16[c] for c in f32)
    for r in _load(bench_out, "model_size")["rows"]:
        _check_decode_row(r)
    ceil = _load(bench_out, "ceiling")
    assert [b["threads"] for b in ceil["bandwidth"]] == [1, 2]
    for b in ceil["bandwidth"]:
        assert b["median_gbps"] == pytest.approx(float(np.median(b["gbps_samples"])))
        assert b["best_gbps"] == max(b["gbps_samples"])
    for c in ceil["compute"]:
        assert c["gops"] == pytest.approx(float(np.median(c["gops_samples"])))
    peak = ceil["int8_peak"]
    if _C.get_isa() == "scalar":
        assert peak is None
    else:
        assert peak["gops"] == pytest.approx(float(np.median(peak["gops_samples"]))) and peak["gops"] > 0
        for c in ceil["compute"]:
            if c["mode"] == "fast":
                assert c["pct_of_int8_peak"] == pytest.approx(100 * c["gops"] / peak["gops"])


def test_batch_prefill_peers_formats(bench_out: Path, tiny: Path) -> None:
    batch = _load(bench_out, "batch")
    assert "sequential" in batch["modes"]
    for r in batch["rows"]:
        assert r["mode"] in batch["modes"]
        assert r["per_sequence_tokens_per_s"] == pytest.approx(r["aggregate_tokens_per_s"] / r["batch"])
        assert r["aggregate_tokens_per_s"] == pytest.approx(float(np.median(r["aggregate_samples"])))
        assert r["achieved_gbps"] == pytest.approx(
            r["aggregate_tokens_per_s"] * (r["weight_bytes_per_token"] + r["kv_bytes_per_token"]) / 1e9)
        if r["mode"] == "batched":  # the ceiling at B: B tokens per read of the weights, or arithmetic
            assert r["ceiling_tokens_per_s"] == pytest.approx(studies.batch_ceiling(batch["ceilings"], r["batch"]))
            assert r["pct_of_ceiling"] == pytest.approx(100 * r["aggregate_tokens_per_s"] / r["ceiling_tokens_per_s"])
    c = batch["ceilings"]
    assert c["read_gbps"] > 0
    mem1 = c["read_gbps"] * 1e9 / (c["weight_bytes_per_step"] + c["kv_bytes_per_token"])
    assert studies.batch_ceiling(c, 1) == pytest.approx(mem1 if c["int8_tokens_per_s"] is None
                                                        else min(mem1, c["int8_tokens_per_s"]))
    for r in _load(bench_out, "prefill")["rows"]:
        assert r["prefill_tokens_per_s"] == pytest.approx(r["prompt_tokens"] / r["prefill_s"])
        assert r["gops"] == pytest.approx(r["ops"] / r["prefill_s"] / 1e9)
        assert 0 < r["ttft_s"] and len(r["ttft_s_samples"]) >= 2
    peers = _load(bench_out, "peers")
    assert {r["engine"] for r in peers["rows"]} == {"pyinfer", "pyinfer generate()"} and peers["ratios"] == []
    ops = studies.prefill_ops(GGUFReader(tiny), peers["pp_tokens"])
    for r in peers["rows"]:
        if r["engine"] == "pyinfer":
            assert r["pp_gops_per_core"] == pytest.approx(ops * r["pp"] / peers["pp_tokens"] / 1e9 / r["threads"])
    assert [(r["engine"], r["threads"]) for r in peers["startup"]] == [("pyinfer", 1), ("pyinfer", 2)]
    for r in peers["startup"]:
        _check_startup_row(r)
    assert peers["startup_ratios"] == [] and peers["startup_settings"]["page_cache"] == "warm"
    assert "### Start-up" in (bench_out / "peers.md").read_text()
    formats = _load(bench_out, "formats")["rows"]
    assert [r["format"] for r in formats] == list(TARGET_TYPES)
    for r in formats:
        assert Path(r["path"]).name == derived_path(tiny, r["format"]).name  # in the cache's derived/
        assert r["max_rel_logit_error"] <= LOGIT_BOUND[r["format"]]


def _check_startup_row(r: dict) -> None:
    """A start-up row of pyinfer or a GGUF peer: load, memory and first-token measurements."""
    for key in ("load_s", "ttft_s"):
        samples = r[f"{key}_samples"]
        assert len(samples) >= 2 and all(x > 0 for x in samples)
        assert r[key] == pytest.approx(float(np.median(samples)))
    assert r["rss_mb"] > 0 and r["peak_mb"] >= r["rss_mb"] - 1e-9 and r["prompt_tokens"] > 0
    assert r["rss_mb"] == pytest.approx(r["import_mb"] + r["load_mb"] + r["eval_mb"])
    marks = r["rss_marks"]
    assert list(marks) == ["start", "import", "load", "eval"]
    assert r["rss_mb"] == pytest.approx((marks["eval"]["VmRSS"] - marks["start"]["VmRSS"]) / 1e6)
    if r["engine"] == "pyinfer":
        assert r["repacked_mb"] >= 0


def test_peers_startup_ratios(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a peer there (pyinfer under llama.cpp's name, as CI has no llama-cpp-python), its
    start-up rows are measured like pyinfer's and the ratios are pyinfer's over them."""
    from pyinfer.bench import engines, studies
    from pyinfer.bench.common import Settings

    class Peer(engines.PyinferEngine):
        def __init__(self, path: Path, n_threads: int, n_ctx: int) -> None:
            super().__init__(path, n_threads, n_ctx)
            self.name = "llama.cpp"

    monkeypatch.setattr(studies, "peer_makers", lambda _: ([("llama.cpp", Peer)], {}))
    as_pyinfer = {"pyinfer": "pyinfer", "llama.cpp": "pyinfer"}
    monkeypatch.setattr(studies, "load_seconds", lambda e, *a: engines.load_seconds(as_pyinfer[e], *a))
    monkeypatch.setattr(studies, "resident_memory", lambda e, *a: engines.resident_memory(as_pyinfer[e], *a))
    monkeypatch.setenv("PYINFER_HOME", str(tmp_path))
    rep, md = studies.study_peers(Settings(model=tiny, threads=[1], quick=True, out=tmp_path))
    assert [r["engine"] for r in rep["startup"]] == ["pyinfer", "llama.cpp"]
    for r in rep["startup"]:
        _check_startup_row(r)
    base, peer = rep["startup"]
    (x,) = rep["startup_ratios"]
    assert x["peer"] == "llama.cpp" and x["threads"] == 1
    assert x["load_ratio"] == pytest.approx(base["load_s"] / peer["load_s"])
    assert x["ttft_ratio"] == pytest.approx(base["ttft_s"] / peer["ttft_s"])
    assert x["rss_ratio"] == pytest.approx(base["rss_mb"] / peer["rss_mb"])
    assert x["rss_less_repacked_ratio"] == pytest.approx((base["rss_mb"] - base["repacked_mb"]) / peer["rss_mb"])
    text = "\n".join(md)
    assert "RSS less repacked" in text and ("(met)" in text or "(missed)" in text)


def test_int8_slots_per_token(tiny: Path, tmp_path: Path) -> None:
    # Every matrix's multiply-adds, weighted by its type's issue slots; the head is the output
    # matrix, or the embedding table when tied. A matrix the int8 kernels do not take: None.
    r = GGUFReader(tiny)
    mats = [t for n, t in r.tensors.items() if n.startswith("blk.") and len(t.shape) == 2]
    mats.append(r.tensors.get("output.weight") or r.tensors["token_embd.weight"])
    assert studies.int8_slots_per_token(r) == pytest.approx(sum(t.n_elements * studies.INT8_SLOTS[t.type]
                                                                for t in mats))
    f16 = tmp_path / "tiny.f16.gguf"
    quantize_model(tiny, f16, "f16")
    assert studies.int8_slots_per_token(GGUFReader(f16)) is None


def test_llama_bench_json_is_parsed() -> None:
    text = json.dumps([{"n_prompt": 512, "n_gen": 0, "n_threads": 2, "avg_ts": 612.5, "samples_ts": [610.0, 615.0],
                        "build_commit": "abc", "cpu_info": "AMD EPYC"}])
    (r,) = parse_llama_bench(text)
    assert r["n_prompt"] == 512 and r["avg_ts"] == 612.5 and r["samples_ts"] == [610.0, 615.0]


# -- quantize ------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(TARGET_TYPES))
def test_quantize_round_trip(tiny: Path, tmp_path: Path, fmt: str) -> None:
    gguf = pytest.importorskip("gguf")
    out = tmp_path / f"tiny.{fmt}.gguf"
    r = subprocess.run([sys.executable, "-m", "pyinfer", "quantize", str(tiny), str(out), "--type", fmt],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    want = TARGET_TYPES[fmt].name
    # The gguf package reads it: every matrix, embedding and output head included, in the
    # target type; norms in F32; metadata intact.
    g = gguf.GGUFReader(out)
    types = {t.name: t.tensor_type.name for t in g.tensors}
    assert types["token_embd.weight"] == want and types["output.weight"] == want
    for name, t in types.items():
        assert t == ("F32" if name.endswith("norm.weight") else want), name
    assert len(types) == len(GGUFReader(tiny).tensors)
    ours = GGUFReader(out)
    assert ours.metadata["tokenizer.ggml.tokens"] == GGUFReader(tiny).metadata["tokenizer.ggml.tokens"]
    assert ours.metadata["llama.block_count"] == PRESETS["tiny"].n_layer
    # Values: what gguf's reader sees for one matrix is our dequantization of it.
    q = next(t for t in g.tensors if t.name == "blk.0.attn_q.weight")
    deq = gguf.quants.dequantize(q.data, q.tensor_type).reshape(ours.dequantize("blk.0.attn_q.weight").shape)
    np.testing.assert_array_equal(deq.astype(np.float32), ours.dequantize("blk.0.attn_q.weight"))
    # Logits from pyinfer.Model stay within the format's bound of the source's.
    ids = [5, 300, 17, 1999, 42, 256, 7, 1000]
    ref = Model.load(tiny, precision="exact", n_ctx=16).logits(ids)
    got = Model.load(out, precision="exact", n_ctx=16).logits(ids)
    assert np.abs(got - ref).max() <= LOGIT_BOUND[fmt] * np.abs(ref).max()


def test_quantize_rejects_bad_requests(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="type must be one of"):
        quantize_model(tiny, tmp_path / "x.gguf", "q5_k")
    with pytest.raises(ValueError, match="must not be the input"):
        quantize_model(tiny, tiny, "f16")
