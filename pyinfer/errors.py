"""Exceptions pyinfer raises."""


class GGUFError(ValueError):
    """A GGUF file is malformed or unsupported; the message names the field and byte offset."""
