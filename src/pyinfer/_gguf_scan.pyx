# cython: language_level=3, boundscheck=False, wraparound=False
"""Fast, bounds-checked scanning of GGUF string arrays (tokenizer vocabularies, merges)."""

from libc.string cimport memcpy

from pyinfer.errors import GGUFError


def read_string_array(const unsigned char[::1] buf, Py_ssize_t pos, Py_ssize_t count, str field):
    """Decode `count` GGUF strings (u64 length + UTF-8 bytes) starting at byte `pos`.

    Returns (list of str, position after the last string). Every length is checked
    against the end of the buffer before it is used.
    """
    cdef Py_ssize_t end = buf.shape[0]
    cdef unsigned long long n
    cdef Py_ssize_t i
    cdef list out = [None] * count
    for i in range(count):
        if end - pos < 8:
            raise GGUFError(f"{field}[{i}]: string length at byte {pos} runs past the end of the file")
        memcpy(&n, &buf[pos], 8)
        pos += 8
        if n > <unsigned long long>(end - pos):
            raise GGUFError(
                f"{field}[{i}]: string of {n} bytes at byte {pos - 8} runs past the end of the file")
        try:
            out[i] = (<const char*>&buf[pos])[:n].decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFError(f"{field}[{i}]: invalid UTF-8 in string at byte {pos - 8}: {e.reason}") from None
        pos += <Py_ssize_t>n
    return out, pos
