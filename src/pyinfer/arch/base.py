"""What an architecture's description is: its config from GGUF metadata, the tensors it reads,
and the metadata keys it implements, tolerates or refuses.

A file loads only if every tensor in it is one the architecture reads (or knows to be
harmless) and every metadata key in the architecture's namespace is implemented or known not
to change the computation: a model is never run with part of its file silently ignored.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Namespaces whose keys never change the forward pass: descriptions of the file, the tokenizer
# (which validates its own keys), the quantizer's notes. `split.*` is checked on its own.
NEUTRAL_NAMESPACES = ("general.", "tokenizer.", "quantize.")


class UnsupportedModelError(ValueError):
    """The file holds a tensor or metadata key its architecture's forward pass does not implement."""


@dataclass(frozen=True)
class Config:
    """A model's dimensions and constants: what the C++ forward pass and the NumPy reference
    take. `params()` is the dict of numbers the native model is built from."""

    architecture: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    rope_base: float
    rms_eps: float
    rope_freq_scale: float = 1.0  # linear position interpolation: positions times this
    tied_output: bool = False  # the output head is the embedding table

    def params(self) -> dict[str, float]:
        return {
            "n_layer": self.n_layer, "n_embd": self.n_embd, "n_head": self.n_head,
            "n_head_kv": self.n_head_kv, "head_dim": self.head_dim, "n_ff": self.n_ff,
            "n_vocab": self.n_vocab, "rope_base": self.rope_base, "rms_eps": self.rms_eps,
            "rope_freq_scale": self.rope_freq_scale,
        }


@dataclass(frozen=True)
class Description:
    """A file as its architecture reads it: the config and the names of the tensors the
    forward pass takes (tensors known to be harmless are left out)."""

    config: Config
    tensors: tuple[str, ...]


@dataclass(frozen=True)
class Architecture:
    """One architecture: how its config comes from metadata, the tensors it reads, and which
    of the keys in its namespace (`<name>.` prefix, without it here) it implements."""

    name: str
    # metadata, tensor shapes (name -> GGML-order shape) -> Config; raises UnsupportedModelError
    make_config: Callable[[Architecture, Mapping[str, Any], Mapping[str, tuple[int, ...]]], Config]
    # Tensor names (regular expressions, fully matched) the forward pass reads; `{L}` stands for
    # a layer number. Required ones must be present (the C++ model names what is missing).
    tensors: tuple[str, ...]
    # Tensors some converters write that no forward pass needs (e.g. precomputed RoPE tables).
    harmless_tensors: tuple[str, ...] = ()
    # Keys (without the namespace) the config reads: implemented, each checked there.
    implemented_keys: frozenset[str] = frozenset()
    # Keys that do not change the computation (the training context, the vocabulary size).
    harmless_keys: frozenset[str] = frozenset()
    _patterns: dict[str, re.Pattern[str]] = field(default_factory=dict, compare=False, repr=False)

    def key(self, suffix: str) -> str:
        return f"{self.name}.{suffix}"

    def _match(self, patterns: Iterable[str], name: str) -> bool:
        for p in patterns:
            rx = self._patterns.get(p)
            if rx is None:
                rx = self._patterns[p] = re.compile(p.replace(".", r"\.").replace("{L}", r"(0|[1-9][0-9]*)"))
            if rx.fullmatch(name):
                return True
        return False

    def check_keys(self, metadata: Mapping[str, Any]) -> None:
        """UnsupportedModelError naming the first key that would change the computation and is
        not implemented: in this architecture's namespace and not listed, or outside every
        namespace a model file uses."""
        prefix = self.name + "."
        for key, value in metadata.items():
            if key.startswith(prefix):
                k = key[len(prefix):]
                if k in self.implemented_keys or k in self.harmless_keys:
                    continue
                raise UnsupportedModelError(f"{key} = {_show(value)} is not supported by the {self.name} architecture")
            if key.startswith("split."):
                if key == "split.count" and (isinstance(value, bool) or not isinstance(value, int) or value > 1):
                    raise UnsupportedModelError(
                        f"split.count = {value}: the model is split across {value} files; merge them first"
                    )
                continue
            if not key.startswith(NEUTRAL_NAMESPACES):
                raise UnsupportedModelError(
                    f"metadata key {key} = {_show(value)} is not known to the {self.name} architecture"
                )

    def check_tensors(self, names: Iterable[str]) -> tuple[str, ...]:
        """The names the forward pass reads; UnsupportedModelError naming the first tensor
        that is neither read nor known to be harmless."""
        taken = []
        for n in names:
            if self._match(self.tensors, n):
                taken.append(n)
            elif not self._match(self.harmless_tensors, n):
                raise UnsupportedModelError(
                    f"tensor {n} is not used by the {self.name} architecture's forward pass; "
                    "a model that needs it would run wrong"
                )
        return tuple(taken)

    def describe(self, metadata: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> Description:
        self.check_keys(metadata)
        taken = self.check_tensors(shapes)
        return Description(self.make_config(self, metadata, shapes), taken)


def _show(value: Any) -> str:
    s = repr(value)
    return s if len(s) <= 60 else s[:57] + "..."


def get_key(arch: Architecture, md: Mapping[str, Any], suffix: str, default: Any = None) -> Any:
    """md[<arch>.<suffix>], or default; UnsupportedModelError when absent without a default."""
    v = md.get(arch.key(suffix), default)
    if v is None:
        raise UnsupportedModelError(f"metadata key {arch.key(suffix)} is missing")
    return v


def get_int(arch: Architecture, md: Mapping[str, Any], suffix: str, default: int | None = None) -> int:
    v = get_key(arch, md, suffix, default)
    if isinstance(v, bool):
        raise UnsupportedModelError(f"{arch.key(suffix)} = {_show(v)} is not an integer")
    try:
        return operator.index(v)
    except TypeError:
        raise UnsupportedModelError(f"{arch.key(suffix)} = {_show(v)} is not an integer") from None


# float32's largest finite value and smallest positive normal one
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38


def fits_float32(v: float) -> bool:
    """Whether v keeps its meaning as a float32 (the forward pass's parameters are): NaN,
    an infinity, a magnitude past float32's range, or one so small that it flushes toward
    zero, does not."""
    return math.isfinite(v) and (v == 0 or FLOAT32_TINY <= abs(v) <= FLOAT32_MAX)


def get_float(arch: Architecture, md: Mapping[str, Any], suffix: str, default: float | None = None) -> float:
    """md[<arch>.<suffix>] as a float that fits a float32 (a FLOAT64 value may not), or default."""
    v = get_key(arch, md, suffix, default)
    if isinstance(v, (bool, str)) or not (isinstance(v, (int, float)) or hasattr(v, "__float__")):
        raise UnsupportedModelError(f"{arch.key(suffix)} = {_show(v)} is not a number")
    try:
        f = float(v)
    except (OverflowError, TypeError, ValueError):
        raise UnsupportedModelError(f"{arch.key(suffix)} = {_show(v)} is not a number") from None
    if not fits_float32(f):
        raise UnsupportedModelError(f"{arch.key(suffix)} = {_show(v)} is not a finite float32 number "
                                    f"(magnitudes from {FLOAT32_TINY:.4g} to {FLOAT32_MAX:.4g}, or 0)")
    return f
