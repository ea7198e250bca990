"""Constrained decoding (pyinfer.constraint over llguidance): every output parses and validates,
greedy or sampled, through Model.generate, the engine and the server; bad grammars and schemas
are refused naming what was wrong; drafts and batching leave constrained outputs unchanged."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from pyinfer import Engine, Model
from pyinfer.constraint import Constraint, ConstraintError

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}
ORDER = {
    "type": "object",
    "properties": {
        "items": {"type": "array", "minItems": 1, "maxItems": 3,
                  "items": {"type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
                                                             "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
                            "required": ["sku", "qty"], "additionalProperties": False}},
        "express": {"type": "boolean"},
    },
    "required": ["items", "express"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def model(default_model):
    return Model.load(default_model, n_ctx=1024)


def ask(text):
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize("schema", [PERSON, ORDER], ids=["person", "order"])
@pytest.mark.parametrize("kw", [{"temperature": 0}, {"temperature": 1.0, "seed": 5}, {"temperature": 1.3, "seed": 9}])
def test_json_schema_outputs_validate(model, schema, kw):
    c = model.chat(ask("Reply with a JSON example."), max_tokens=160, json_schema=schema, **kw)
    assert c.finish_reason == "stop", c.text
    jsonschema.validate(json.loads(c.text), schema)
    assert c.timings.constraint_s > 0


def _accepts(c: Constraint, tok, text: str) -> bool:
    for t in tok.tokenize(text, add_bos=False):
        if not c.allowed()[t]:
            return False
        c.advance(t)
    return True


def test_json_whitespace_is_bounded(model):
    """Compact, spaced and indented JSON pass; a run of blank lines or spaces between two
    tokens, where a sampled reply could spend its whole budget, does not; a schema's own
    x-guidance options still win."""
    tok = model.tokenizer
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
              "required": ["a", "b"], "additionalProperties": False}
    fine = ['{"a":1,"b":true}', '{"a": 1, "b": false}', '{\n  "a": 1,\n  "b": true\n}', '{\n\t"a": 7,\n\t"b": true\n}']
    for text in fine:
        assert _accepts(Constraint.json_schema(tok, schema), tok, text), text
    for text in ['{"a": 1,' + "\n" * 30 + '"b": true}', '{"a": 1,' + " " * 40 + '"b": true}', '{"a": 1,\n\n"b": true}']:
        assert not _accepts(Constraint.json_schema(tok, schema), tok, text), text
    loose = dict(schema, **{"x-guidance": {"whitespace_flexible": True, "whitespace_pattern": None}})
    assert _accepts(Constraint.json_schema(tok, loose), tok, '{"a": 1,' + "\n" * 30 + '"b": true}')


def test_response_format_shapes(model):
    c = model.chat(ask("Give a JSON object with the keys colour and size for a small red ball."), max_tokens=120,
                   temperature=0,
                   response_format={"type": "json_object"})
    assert c.finish_reason == "stop" and isinstance(json.loads(c.text), dict)
    c = model.chat(ask("A person, as JSON."), max_tokens=120, temperature=0,
                   response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}})
    jsonschema.validate(json.loads(c.text), PERSON)
    plain = model.chat(ask("Hi"), max_tokens=8, temperature=0)
    assert model.chat(ask("Hi"), max_tokens=8, temperature=0, response_format={"type": "text"}).text == plain.text


def test_regex_choice_and_grammars(model):
    for seed in range(4):
        c = model.generate("Call me at", max_tokens=24, regex=r" \(\d{3}\) \d{3}-\d{4}", temperature=1.0, seed=seed)
        assert re.fullmatch(r" \(\d{3}\) \d{3}-\d{4}", c.text) and c.finish_reason == "stop"
        c = model.generate("Is the sky green? Answer:", max_tokens=8, choice=[" yes", " no", " unsure"],
                           temperature=1.0, seed=seed)
        assert c.text in (" yes", " no", " unsure")
    gbnf = 'root ::= "[" item ("," item){0,3} "]"\nitem ::= [0-9]{1,2}'
    c = model.generate("Some numbers:", max_tokens=30, grammar=gbnf, temperature=0.7, seed=1)
    assert re.fullmatch(r"\[[0-9]{1,2}(,[0-9]{1,2}){0,3}\]", c.text) and c.finish_reason == "stop", c.text
    lark = 'start: "colour: " COLOUR\nCOLOUR: "red" | "green" | "blue"'
    c = model.generate("Pick one.", max_tokens=10, grammar=lark, temperature=0.9, seed=2)
    assert c.text in ("colour: red", "colour: green", "colour: blue")


def test_bad_constraints_are_refused_naming_what_is_wrong(model):
    with pytest.raises(ConstraintError, match="JSON schema is not valid JSON"):
        model.generate("x", json_schema="{not json")
    with pytest.raises(ConstraintError, match="regex does not compile"):
        model.generate("x", regex="(unclosed")
    with pytest.raises(ConstraintError, match="GBNF grammar"):
        model.generate("x", grammar="root ::= (")
    with pytest.raises(ConstraintError, match="choice needs 1 to"):
        model.generate("x", choice=[])
    with pytest.raises(ValueError, match="give one constraint, not regex and choice"):
        model.generate("x", regex="a", choice=["a"])
    with pytest.raises(ValueError, match="response_format.type must be"):
        model.generate("x", response_format={"type": "yaml"})
    with pytest.raises(TypeError, match="constraint must be a Constraint"):
        model.generate("x", constraint="a")
    # Languages with no string in them: refused when made, not answered with an empty "stop".
    for kw in ({"json_schema": {"$ref": "#"}}, {"grammar": "root ::= x\nx ::= x"},
               {"regex": "[^\\x00-\\U0010FFFF]"}):
        with pytest.raises(ConstraintError, match="admits no text"):
            model.generate("x", max_tokens=4, **kw)
    assert model.generate("x", max_tokens=4, regex="", temperature=0).text == ""  # the empty text is one
    # A regex the matcher cannot build its automaton for fails at the token it meets the limit,
    # naming the limit (the matcher's first line, not its state dump).
    with pytest.raises(ConstraintError, match=r"regex cannot go on at token \d+: .*too many") as ei:
        model.generate("x", max_tokens=4, regex="a{1000000000}", temperature=0)
    assert "<state>" not in str(ei.value)
    # The model still works afterwards.
    assert model.generate("The capital of France is", max_tokens=3, temperature=0).token_ids


def test_drafts_and_batches_leave_constrained_outputs_unchanged(model):
    kw = {"max_tokens": 100, "temperature": 0.8, "seed": 4, "logprobs": 1, "json_schema": ORDER}
    plain = model.chat(ask("An order as JSON, then repeat it."), draft=0, **kw)
    drafted = model.chat(ask("An order as JSON, then repeat it."), draft=8, **kw)
    assert (drafted.token_ids, drafted.logprobs, drafted.text) == (plain.token_ids, plain.logprobs, plain.text)
    with Engine(model, max_batch=8) as e:
        others = [e.submit(f"Story {i}:", max_tokens=30, temperature=0.7, seed=i) for i in range(4)]
        h = e.chat(ask("An order as JSON, then repeat it."), **kw)
        got = h.result(60)
        for o in others:
            o.result(60)
    assert (got.token_ids, got.logprobs, got.text) == (plain.token_ids, plain.logprobs, plain.text)


def test_a_constraint_is_one_requests_state(model):
    c = Constraint.choice(model.tokenizer, ["alpha", "beta"])
    first = model.generate("Say a word:", max_tokens=5, constraint=c, temperature=0)
    assert first.text in ("alpha", "beta") and c.done
    again = model.generate("Say a word:", max_tokens=5, constraint=c.fresh(), temperature=0)
    assert again.text == first.text
