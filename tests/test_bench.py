"""`pyinfer bench --quick` on a tiny synthetic model (schema and internal consistency, never
speed), `pyinfer bench serve --quick` against a real `pyinfer serve` process, and `pyinfer
quantize` round trips through pyinfer and the `gguf` package."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pyinfer import _C
from pyinfer.bench import engines, studies
from pyinfer.bench.common import cache_note, last_level_cache_bytes, median
from pyinfer.bench.engines import (
    OpenVINOEngine,
    llama_bench_peers,
    parse_llama_bench,
    peer_makers,
    trial_in_child,
)
from pyinfer.bench.synthetic import PRESETS, write_synthetic_llama
from pyinfer.gguf import GGUFReader
from pyinfer.gguf_types import GGMLType
from pyinfer.model import Model
from pyinfer.quantize import TARGET_TYPES, derived_path, quantize_model

STUDIES = ["ceiling", "roofline", "formats", "context", "batch", "contention", "prefill", "model_size", "peers", "speculative"]

# Relative bound on |logits - source logits| / max |source logits| after re-quantizing the
# tiny model's matrices: float formats lose only rounding, the 4-bit block formats a lot
# more (the source is Q4_1, so Q4_1 itself is exact but Q4_0 re-rounds every weight; Q4_K's
# 15 steps per 32 land near Q4_1's grid, Q5_K's 31 do not).
LOGIT_BOUND = {"f32": 1e-5, "f16": 5e-3, "bf16": 3e-2, "q8_0": 8e-2, "q4_0": 0.6, "q4_1": 1e-5, "q5_0": 0.3,
               "q5_1": 0.3, "q4_k": 0.15, "q5_k": 0.3, "q6_k": 0.2, "q4_k_m": 0.15}


def want_type(fmt: str, name: str) -> str:
    """The type `pyinfer quantize --type fmt` gives a matrix of the tiny model (4 layers, every
    row a whole number of 256-element super-blocks): q4_k_m's Q6_K for the output head and for
    attn_v and ffn_down of layers 2 and 3 (of 4: the last eighth and every third from the first
    eighth on), Q4_K elsewhere."""
    if fmt != "q4_k_m":
        return TARGET_TYPES[fmt].name
    more = name == "output.weight" or any(f"blk.{i}.{m}.weight" == name for i in (2, 3)
                                           for m in ("attn_v", "ffn_down"))
    return "Q6_K" if more else "Q4_K"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf", "tiny")


@pytest.fixture(scope="module")
def bench_out(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One quick run of every study, as a user runs it, with the cache in a temporary home."""
    home = tmp_path_factory.mktemp("home")
    out = home / "results"
    env = {**os.environ, "PYINFER_HOME": str(home)}
    # Every study but serve, which has its own run below.
    r = subprocess.run([sys.executable, "-m", "pyinfer", "bench", *STUDIES, "--quick", "--model", str(tiny), "--out",
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
    for study in ("ceiling", "roofline", "formats", "context", "batch", "contention", "prefill", "model_size"):
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
    assert {r["kv_dtype"] for r in ctx} == {"float32", "float16", "q8_0"}  # the tiny model's head_dim is 64
    for r in ctx:
        _check_decode_row(r)
    f32 = {r["context"]: r["kv_bytes_per_position"] for r in ctx if r["kv_dtype"] == "float32"}
    f16 = {r["context"]: r["kv_bytes_per_position"] for r in ctx if r["kv_dtype"] == "float16"}
    q8 = {r["context"]: r["kv_bytes_per_position"] for r in ctx if r["kv_dtype"] == "q8_0"}
    assert all(f32[c] == 2 * f16[c] for c in f32)
    assert all(32 * q8[c] == 9 * f32[c] for c in f32)  # an int8 and a 32nd of a float32 scale per element
    sizes = _load(bench_out, "model_size")["rows"]
    for r in sizes:
        _check_decode_row(r)
    assert {r["weights"] for r in sizes} == {"file", "q4_1", "q4_k_m"}
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
    assert {r["engine"] for r in peers["rows"]} == {"pyinfer", "pyinfer exact", "pyinfer generate()"}
    assert peers["ratios"] == [] and peers["exact_ratios"] == []  # no peers, no transformers
    assert all(r["pp"] > 0 and r["tg"] > 0 for r in peers["rows"] if r["engine"] == "pyinfer exact")
    # generate() is timed one token per pass, as tg: its default prompt-lookup drafts would
    # time speculation instead of the loop's own cost.
    assert [r["draft_tokens"] for r in peers["rows"] if r["engine"] == "pyinfer generate()"] == [0, 0]
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

    monkeypatch.setattr(studies, "peer_makers", lambda *_: ([("llama.cpp", Peer)], {}))
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
    # The 5- and 6-bit types and the K-quants count too: a Q4_K_M mix has a ceiling.
    km = tmp_path / "tiny.q4_k_m.gguf"
    quantize_model(tiny, km, "q4_k_m")
    rk = GGUFReader(km)
    kmats = [t for n, t in rk.tensors.items() if n.startswith("blk.") and len(t.shape) == 2]
    kmats.append(rk.tensors.get("output.weight") or rk.tensors["token_embd.weight"])
    assert GGMLType.Q4_K in {t.type for t in kmats}
    assert studies.int8_slots_per_token(rk) == pytest.approx(sum(t.n_elements * studies.INT8_SLOTS[t.type]
                                                                 for t in kmats))


def _openvino_python() -> str:
    """An interpreter with openvino-genai (PYINFER_OPENVINO_PYTHON; CI makes one beside its
    virtualenv). Without it the test skips, except in CI, where it must run."""
    python = os.environ.get("PYINFER_OPENVINO_PYTHON")
    if not python:
        if os.environ.get("CI"):
            raise RuntimeError("CI must set PYINFER_OPENVINO_PYTHON to a Python with openvino-genai")
        pytest.skip("set PYINFER_OPENVINO_PYTHON to a Python with openvino-genai")
    return python


def test_openvino_peer_times_the_same_file(default_model: Path, tmp_path: Path) -> None:
    """OpenVINO GenAI reads the default model's GGUF in its own interpreter and answers pp and
    tg like the other engines; the peers study lists it; a file it cannot read is reported."""
    python = _openvino_python()
    makers, _ = peer_makers(None, python)
    assert [n for n, _ in makers if n == "openvino"] == ["openvino"]
    e = OpenVINOEngine(python, default_model, 1)
    try:
        assert e.load_s > 0 and e.info["version"]
        ids = [int(t) for t in np.random.default_rng(1).integers(100, 40000, 48)]
        rates = [e.pp(ids), e.pp(ids), e.tg(ids[0], 8)]
        assert all(np.isfinite(r) and r > 0 for r in rates), rates
    finally:
        e.close()
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(RuntimeError, match="OpenVINO worker"):
        OpenVINOEngine(python, bad, 1)


def test_last_level_cache_is_the_highest_level_listed(tmp_path: Path) -> None:
    for name, level, size in (("index0", "1", "48K"), ("index2", "2", "2048K"), ("index3", "3", "480M")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "level").write_text(level + "\n")
        (tmp_path / name / "size").write_text(size + "\n")
    assert last_level_cache_bytes(tmp_path) == 480 << 20
    assert last_level_cache_bytes(tmp_path / "missing") is None
    (tmp_path / "index3" / "size").write_text("lots\n")  # an entry it cannot read is passed over
    assert last_level_cache_bytes(tmp_path) == 2048 << 10
    (tmp_path / "index3" / "size").write_text("491520K\n")  # as Linux writes it
    assert last_level_cache_bytes(tmp_path) == 480 << 20


def test_shares_past_the_ceiling_are_explained() -> None:
    row = {"weight_bytes_per_token": 90e6, "kv_bytes_per_token": 2e6, "pct_of_ceiling": 99.0}
    assert cache_note([row], 480 << 20) == []
    batched = {"batch": 4, "weight_bytes_per_token": 25e6, "kv_bytes_per_token": 1e6, "pct_of_ceiling": 112.0}
    note = " ".join(cache_note([row, batched, {"batch": 4, "weight_bytes_per_token": 1e9, "kv_bytes_per_token": 0}],
                               480 << 20))
    # The step of four sequences reads the weights once and four KV caches: 104 MB.
    assert "up to 104 MB read per step" in note and "cache of 503 MB" in note and "probe" not in note
    assert "caches hold part" in " ".join(cache_note([batched], None))
    # Past an arithmetic ceiling, or in a step larger than the cache, the cache is not the reason.
    assert cache_note([dict(batched, ceiling_bound="int8")], 480 << 20) == []
    big = {"weight_bytes_per_token": 900e6, "kv_bytes_per_token": 0.0, "pct_of_ceiling": 103.0}
    note = " ".join(cache_note([big], 480 << 20))
    assert "from 900 MB" in note and "read probe measured less" in note and "found part" not in note


def test_a_child_trial_reports_how_it_ended() -> None:
    assert trial_in_child("pass", []) is None
    assert "SIGABRT" in (trial_in_child("import os; os.abort()", []) or "")
    # The arguments reach the child; a message on its stderr comes back with the status.
    assert trial_in_child("import sys; sys.exit(0 if sys.argv[1:] == ['a', 'b'] else 'wrong')", ["a", "b"]) is None
    assert "status 1: no model" in (trial_in_child("import sys; sys.exit('no model')", []) or "")
    assert "did not finish in 1 s" in (trial_in_child("import time; time.sleep(30)", [], timeout=1) or "")


def test_the_llama_cpp_trial_runs_on_the_default_model(default_model: Path) -> None:
    """The trial script itself (a typo in it would skip llama.cpp everywhere, silently), where
    llama-cpp-python is installed (the distribution: `llama_cpp` in this process may be
    pyinfer's alias, pyinfer.as_llama_cpp)."""
    try:
        importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llama-cpp-python is not installed")
    assert trial_in_child(engines._LLAMA_CPP_TRIAL, [str(default_model), "2"]) is None


def test_a_llama_cpp_that_faults_is_skipped_not_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A llama-cpp-python whose trial in a child dies is skipped with the reason, before the
    bench's own process loads it (where the fault would end every study after it)."""
    monkeypatch.setitem(sys.modules, "llama_cpp", type(sys)("llama_cpp"))
    crash = "import os, sys; assert sys.argv[1].endswith('m.gguf') and sys.argv[2] == '2'; os.abort()"  # given both
    monkeypatch.setattr(engines, "_LLAMA_CPP_TRIAL", crash)
    makers, skipped = peer_makers(None, None, tmp_path / "m.gguf", 2)
    assert "llama.cpp" not in [n for n, _ in makers]
    assert "SIGABRT" in skipped["llama.cpp"]
    monkeypatch.setattr(engines, "_LLAMA_CPP_TRIAL", "pass")
    makers, skipped = peer_makers(None, None, tmp_path / "m.gguf")
    assert "llama.cpp" in [n for n, _ in makers] and "llama.cpp" not in skipped


def test_llama_bench_peers_are_named(tmp_path: Path) -> None:
    """Several llama-bench binaries in one run (llama.cpp's and a fork's), each NAME=PATH named
    in the report; a bare PATH, even one holding "=", is "llama-bench"; two of one name are
    refused before anything runs."""
    odd = tmp_path / "a=b"
    odd.write_text("")
    assert llama_bench_peers(None) == []
    assert llama_bench_peers("/x/llama-bench") == [("llama-bench", "/x/llama-bench")]
    assert llama_bench_peers(["llama.cpp=/x/llama-bench", "ik=/y/llama-bench", str(odd)]) == [
        ("llama-bench llama.cpp", "/x/llama-bench"), ("llama-bench ik", "/y/llama-bench"), ("llama-bench", str(odd))]
    makers, _ = peer_makers(["llama.cpp=/x/llama-bench", "ik=/y/llama-bench"])
    benches = [(n, make(Path("m.gguf"), 2, 512)) for n, make in makers if n.startswith("llama-bench")]
    assert [(n, e.name, e.binary, e.n_threads) for n, e in benches] == [
        ("llama-bench llama.cpp", "llama-bench llama.cpp", "/x/llama-bench", 2),
        ("llama-bench ik", "llama-bench ik", "/y/llama-bench", 2)]
    with pytest.raises(ValueError, match="'llama-bench'"):
        llama_bench_peers(["/x/llama-bench", "/y/llama-bench"])


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
    # The gguf package reads it: every matrix, embedding and output head included, in the
    # target type; norms in F32; metadata intact.
    g = gguf.GGUFReader(out)
    types = {t.name: t.tensor_type.name for t in g.tensors}
    for name, t in types.items():
        assert t == ("F32" if name.endswith("norm.weight") else want_type(fmt, name)), name
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
        quantize_model(tiny, tmp_path / "x.gguf", "q3_k")
    with pytest.raises(ValueError, match="must not be the input"):
        quantize_model(tiny, tiny, "f16")
    # An output that cannot be written is refused before the work, and nothing is left behind.
    with pytest.raises(ValueError, match=f"the output {tmp_path} is a directory"):
        quantize_model(tiny, tmp_path, "q8_0")
    with pytest.raises(ValueError, match="the output's folder .*nope does not exist"):
        quantize_model(tiny, tmp_path / "nope" / "x.gguf", "q8_0")
    assert list(tmp_path.iterdir()) == [] and not list(tmp_path.parent.glob(f"{tmp_path.name}*.tmp"))


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    from pyinfer.gguf import GGUFWriter

    dst = tmp_path / "m.gguf"
    dst.write_bytes(b"the old file")
    w = GGUFWriter(dst)
    w.add("general.architecture", "llama")
    w.add_tensor("t", np.ones(8, np.float32))

    class Unwritable:  # the tensor's bytes, failing as a full disk would, half way through
        size = 32

        def tobytes(self) -> bytes:
            raise OSError(28, "No space left on device")

    w._tensors["t"] = (w._tensors["t"][0], w._tensors["t"][1], Unwritable())
    with pytest.raises(OSError, match="No space left"):
        w.write()
    assert dst.read_bytes() == b"the old file" and sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]
    # A file written whole gets the mode open() gives (the temporary file's is private).
    w._tensors["t"] = (w._tensors["t"][0], w._tensors["t"][1], np.ones(8, np.float32))
    umask = os.umask(0o022)
    try:
        w.write()
    finally:
        os.umask(umask)
    assert dst.stat().st_mode & 0o777 == 0o644


# -- the serve study -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def serve_out(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pyinfer bench serve --quick` against pyinfer alone: the peers named do not exist, so
    both are reported as skipped."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    home = tmp_path_factory.mktemp("serve-home")
    out = home / "results"
    env = {**os.environ, "PYINFER_HOME": str(home)}
    r = subprocess.run([sys.executable, "-m", "pyinfer", "bench", "serve", "--quick", "--model", str(tiny),
                        "--out", str(out), "--threads", "1", "--peer-python", str(home / "no-python"),
                        "--peer-server", str(home / "no-llama-server")],
                       capture_output=True, text=True, cwd=home, env=env, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def _check_dist(r: dict, name: str, samples_s: list[float]) -> None:
    ms = np.asarray(samples_s) * 1e3
    mean, p50, p99 = r[f"mean_{name}_ms"], r[f"median_{name}_ms"], r[f"p99_{name}_ms"]
    assert mean == pytest.approx(float(ms.mean()))
    assert p50 == pytest.approx(float(np.median(ms)))
    assert ms.min() <= p50 <= p99 <= ms.max()
    assert ms.min() <= mean <= ms.max()


def test_serve_report_is_consistent(serve_out: Path) -> None:
    from pyinfer.bench.serve import KINDS, QUICK_PLAN

    rep = _load(serve_out, "serve")
    for key in ("machine", "versions", "commit", "time", "elapsed_s", "plan", "slo", "servers"):
        assert key in rep, key
    assert (serve_out / "serve.md").read_text().startswith("## Serving")
    if __import__("importlib").util.find_spec("matplotlib") is not None:
        assert (serve_out / "serve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(rep["skipped"]) == {"llama-cpp-python", "llama-server"} and rep["ratios"] == []
    assert "cannot start" in rep["skipped"]["llama-server"]
    assert [s["engine"] for s in rep["servers"]] == ["pyinfer"]
    rows = rep["rows"]
    assert [(r["engine"], r["concurrency"]) for r in rows] == [("pyinfer", c) for c in QUICK_PLAN.levels]
    for r in rows:
        s = r["samples"]
        assert r["requests"] == QUICK_PLAN.n_requests(r["concurrency"]) == len(s)
        assert r["completed"] == len(s) and r["failed"] == 0 and r["not_sent"] == 0 and not r["errors"]
        assert [x["kind"] for x in s] == [KINDS[i % len(KINDS)] for i in range(len(s))]
        # End-of-turn tokens banned: every reply runs to max_tokens, counted by the server.
        assert all(x["output_tokens"] == QUICK_PLAN.max_tokens and x["tokens_from"] == "usage" for x in s)
        assert all(x["prompt_tokens_from"] == "usage" for x in s)
        assert r["total_output_tokens"] == sum(x["output_tokens"] for x in s)
        assert r["total_input_tokens"] == sum(x["prompt_tokens"] for x in s) > 0
        ends = [x["sent_s"] + x["e2e_s"] for x in s]
        assert r["duration_s"] == pytest.approx(max(ends) - min(x["sent_s"] for x in s))
        assert r["output_throughput"] == pytest.approx(r["total_output_tokens"] / r["duration_s"])
        assert r["request_throughput"] == pytest.approx(r["completed"] / r["duration_s"])
        assert r["total_token_throughput"] == pytest.approx(
            (r["total_input_tokens"] + r["total_output_tokens"]) / r["duration_s"])
        for x in s:
            assert 0 < x["ttft_s"] <= x["e2e_s"]
            assert x["tpot_s"] == pytest.approx((x["e2e_s"] - x["ttft_s"]) / (x["output_tokens"] - 1))
            assert x["chunk_times_s"] == sorted(x["chunk_times_s"])
            assert x["chunk_times_s"][0] == pytest.approx(x["sent_s"] + x["ttft_s"])
        _check_dist(r, "ttft", [x["ttft_s"] for x in s])
        _check_dist(r, "e2el", [x["e2e_s"] for x in s])
        _check_dist(r, "tpot", [x["tpot_s"] for x in s])
        _check_dist(r, "itl", [b - a for x in s for a, b in zip(x["chunk_times_s"], x["chunk_times_s"][1:])])
        assert r["median_ttft_ms"] <= r["median_e2el_ms"] and r["p99_ttft_ms"] <= r["p99_e2el_ms"]
        good = [x for x in s if x["ttft_s"] < rep["slo"]["ttft_ms"] / 1e3 and x["tpot_s"] < rep["slo"]["tpot_ms"] / 1e3]
        assert r["good_requests"] == len(good)
        assert r["request_goodput"] == pytest.approx(len(good) / r["duration_s"])
        assert set(r["median_ttft_ms_by_kind"]) == set(KINDS)
    assert rows[0]["output_throughput_vs_lowest"] == pytest.approx(1.0)
    assert rows[1]["output_throughput_vs_lowest"] == pytest.approx(
        rows[1]["output_throughput"] / rows[0]["output_throughput"])


def test_serve_summary_of_known_times() -> None:
    from pyinfer.bench.serve import Plan, Result, sse_events, summarize

    plan = Plan(levels=(2,), max_tokens=3, ttft_slo_s=0.5, tpot_slo_s=0.15)
    a = Result(0, "short_chat", sent=0.0, first=0.2, end=0.4, chunk_times=[0.2, 0.3, 0.4], output_tokens=3,
               prompt_tokens=10, tokens_from="usage")
    b = Result(1, "long_document", sent=0.1, first=0.9, end=1.5, chunk_times=[0.9, 1.2, 1.5], output_tokens=3,
               prompt_tokens=30, tokens_from="usage")
    c = Result(2, "shared_system", sent=0.4, error="HTTP 503: busy")
    out = summarize([a, b, c], 1.5, plan)
    assert out["completed"] == 2 and out["failed"] == 1
    assert out["total_output_tokens"] == 6 and out["total_input_tokens"] == 40
    assert out["output_throughput"] == pytest.approx(4.0) and out["request_throughput"] == pytest.approx(4 / 3)
    assert out["mean_ttft_ms"] == pytest.approx(500.0) and out["median_ttft_ms"] == pytest.approx(500.0)
    assert out["p99_ttft_ms"] == pytest.approx(200 + 0.99 * 600)
    assert out["mean_tpot_ms"] == pytest.approx(200.0)  # (0.2 / 2 + 0.6 / 2) / 2
    assert out["mean_itl_ms"] == pytest.approx(200.0) and out["median_itl_ms"] == pytest.approx(200.0)
    assert out["good_requests"] == 1 and out["request_goodput"] == pytest.approx(1 / 1.5)  # b misses both
    assert out["median_ttft_ms_by_kind"] == {"short_chat": pytest.approx(200.0), "long_document": pytest.approx(800.0)}
    lines = [b": ping\r\n", b"\r\n", b'data: {"x": 1}\r\n', b"event: message\n", b'data:{"y":2}\n', b"data: [DONE]\n",
             b'data: {"z": 3}\n']
    assert list(sse_events(iter(lines))) == [{"x": 1}, {"y": 2}]


def test_serve_median_round() -> None:
    from pyinfer.bench.serve import _median_round

    runs = [{"round": i, "output_throughput": v, "median_ttft_ms": 10.0 * i} for i, v in enumerate([30.0, 10.0, 20.0])]
    row = _median_round(runs)
    assert row["round"] == 2 and row["rounds"] == 3
    assert row["output_throughput_rounds"] == [30.0, 10.0, 20.0] and row["median_ttft_ms_rounds"] == [0.0, 10.0, 20.0]
    assert _median_round(runs[:2])["round"] == 1  # of two, the lower


def test_serve_waits_for_a_busy_server_to_go_idle(tmp_path: Path) -> None:
    """A server process still computing after its clients are gone (spinning for a while,
    then asleep): the next turn waits until it has settled, and not for an idle one."""
    from pyinfer.bench.serve import Server, ServerSpec

    script = (
        "import http.server, sys, threading, time\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers(); self.wfile.write(b'{}')\n"
        "    def log_message(self, *a): pass\n"
        "def spin():\n"
        "    time.sleep(float(sys.argv[2]))\n"
        "    t = time.time()\n"
        "    while time.time() - t < float(sys.argv[3]): pass\n"
        "threading.Thread(target=spin, daemon=True).start()\n"
        "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")
    spin = Server(ServerSpec("spinning", [sys.executable, "-c", script, "{port}", "0", "3"], 1), tmp_path)
    try:
        assert (spin.cpu_seconds() or 0) >= 0
        waited = spin.wait_idle(30.0)
        assert waited is not None and 1.5 <= waited < 10
        assert spin.wait_idle(30.0, window_s=0.5) < 1.5  # settled now: one window
    finally:
        spin.stop()
    bounded = Server(ServerSpec("busy", [sys.executable, "-c", script, "{port}", "0", "60"], 1), tmp_path)
    try:
        t = time.perf_counter()
        assert bounded.wait_idle(2.0) >= 2.0 and time.perf_counter() - t < 5  # never settles: the bound
    finally:
        bounded.stop()


def test_serve_level_is_cut_off_at_its_time_limit() -> None:
    """A server that streams too slowly: no request starts after the level's limit, those
    still running are cut off and counted failed, and the level ends within its bounds."""
    import http.server
    import threading
    import time

    from pyinfer.bench.serve import CUT_OFF, Plan, run_level, summarize

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            try:
                for _ in range(50):  # 5 s of chunks, far past the limits below
                    self.wfile.write(b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n')
                    self.wfile.flush()
                    time.sleep(0.1)
                self.wfile.write(b"data: [DONE]\n\n")
            except OSError:
                pass

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        plan = Plan(levels=(2,), max_tokens=4, level_timeout_s=0.3, drain_timeout_s=0.4, request_timeout_s=10)
        t = time.perf_counter()
        res, wall, not_sent = run_level(srv.server_address[1], 2, 6, plan, [0], quick=True)
        assert time.perf_counter() - t < 3
    finally:
        srv.shutdown()
        srv.server_close()
    assert len(res) == 2 and not_sent == 4  # the first two only: they outlast the limit
    assert all(r.error == CUT_OFF and r.output_tokens > 0 and r.end is not None for r in res)
    assert wall == max(r.end for r in res) - min(r.sent for r in res)
    out = summarize(res, wall, plan)
    assert out["completed"] == 0 and out["failed"] == 2 and out["total_output_tokens"] == 0


def test_speculative_report_is_consistent(bench_out: Path) -> None:
    rep = _load(bench_out, "speculative")
    assert {r["kind"] for r in rep["rows"]} == {"grounded", "open"}
    for r in rep["rows"]:
        assert r["plain_tokens_per_s"] == median(r["plain_samples"]) > 0
        assert r["draft_tokens_per_s"] == median(r["draft_samples"]) > 0
        assert r["speedup"] == pytest.approx(r["draft_tokens_per_s"] / r["plain_tokens_per_s"])
        assert 0 <= r["draft_accepted"] <= r["draft_tokens"]
    assert set(rep["geomean_speedup"]) == {"grounded", "open"}


def test_contention_report_is_consistent(bench_out: Path) -> None:
    rep = _load(bench_out, "contention")
    if len(os.sched_getaffinity(0)) < 2:
        assert "skipped" in rep and "2 or more cores" in rep["skipped"]
        return
    rows = {(r["condition"], r["threads"]): r for r in rep["rows"]}
    assert set(rows) == {(c, t) for c in ("idle", "one core busy") for t in (1, 2)}
    for r in rows.values():
        assert r["tokens_per_s"] == median(r["tokens_per_s_samples"]) > 0
        assert len(r["tokens_per_s_samples"]) == 2  # quick: two repeats
    for c, ratio in rep["ratios"].items():
        assert ratio == pytest.approx(rows[(c, 2)]["tokens_per_s"] / rows[(c, 1)]["tokens_per_s"])
    assert rep["target_met"] == (rep["ratios"]["one core busy"] >= 1.0)
    assert rep["competitor_cpu"] in os.sched_getaffinity(0)


def test_synthetic_q4_k_m_is_llama_cpp_s_mix(tmp_path: Path) -> None:
    """A synthetic Q4_K_M file: Q6_K for the head and for attn_v / ffn_down on the layers
    llama.cpp keeps at more bits, Q4_K elsewhere, and the 32-element type where a row is not
    whole super-blocks; it loads and decodes."""
    from pyinfer.bench.synthetic import Shape, write_synthetic
    from pyinfer.gguf import GGUFReader
    from pyinfer.gguf_types import GGMLType
    from pyinfer.model import Model

    shape = Shape(n_layer=8, n_embd=256, n_head=4, n_head_kv=2, n_ff=544, n_vocab=512, n_ctx=256)
    path = write_synthetic(tmp_path / "mix.gguf", shape, "q4_k_m")
    with GGUFReader(path) as r:
        types = {name: t.type for name, t in r.tensors.items()}
        assert r.metadata["general.file_type"] == 15
    assert types["output.weight"] == GGMLType.Q6_K and types["token_embd.weight"] == GGMLType.Q4_K
    # n_layer 8: layers 0 and 7 (the first and last eighth) and 3, 6 (every third between)
    six = {i for i in range(8) if types[f"blk.{i}.attn_v.weight"] == GGMLType.Q6_K}
    assert six == {0, 3, 6, 7}
    assert types["blk.1.attn_q.weight"] == GGMLType.Q4_K
    assert types["blk.1.ffn_down.weight"] == GGMLType.Q5_0  # 544 columns: not whole 256-blocks
    assert types["blk.0.ffn_down.weight"] == GGMLType.Q8_0  # Q6_K's 32-element stand-in
    m = Model.load(path, n_threads=1)
    assert len(m.generate("ab", max_tokens=3, temperature=0).token_ids) == 3
    with pytest.raises(ValueError, match="unknown weight mix"):
        write_synthetic(tmp_path / "bad.gguf", shape, "q3_k_xl")
