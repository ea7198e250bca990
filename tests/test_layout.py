"""The layering of csrc/: kernels include only kernels/ headers, and no file but the ops drivers
(csrc/ops/) and the dispatcher (csrc/runtime/dispatch.*) reaches the kernel table."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[1] / "csrc"
SOURCES = sorted(p for p in CSRC.rglob("*") if p.suffix in (".h", ".cpp"))
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# A call of the active table or of one ISA's table, or a use of the table's type.
TABLE_USE = re.compile(r"\b(kernels|kernels_for)\s*\(|\bKernelTable\b")


def _rel(p: Path) -> str:
    return p.relative_to(CSRC).as_posix()


def _code(p: Path) -> str:
    """The file with its // and /* */ comments and string literals blanked."""
    text = p.read_text()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)
    return re.sub(r"//[^\n]*", "", text)


def _may_reach_table(rel: str) -> bool:
    return rel.startswith("ops/") or rel in ("runtime/dispatch.h", "runtime/dispatch.cpp")


def test_the_layers_are_there():
    assert SOURCES, f"no C++ sources under {CSRC}"
    for folder in ("kernels/ref", "kernels/x86", "runtime", "ops", "probes", "models"):
        assert any(_rel(p).startswith(folder + "/") for p in SOURCES), f"csrc/{folder}/ holds no source"
    assert (CSRC / "kernels" / "abi.h").is_file()


@pytest.mark.parametrize("path", [p for p in SOURCES if _rel(p).startswith("kernels/")], ids=_rel)
def test_kernels_include_only_kernel_headers(path):
    others = [inc for inc in INCLUDE.findall(path.read_text()) if not inc.startswith("kernels/")]
    assert not others, f"csrc/{_rel(path)} includes {others}: a kernel file may include kernels/ headers only"


@pytest.mark.parametrize("path", [p for p in SOURCES if not _may_reach_table(_rel(p))], ids=_rel)
def test_only_drivers_and_the_dispatcher_reach_the_kernel_table(path):
    rel = _rel(path)
    includes = INCLUDE.findall(path.read_text())
    assert "runtime/dispatch.h" not in includes, f"csrc/{rel} includes runtime/dispatch.h: call an ops driver"
    uses = sorted({m.group(0) for m in TABLE_USE.finditer(_code(path))})
    assert not uses, f"csrc/{rel} reaches the kernel table ({', '.join(uses)}): call an ops driver"


def test_the_rule_sees_a_violation(tmp_path):
    """The pattern catches a direct call and ignores the same words in a comment."""
    bad = tmp_path / "bad.cpp"
    bad.write_text('// kernels() is fine here\nvoid f() { kernels().add_f32(a, b, c, n); }\n')
    assert TABLE_USE.search(_code(bad))
    bad.write_text('// kernels() is fine here\nconst char* s = "kernels()";\n')
    assert not TABLE_USE.search(_code(bad))


TUNING = CSRC.parent / "docs" / "tuning.md"
# A measurement in a comment: a rate, a machine, a timing. These belong in docs/tuning.md.
FIGURE = re.compile(r"GB/s|GFLOP/s|GOP/s|tok/s|\bZen\b|\d\s*ms\b|\d\s*%")


def _comments(p: Path) -> list[str]:
    text = p.read_text()
    return re.findall(r"//[^\n]*", text) + re.findall(r"/\*.*?\*/", text, flags=re.S)


@pytest.mark.parametrize("path", SOURCES, ids=_rel)
def test_tuning_figures_live_in_the_docs(path):
    found = [c.strip() for c in _comments(path) if FIGURE.search(c.replace("% kKeyBlock", "").replace("% 4", ""))]
    assert not found, f"csrc/{_rel(path)}: move the measurement to docs/tuning.md, keep the why: {found}"


def test_tuning_references_name_a_section():
    """Every (docs/tuning.md, "...") in the code quotes words of one of the page's headings."""
    headings = [h.lower() for h in re.findall(r"^## (.+)$", TUNING.read_text(), re.M)]
    refs = []
    for p in SOURCES:
        flat = re.sub(r"\s*\n\s*//\s*", " ", p.read_text())
        refs += [(p, r) for r in re.findall(r'docs/tuning\.md,\s*"([^"]+)"', flat)]
    assert refs, "no code comment points at docs/tuning.md"
    for p, r in refs:
        assert any(r.lower() in h for h in headings), f"csrc/{_rel(p)} points at {r!r}, no heading of {TUNING.name}"


# The version the test extras pin: other majors lay some constructs out differently.
CLANG_FORMAT_MAJOR = 23


def _clang_format() -> str | None:
    beside = Path(sys.executable).with_name("clang-format")  # the venv's, from the PyPI wheel
    return str(beside) if beside.is_file() else shutil.which("clang-format")


def test_csrc_is_clang_formatted():
    exe = _clang_format()
    if exe is None:
        pytest.skip("clang-format is not installed (pip install '.[test]')")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True).stdout
    major = re.search(r"version (\d+)\.", version)
    if major is None or int(major.group(1)) != CLANG_FORMAT_MAJOR:
        pytest.skip(f"{version.strip()} is not the pinned clang-format {CLANG_FORMAT_MAJOR} (pip install '.[test]')")
    r = subprocess.run([exe, "--dry-run", "--Werror", *map(str, SOURCES)], cwd=CSRC.parent,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, "clang-format -i the files below:\n" + r.stderr[-4000:]
