"""Constrained decoding: a Constraint gives each step the set of tokens that keep the output
inside a language (a JSON schema, any JSON object, a regular expression, a choice among
strings, a Lark or GBNF grammar), and is told the token chosen. The Request asks it before
every sampling, so every path that samples through a Request (Model.generate, the engine, the
server) is constrained the same way, speculative drafts included: tokens are still sampled
one at a time from masked rows.

The languages are compiled and matched by llguidance (PyPI `llguidance`, the `[structured]`
extra); the vocabulary is handed to it once per tokenizer, as the bytes each token stands for.

    c = Constraint.json_schema(model.tokenizer, {"type": "object", "properties": {...}})
    model.generate(prompt, constraint=c)          # or response_format=..., regex=..., choice=...

A constraint is one request's state; a new request needs a new one (`Constraint.fresh()`).
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pyinfer.errors import ParameterTypeError

if TYPE_CHECKING:
    from pyinfer.tokenizer import Tokenizer

__all__ = ["Constraint", "ConstraintError", "constraint_from"]

# Grammars past these bounds are refused rather than compiled (a hostile schema must not
# take the server's memory or time).
MAX_GRAMMAR_CHARS = 1 << 20
MAX_CHOICES = 4096


class ConstraintError(ValueError):
    """A grammar, schema or regular expression that does not compile, or a constraint that
    cannot go on (the text so far admits no continuation)."""


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as e:  # pragma: no cover - the extra is installed with the tests
        raise ImportError("constrained decoding needs llguidance: pip install 'pyinfer[structured]'") from e
    return llguidance


_ll_tokenizers: weakref.WeakKeyDictionary[Tokenizer, Any] = weakref.WeakKeyDictionary()
_ll_lock = threading.Lock()


class _Vocabulary:
    """What llguidance's tokenizer wrapper reads: each token's bytes, the end tokens, and
    the text-to-ids function (used to tokenize forced text)."""

    def __init__(self, tok: Tokenizer) -> None:
        self._tok = tok
        self.tokens = [tok.token_bytes(i) for i in range(tok.vocab_size)]
        eot = sorted(tok.eot_ids)
        self.eos_token_id = tok.eos_id if tok.eos_id is not None else (eot[0] if eot else 0)
        self.bos_token_id = tok.bos_id
        self.special_token_ids = [i for i in range(tok.vocab_size) if tok.is_control(i)]

    def __call__(self, text: bytes) -> list[int]:
        return self._tok.tokenize(text.decode("utf-8", errors="replace"), add_bos=False)


def _ll_tokenizer(tok: Tokenizer) -> Any:
    """llguidance's view of `tok`, built once (it indexes the whole vocabulary)."""
    with _ll_lock:
        ll = _ll_tokenizers.get(tok)
        if ll is None:
            llg = _llguidance()
            eot = sorted(tok.eot_ids) or None
            ll = llg.LLTokenizer(llg.TokenizerWrapper(_Vocabulary(tok)), n_vocab=tok.vocab_size, eos_token=eot)
            _ll_tokenizers[tok] = ll
        return ll


