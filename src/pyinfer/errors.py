"""Exceptions pyinfer raises."""


class GGUFError(ValueError):
    """A GGUF file is malformed or unsupported; the message names the field and byte offset."""


class ContextOverflowError(ValueError):
    """A prompt has more tokens than the context can hold; the message gives both counts."""

    def __init__(self, message: str, n_tokens: int, n_ctx: int) -> None:
        super().__init__(message)
        self.n_tokens = n_tokens
        self.n_ctx = n_ctx


class ParameterTypeError(TypeError, ValueError):
    """A parameter has the wrong type. Also a ValueError, so that code which turns bad
    requests into errors with `except ValueError` catches wrong types too."""


class ChatTemplateError(ValueError):
    """A chat template is missing, does not parse, or rejected the messages itself
    (through `raise_exception`)."""


class OverloadedError(RuntimeError):
    """The engine's queue is full: the request was not accepted. retry_after: seconds after
    which trying again is reasonable (an HTTP server sends it as Retry-After)."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after
