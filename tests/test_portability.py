"""The installed build on CPUs older than this one, emulated by qemu-user: it must pick the
path the emulated CPU has, never execute an instruction it lacks (SIGILL), and refuse a
forced path it lacks with a clear error. QEMU emulates AVX2 but not AVX-512, so Westmere
(SSE4.2, no AVX) must run the scalar path and Haswell the AVX2 path."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

QEMU = shutil.which("qemu-x86_64")
TESTS = Path(__file__).parent
# Kernel tests that run in-process; the ones that start a fresh interpreter would run it
# natively, outside the emulator, so they are left out here.
KERNEL_TESTS = ["test_dequant_kernels.py", "test_bandwidth.py", "test_ops.py", "test_attention.py", "test_matmul.py"]
# Emulated, test_matmul.py alone takes 60-80 s; without its largest K (1536: no loop tail that
# 576 does not reach), the thread stress test and the many-part jobs (minutes emulated; they
# test the split over the threads, which runs the same on every path, natively on each), 27 s
# on Haswell.
KERNEL_SELECTION = "not env_ and not 1536 and not two_python_threads and not parts_in_one_job"

if QEMU is None and os.environ.get("CI"):
    pytest.fail("CI needs qemu-user (apt-get install qemu-user) for the portability tests", pytrace=False)
pytestmark = pytest.mark.skipif(
    QEMU is None or platform.machine() not in ("x86_64", "AMD64"),
    reason="needs qemu-x86_64 on an x86-64 host",
)


def emulated(cpu: str, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    # The emulated CPU decides the path: a PYINFER_ISA set for the outer run must not leak in.
    base = {k: v for k, v in os.environ.items() if k != "PYINFER_ISA"}
    return subprocess.run([QEMU, "-cpu", cpu, sys.executable, *args], capture_output=True, text=True,
                          timeout=1500, env=dict(base, **env), cwd=TESTS, check=False)


@pytest.mark.parametrize("cpu,expected", [("Westmere", "scalar"), ("Haswell", "avx2")])
def test_best_available_path_is_chosen(cpu, expected):
    r = emulated(cpu, ["-c", "import pyinfer; i = pyinfer.cpu_info(); print(i['isa'], *i['available'])"])
    assert r.returncode == 0, r.stderr
    isa, *available = r.stdout.split()
    assert isa == expected and available[-1] == expected


@pytest.mark.parametrize("cpu,missing", [("Westmere", "avx2"), ("Haswell", "avx512")])
def test_forcing_a_missing_path_is_a_clear_error(cpu, missing):
    r = emulated(cpu, ["-c", "import pyinfer"], PYINFER_ISA=missing)
    assert r.returncode == 1, (r.returncode, r.stderr)  # an exception, not a signal
    assert f"PYINFER_ISA={missing}: this CPU (or this build) does not support that path" in r.stderr


@pytest.mark.parametrize("cpu", ["Westmere", "Haswell"])
def test_kernel_tests_pass_without_sigill(cpu):
    r = emulated(cpu, ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", KERNEL_SELECTION, *KERNEL_TESTS])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " passed" in r.stdout
