"""A model file that changes under a loaded model: truncated, written in place or grown, the
next forward pass refuses with a GGUFError naming the file and what changed, instead of a
SIGBUS or silently different weights; a file replaced by rename leaves the model as it was."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pyinfer import GGUFError, Model
from pyinfer.bench.synthetic import write_synthetic_llama
from pyinfer.gguf import GGUFReader

IDS = [5, 70, 200, 33]


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_synthetic_llama(tmp_path / "tiny.gguf", "tiny", seed=3)


def _bump_mtime(path: Path) -> None:
    """A modification time clearly after the last one, whatever the file system's granularity."""
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))


def test_truncation_after_load_is_an_error_not_a_sigbus(tiny: Path) -> None:
    # In a child process: were the check missing, the read past the end would kill it.
    script = textwrap.dedent(f"""
        import os
        from pyinfer import GGUFError, Model
        m = Model.load({str(tiny)!r}, repack=False, n_threads=1)
        ctx = m.context(n_ctx=16)
        ctx.eval({IDS!r})
        os.truncate({str(tiny)!r}, 4096)
        try:
            m.context(n_ctx=16).eval({IDS!r})
        except GGUFError as e:
            print("refused:", e)
        try:
            m.decode_batch([ctx], [1])
        except GGUFError as e:
            print("refused:", e)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, (r.returncode, r.stderr)
    lines = r.stdout.splitlines()
    assert len(lines) == 2, r.stdout
    for line in lines:
        assert line.startswith(f"refused: {tiny}: the GGUF file changed after it was loaded: truncated from ")
        assert "to 4096 bytes" in line and "load it again" in line


def test_writing_in_place_is_detected(tiny: Path) -> None:
    m = Model.load(tiny, n_threads=1)
    before = m.context(n_ctx=16).eval(IDS).copy()
    with open(tiny, "r+b") as f:  # same size, same inode, other bytes
        f.seek(-64, os.SEEK_END)
        f.write(b"\xff" * 64)
    _bump_mtime(tiny)
    with pytest.raises(GGUFError, match=r"tiny\.gguf: the GGUF file changed after it was loaded: modified in place"):
        m.context(n_ctx=16).eval(IDS)
    with pytest.raises(GGUFError, match="modified in place"):
        m.generate(IDS, max_tokens=1)
    # The refusal came before any work: a fresh load of the file sees the new bytes.
    assert Model.load(tiny, n_threads=1).context(n_ctx=16).eval(IDS).shape == before.shape


def test_growing_is_detected(tiny: Path) -> None:
    m = Model.load(tiny, n_threads=1)
    size = tiny.stat().st_size
    with open(tiny, "ab") as f:
        f.write(b"\0" * 100)
    with pytest.raises(GGUFError, match=rf"grown from {size} to {size + 100} bytes"):
        m.context(n_ctx=16).eval(IDS)


def test_replacing_by_rename_keeps_the_loaded_model(tiny: Path, tmp_path: Path) -> None:
    m = Model.load(tiny, n_threads=1)
    before = m.context(n_ctx=16).eval(IDS).copy()
    other = write_synthetic_llama(tmp_path / "other.gguf", "tiny", seed=4)
    os.replace(other, tiny)  # what GGUFWriter and downloaders do: a new inode at the path
    np.testing.assert_array_equal(m.context(n_ctx=16).eval(IDS), before)
    assert not np.array_equal(Model.load(tiny, n_threads=1).context(n_ctx=16).eval(IDS), before)


def test_an_untouched_file_passes_and_a_closed_reader_says_so(tiny: Path) -> None:
    r = GGUFReader(tiny)
    r.check_unchanged()
    _bump_mtime(tiny)  # only the time: still a change, the bytes could have been rewritten
    with pytest.raises(GGUFError, match="modified in place"):
        r.check_unchanged()
    r.close()
    with pytest.raises(GGUFError, match=r"tiny\.gguf: the GGUF reader is closed"):
        r.check_unchanged()


def test_readers_do_not_leak_descriptors(tiny: Path) -> None:
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        with GGUFReader(tiny) as r:
            r.check_unchanged()
        GGUFReader(tiny)  # dropped without close: the descriptor goes with the object
    assert len(os.listdir("/proc/self/fd")) <= fds + 2