class Constraint:
    """One request's constraint: the tokens allowed next, and the state after each token."""

    def __init__(self, tokenizer: Tokenizer, grammar: str, *, description: str = "grammar") -> None:
        if len(_text("grammar", grammar)) > MAX_GRAMMAR_CHARS:
            raise ConstraintError(f"the {description} is {len(grammar)} characters, over the limit of "
                                  f"{MAX_GRAMMAR_CHARS}")
        llg = _llguidance()
        self.tokenizer = tokenizer
        self.description = description
        self._grammar = grammar
        ll = _ll_tokenizer(tokenizer)
        err = llg.LLMatcher.validate_grammar(grammar, ll)
        if err:
            raise ConstraintError(f"the {description} does not compile: {err}")
        self._m = llg.LLMatcher(ll, grammar, log_level=0)
        if self._m.is_error():
            raise ConstraintError(f"the {description} does not compile: {self._m.get_error()}")
        self._n_vocab = tokenizer.vocab_size
        self._bits = np.empty((self._n_vocab + 31) // 32, np.int32)
        self._buf: np.ndarray | None = None
        self._ninf: np.ndarray | None = None
        # The first step's mask, computed now (the first allowed() takes it): computing it is
        # what tells the matcher whether any text can follow.
        self._compute_mask()
        self._fresh_mask = True
        if self._m.is_stopped() and not self._m.is_accepting():
            # Stopped before any text, and the empty text is not in the language either (a rule
            # that only refers to itself, a character class with nothing in it): a request under
            # it could only end at once, claiming a reply it never gave.
            raise ConstraintError(f"the {description} admits no text: no string matches it")

    # -- the languages

    @classmethod
    def json_schema(cls, tokenizer: Tokenizer, schema: Mapping[str, Any] | str) -> Constraint:
        """JSON that validates against `schema` (a dict or its JSON text). Between tokens it
        allows one space, or one line break and up to 20 spaces or tabs of indent (llama.cpp's
        JSON grammars bound whitespace alike): with whitespace unbounded, a sampled reply can
        spend its whole budget on blank lines. A schema's own "x-guidance" options (llguidance's
        JSON compile options) take precedence."""
        llg = _llguidance()
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ConstraintError(f"the JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, Mapping):
            raise ConstraintError(f"a JSON schema must be an object, not {type(schema).__name__}")
        try:
            grammar = llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=_JSON_OPTIONS)
        except (ValueError, TypeError) as e:
            raise ConstraintError(f"the JSON schema is refused: {e}") from None
        return cls(tokenizer, grammar, description="JSON schema")

    @classmethod
    def json_object(cls, tokenizer: Tokenizer) -> Constraint:
        """Any JSON object (OpenAI's response_format {"type": "json_object"})."""
        return cls.json_schema(tokenizer, {"type": "object"})

    @classmethod
    def regex(cls, tokenizer: Tokenizer, pattern: str) -> Constraint:
        """Text the regular expression matches whole."""
        grammar = _llguidance().LLMatcher.grammar_from_regex(_text("regex", pattern))
        return cls(tokenizer, grammar, description="regex")

    @classmethod
    def choice(cls, tokenizer: Tokenizer, options: Sequence[str]) -> Constraint:
        """Exactly one of the strings."""
        if isinstance(options, str) or not isinstance(options, Sequence):
            raise ParameterTypeError("choice must be a list of strings")
        if not options or len(options) > MAX_CHOICES:
            raise ConstraintError(f"choice needs 1 to {MAX_CHOICES} strings, got {len(options)}")
        if not all(isinstance(o, str) and o for o in options):
            raise ConstraintError("every choice must be a non-empty string")
        return cls._lark(tokenizer, "start: " + " | ".join(json.dumps(o) for o in options), "choice")

    @classmethod
    def lark(cls, tokenizer: Tokenizer, grammar: str) -> Constraint:
        """A Lark grammar (llguidance's dialect: `start` is the top rule)."""
        return cls._lark(tokenizer, _text("grammar", grammar), "Lark grammar")

    @classmethod
    def gbnf(cls, tokenizer: Tokenizer, grammar: str) -> Constraint:
        """A llama.cpp GBNF grammar (`root ::= ...`), translated to Lark."""
        from llguidance.gbnf_to_lark import gbnf_to_lark

        try:
            lark = gbnf_to_lark(_text("grammar", grammar))
        except ParameterTypeError:
            raise
        except Exception as e:  # the translator raises plain exceptions on bad input
            raise ConstraintError(f"the GBNF grammar does not parse: {e}") from None
        return cls._lark(tokenizer, lark, "GBNF grammar")

    @classmethod
    def _lark(cls, tokenizer: Tokenizer, lark: str, description: str) -> Constraint:
        return cls(tokenizer, _llguidance().LLMatcher.grammar_from_lark(lark), description=description)

    def fresh(self) -> Constraint:
        """The same language from its start, for another request."""
        return Constraint(self.tokenizer, self._grammar, description=self.description)

    # -- one step at a time

    def allowed(self) -> np.ndarray:
        """A bool mask over the vocabulary: the tokens that keep the text in the language
        (the end tokens once it is complete)."""
        if not self._fresh_mask:
            self._compute_mask()
        self._fresh_mask = False
        return np.unpackbits(self._bits.view(np.uint8), bitorder="little").view(bool)[: self._n_vocab]

    def _compute_mask(self) -> None:
        """The current state's mask into the bits."""
        m = self._m
        if m.is_error():
            raise ConstraintError(f"the {self.description} cannot go on: {m.get_error()}")
        m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)

    def masked(self, logits: np.ndarray) -> np.ndarray:
        """logits with every token allowed() refuses at -inf, in a buffer this constraint
        reuses at its next call."""
        if self._buf is None or self._ninf is None:
            self._buf = np.empty(self._n_vocab, np.float32)
            self._ninf = np.full(self._n_vocab, -np.inf, np.float32)
        np.copyto(self._buf, self._ninf)
        np.copyto(self._buf, logits, where=self.allowed())
        return self._buf

    def advance(self, token: int) -> None:
        """The token chosen (one allowed() permitted)."""
        self._fresh_mask = False  # the state moves on: the next allowed() computes its mask
        if not self._m.consume_token(int(token)):
            # The matcher's first line says why; the rest is its state and grammar, for its own
            # developers.
            why = self._m.get_error().split("\n", 1)[0]
            raise ConstraintError(f"the {self.description} cannot go on at token {token}: {why}")

    @property
    def done(self) -> bool:
        """The text is complete: only an end token may follow."""
        return bool(self._m.is_stopped())


