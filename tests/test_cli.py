"""The command line, run as a user would (a fresh process, outside the source tree)."""

from __future__ import annotations

import json
import re
import subprocess
import sys


def pyinfer(tmp_path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pyinfer", *args], capture_output=True, text=True,
                          input=stdin, cwd=tmp_path, timeout=300, check=False)


def test_run_streams_and_reports_timings(default_model, tmp_path):
    r = pyinfer(tmp_path, "run", "What is the capital of France?", "--model", str(default_model),
                "--temperature", "0", "--max-tokens", "12", "--precision", "exact")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    m = re.search(r"\[TTFT (\d+) ms \| prefill (\d+) tok at (\d+) tok/s \| decode (\d+) tok at ([\d.]+) tok/s, "
                  r"([\d.]+) GB/s of weights\]", r.stderr)
    assert m, r.stderr
    assert int(m.group(4)) >= 1 and float(m.group(5)) > 0


def test_run_json_raw(default_model, tmp_path):
    r = pyinfer(tmp_path, "run", "The capital of France is", "--raw", "--json", "--model", str(default_model),
                "--temperature", "0", "-n", "5")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["finish_reason"] == "length" and len(out["token_ids"]) == 5
    assert out["text"].startswith(" Paris")
    assert out["timings"]["prompt_tokens"] == 5 and out["timings"]["ttft_s"] > 0


def test_chat_keeps_history_and_resets(default_model, tmp_path):
    script = "Hello.\nHello.\n/reset\nHello.\n/exit\n"
    r = pyinfer(tmp_path, "chat", "--model", str(default_model), "--temperature", "0", "-n", "8",
                "--verbose", stdin=script)
    assert r.returncode == 0, r.stderr
    prefill = [int(n) for n in re.findall(r"prefill (\d+) tok", r.stderr)]
    assert len(prefill) == 3
    # The second turn's prompt holds the first exchange; after /reset it is the first again.
    assert prefill[1] > prefill[0] + 8 and prefill[2] == prefill[0]
    assert "(conversation cleared)" in r.stderr


def test_a_chat_turn_past_the_context_is_refused_and_the_session_goes_on(default_model, tmp_path):
    script = "Hello there, this is a long first message that will not fit in the context.\nHello.\n/exit\n"
    r = pyinfer(tmp_path, "chat", "--model", str(default_model), "--ctx", "40", "--temperature", "0", "-n", "4",
                "--verbose", stdin=script)
    assert r.returncode == 0, r.stderr
    assert re.search(r"the conversation with this message is \d+ tokens, more than --ctx 40", r.stderr), r.stderr
    # The refused turn is forgotten: the next one is answered from the system prompt and itself alone.
    assert len(re.findall(r"prefill (\d+) tok", r.stderr)) == 1


def test_bad_arguments_are_clear_errors(default_model, tmp_path):
    r = pyinfer(tmp_path, "run", "hi", "--model", str(default_model), "--temperature", "-1")
    assert r.returncode == 1 and "temperature must be >= 0" in r.stderr
    r = pyinfer(tmp_path, "run", "a prompt much longer than the eight tokens the context holds here",
                "--model", str(default_model), "--ctx", "8")
    assert r.returncode == 1 and re.search(r"the prompt has \d+ tokens, more than --ctx 8 holds: shorten it, "
                                           "or raise --ctx", r.stderr), r.stderr
    r = pyinfer(tmp_path, "run", "hi", "--model", "no-such-model")
    assert r.returncode == 1 and "known: " in r.stderr and "smollm2" in r.stderr
    # A prompt whose bytes are not UTF-8 (a shell passes them as they are) is named as such.
    r = subprocess.run([sys.executable, "-m", "pyinfer", "run", b"ok \xff\xfe", "--model", str(default_model)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False)
    assert r.returncode == 1 and "the prompt argument is not UTF-8 text: byte 0xff at character 3" in r.stderr
    (tmp_path / "afile").write_text("")
    r = pyinfer(tmp_path, "bench", "ceiling", "--quick", "--out", "afile")
    assert r.returncode == 1 and "the output folder afile is a file" in r.stderr and "Traceback" not in r.stderr
