"""Type stub for the Cython module pyinfer._bpe (see _bpe.pyx)."""

SPLIT_GPT2: int
SPLIT_LLAMA3: int

def char_class(c: str) -> int: ...

class BPE:
    cache_limit: int
    def __init__(
        self,
        tokens: list[str],
        merges: list[str],
        byte_chars: list[str],
        split_mode: int,
        isolate_numbers: bool = False,
        number_group: int = 0,
        ignore_merges: bool = False,
        cache_limit: int = 65536,
        index: dict[str, int] | None = None,
    ) -> None: ...
    def encode(self, text: str, out: list[int]) -> None: ...
    def split(self, text: str) -> list[str]: ...
    def word_ids(self, word: str, force_heap: bool = False) -> list[int]: ...
    def clear_cache(self) -> None: ...
    @property
    def cache_size(self) -> int: ...