# Whitespace a JSON reply may put between two tokens (see Constraint.json_schema).
_JSON_OPTIONS = {"whitespace_pattern": r"(?: |\n[ \t]{0,20})?"}


def _text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ParameterTypeError(f"{name} must be a str, not {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:  # llguidance takes UTF-8 text only
        raise ConstraintError(f"the {name} is not valid Unicode text: a lone surrogate at character "
                              f"{e.start}") from None
    return value


def constraint_from(
    tokenizer: Tokenizer,
    *,
    constraint: Constraint | None = None,
    response_format: Mapping[str, Any] | None = None,
    grammar: str | None = None,
    regex: str | None = None,
    choice: Sequence[str] | None = None,
    json_schema: Mapping[str, Any] | str | None = None,
) -> Constraint | None:
    """The one constraint these keywords ask for (None for none), refusing two at once.
    response_format: OpenAI's {"type": "text" | "json_object" | "json_schema", "json_schema":
    {"schema": ...}} (llama-cpp-python's {"type": "json_object", "schema": ...} too); grammar:
    GBNF when it defines `root ::=`, else Lark."""
    given = {k: v for k, v in (("constraint", constraint), ("response_format", response_format),
                                ("grammar", grammar), ("regex", regex), ("choice", choice),
                                ("json_schema", json_schema)) if v is not None}
    if len(given) > 1:
        raise ValueError(f"give one constraint, not {' and '.join(given)}")
    if constraint is not None:
        if not isinstance(constraint, Constraint):
            raise ParameterTypeError(f"constraint must be a Constraint, not {type(constraint).__name__}")
        return constraint
    if json_schema is not None:
        return Constraint.json_schema(tokenizer, json_schema)
    if regex is not None:
        return Constraint.regex(tokenizer, regex)
    if choice is not None:
        return Constraint.choice(tokenizer, choice)
    if grammar is not None:
        is_gbnf = "::=" in _text("grammar", grammar)
        return Constraint.gbnf(tokenizer, grammar) if is_gbnf else Constraint.lark(tokenizer, grammar)
    if response_format is not None:
        return _from_response_format(tokenizer, response_format)
    return None


def _from_response_format(tokenizer: Tokenizer, rf: Mapping[str, Any]) -> Constraint | None:
    if not isinstance(rf, Mapping):
        raise ParameterTypeError(f"response_format must be an object, not {type(rf).__name__}")
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = rf.get("schema")  # llama-cpp-python's extension
        return Constraint.json_object(tokenizer) if schema is None else Constraint.json_schema(tokenizer, schema)
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, Mapping) or "schema" not in js:
            raise ValueError("response_format.json_schema must be an object with a 'schema'")
        return Constraint.json_schema(tokenizer, js["schema"])
    raise ValueError(f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}")
