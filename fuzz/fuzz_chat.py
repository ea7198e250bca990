"""Fuzz harness: chat templates built from template fragments and fuzzed text, rendered over
fuzzed messages in the bounded sandbox. A template may only fail with ChatTemplateError (or
jinja2's SecurityError for a sandbox escape), never another exception, and must end within
its time limit with output within its size limit."""

from __future__ import annotations

import time

import atheris
import jinja2.sandbox
from common import fuzz

import pyinfer.chat
from pyinfer.chat import ChatTemplate, RenderLimits
from pyinfer.errors import ChatTemplateError

LIMITS = RenderLimits(seconds=0.25, output_chars=1 << 16, value_size=1 << 14, int_digits=200)
ROLES = ("system", "user", "assistant", "tool")
# Pieces of real templates; the harness strings them together with fuzzed text between.
FRAGMENTS = [
    "{% for m in messages %}", "{% endfor %}", "{% if ", " %}", "{% else %}", "{% elif ", "{% endif %}",
    "{{ ", " }}", "m['content']", "m.role", "messages[0]", "messages[-1]['content']", "loop.index", "loop.last",
    "add_generation_prompt", "bos_token", "eos_token", "raise_exception('no')", "{% set x = ",
    "{% set ns = namespace(n=0) %}",
    "ns.n", "| trim", "| upper", "| length", "| tojson", "| join(',')", "| replace('a', 'b')", "| list", "| first",
    "range(", ")", "(", " * ", " ** ", " + ", " % ", " ~ ", " == ", " != ", " and ", " not ", " in ", "'x'", "10",
    "9999", "-1", "[1, 2]", "{'a': 1}", ".split(' ')", ".strip()", ".startswith('<')", "[:3]", "[::-1]",
    "{% macro f(a) %}", "{% endmacro %}", "f(1)", "{% filter upper %}", "{% endfilter %}", "{# c #}", "{%- ", " -%}",
    "strftime_now('%Y')", "'%s' % ", "x.__class__", "cycler", "lipsum()", "self", "{% raw %}", "{% endraw %}",
]


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    messages = [
        {"role": ROLES[fdp.ConsumeIntInRange(0, 3)], "content": fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 40))}
        for _ in range(fdp.ConsumeIntInRange(1, 3))
    ]
    add_generation_prompt = fdp.ConsumeBool()
    parts = []
    for _ in range(fdp.ConsumeIntInRange(1, 24)):
        if fdp.ConsumeBool():
            parts.append(FRAGMENTS[fdp.ConsumeIntInRange(0, len(FRAGMENTS) - 1)])
        else:
            parts.append(fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 12)))
    source = "".join(parts)
    try:
        tmpl = ChatTemplate(source, bos_token="<s>", eos_token="</s>", limits=LIMITS)
    except ChatTemplateError:
        return
    t0 = time.monotonic()
    try:
        out = tmpl.render(messages, add_generation_prompt=add_generation_prompt)
    except (ChatTemplateError, jinja2.sandbox.SecurityError):
        out = ""
    took = time.monotonic() - t0
    assert took < LIMITS.seconds + 1.0, (source, took)
    assert isinstance(out, str) and len(out) <= LIMITS.output_chars, source


if __name__ == "__main__":
    fuzz(test_one_input, [pyinfer.chat])
