"""Seed corpora for the fuzz harnesses, written by the project's own code at run time (no
file is fetched or committed): valid GGUF files from GGUFWriter and malformed ones cut from
them, texts for the tokenizer, and templates for the chat renderer."""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

import numpy as np

from pyinfer.bench.synthetic import CHAT_TEMPLATE, Shape, write_synthetic_llama
from pyinfer.gguf import GGUFWriter
from pyinfer.gguf_types import GGMLType, ValueType


def gguf_seeds() -> list[bytes]:
    """Small GGUF files: every value type, arrays, several tensor types, a whole (tiny)
    llama model; then truncations and single-field corruptions of them."""
    out: list[bytes] = []
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "s.gguf"
        w = GGUFWriter(p)
        w.add("general.architecture", "llama")
        w.add("u8", 7, ValueType.UINT8)
        w.add("i16", -3, ValueType.INT16)
        w.add("f64", 2.5, ValueType.FLOAT64)
        w.add("flag", True)
        w.add("name", "seed")
        w.add("ints", [1, 2, 3])
        w.add("strs", ["a", "bc", ""], ValueType.ARRAY, ValueType.STRING)
        w.add("floats", np.arange(4, dtype=np.float32))
        rng = np.random.default_rng(0)
        for t in (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1):
            w.add_tensor(f"t.{t.name}", rng.standard_normal((2, 64)).astype(np.float32), t)
        w.write()
        out.append(p.read_bytes())
        w = GGUFWriter(p, alignment=64, version=2)
        w.add_tensor("only", np.ones(32, np.float32))
        w.write()
        out.append(p.read_bytes())
        small = Shape(n_layer=1, n_embd=64, n_head=2, n_head_kv=1, n_ff=64, n_vocab=260, n_ctx=64)
        write_synthetic_llama(p, small, GGMLType.Q8_0)
        out.append(p.read_bytes())
    cuts: list[bytes] = []
    for b in out[:2]:
        cuts += [b[:n] for n in (4, 8, 16, 24, 40, len(b) // 2, len(b) - 1)]
        # a huge tensor count, a huge string length, an unknown value type
        cuts.append(b[:8] + struct.pack("<Q", 2**62) + b[16:])
        cuts.append(b[:24] + struct.pack("<Q", 2**40) + b[32:])
        cuts.append(b[:32 + 20] + struct.pack("<I", 99) + b[56:])
    return out + cuts


def text_seeds() -> list[bytes]:
    texts = ["Hello, world!", "  leading and trailing  ", "line\nbreaks\r\n\ttabs", "1234567890 3.14",
             "naïve café — “quotes”", "日本語のテキスト", "emoji 🙂👍🏽 family 👨\u200d👩\u200d👧",
             "<|im_start|>user\nhi<|im_end|>", "<|endoftext|>", "don't won't it's", "a" * 300, "\x00\x01\x7f"]
    return [t.encode("utf-8", "surrogatepass") for t in texts] + [bytes(range(256))]


def template_seeds() -> list[bytes]:
    templates = [
        CHAT_TEMPLATE,
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{{ m.content | trim }}"
        "{% else %}[{{ m.role | upper }}] {{ m.content }}{% endif %}{% endfor %}",
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ loop.index }}"
        "{{ m.content[:10] }}{% endfor %}{{ ns.n }}",
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}",
        "{{ messages | tojson }}{{ (messages | length) * 3 }}{{ 'x' * 5 }}",
        "{% macro f(x) %}{{ x }}{{ f(x) }}{% endmacro %}{{ f(1) }}",
        "{% for i in range(5) %}{% for j in range(i) %}{{ i * j }}{% endfor %}{% endfor %}",
        "{{ '%s-%d' % ('a', 3) }}{{ 'abc'.upper() }}{{ 'a,b'.split(',') | join('|') }}",
    ]
    return [t.encode() for t in templates]


def kernel_seeds() -> list[bytes]:
    """Inputs the kernel harness decodes into calls: bytes from a fixed generator (each byte
    picks a size, a type or a value), one per call kind and a few longer ones."""
    rng = np.random.default_rng(1)
    return [bytes([i]) + rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            for i in range(8) for n in (16, 256, 4096)]


def write(kind: str, directory: Path) -> int:
    """Write the seeds of a harness ("gguf", "tokenizer", "chat", "kernels") into directory;
    their count."""
    seeds = {"gguf": gguf_seeds, "tokenizer": text_seeds, "chat": template_seeds, "kernels": kernel_seeds}[kind]()
    directory.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(seeds):
        (directory / f"seed-{i:03d}").write_bytes(s)
    return len(seeds)
