"""`pyinfer serve` as a real process on a free loopback port, for the tests that drive it
(test_server, test_web): started, waited for until /health answers, stopped."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(model: Path, log: Path, *args: str, timeout: float = 90) -> Iterator[str]:
    """Run `pyinfer serve --model model args...` (output in log) and yield its URL."""
    port = free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pyinfer", "serve", "--model", str(model), "--port", str(port), *args],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYINFER_API_KEY": ""},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                pytest.fail(f"pyinfer serve exited with {proc.returncode}:\n{log.read_text()}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"pyinfer serve did not answer /health:\n{log.read_text()}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def metrics(url: str, key: str | None = None) -> dict[str, float]:
    """/metrics as {name{labels}: value}."""
    r = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {key}"} if key else {})
    assert r.status_code == 200
    out = {}
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out
