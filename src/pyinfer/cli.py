"""The `pyinfer` command line: `pyinfer run | chat | info | pull | bench | quantize | serve`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any, TextIO

from pyinfer.errors import ContextOverflowError, GGUFError
from pyinfer.model import KV_DTYPES
from pyinfer.registry import DEFAULT_MODEL, KNOWN_MODELS, ModelNotFoundError, pull, resolve_model
from pyinfer.request import TOKEN_BUDGET
from pyinfer.sampling import DEFAULT_PARAMS


def _cmd_info(args: argparse.Namespace) -> int:
    from pyinfer.gguf import GGUFReader
    from pyinfer.info import format_info, model_info

    with GGUFReader(resolve_model(args.model)) as r:
        info = model_info(r)
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        print(format_info(info, tensors=args.tensors))
    return 0


def _cmd_pull(args: argparse.Namespace) -> int:
    if args.list:
        for m in KNOWN_MODELS.values():
            default = " (default)" if m.name == DEFAULT_MODEL else ""
            print(f"{m.name:<12} {m.description}{default}")
        return 0
    print(pull(args.name, force=args.force))
    return 0


def _cmd_quantize(args: argparse.Namespace) -> int:
    from pyinfer.quantize import quantize_model

    r = quantize_model(resolve_model(args.input), args.output, args.type)
    kinds = ", ".join(f"{n} {t}" for t, n in r["tensor_types"].items())
    print(f"wrote {r['path']}: {r['file_size']:,} bytes, tensors {kinds}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from pyinfer.bench import run_bench

    run_bench(args.studies, model=args.model, quick=args.quick, out=args.out, threads=args.threads,
              llama_bench=args.llama_bench, peers=not args.no_peers, peer_python=args.peer_python,
              peer_server=args.peer_server, ray=args.ray, openvino_python=args.peer_openvino)
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        from pyinfer.server import serve
    except ImportError as e:
        print(f"pyinfer serve: error: {e.name} is missing: pip install 'pyinfer[server]'", file=sys.stderr)
        return 1
    api_key = args.api_key if args.api_key is not None else os.environ.get("PYINFER_API_KEY") or None
    if args.kv_budget_mib is not None and not (0 < args.kv_budget_mib < float(1 << 40)):
        raise ValueError(f"--kv-budget-mib must be a positive number of MiB, got {args.kv_budget_mib}")
    if args.max_body_bytes < 1:
        raise ValueError(f"--max-body-bytes must be >= 1, got {args.max_body_bytes}")
    kv = None if args.kv_budget_mib is None else int(args.kv_budget_mib * (1 << 20))
    # What each engine loads and how it schedules, whether one process serves or Ray's replicas do.
    engine = {"model": args.model, "n_ctx": args.ctx, "precision": args.precision, "kv_dtype": args.kv_dtype,
              "max_batch": args.max_batch, "token_budget": args.token_budget, "kv_budget_bytes": kv,
              "max_queue": args.max_queue, "prefix_cache": not args.no_prefix_cache,
              "max_body_bytes": args.max_body_bytes, "draft": args.draft}
    if args.ray:
        return _serve_ray(args, api_key, engine)
    serve(host=args.host, port=args.port, api_key=api_key, n_threads=args.threads, log_level=args.log_level,
          **engine)
    return 0


def _serve_ray(args: argparse.Namespace, api_key: str | None, engine: dict[str, Any]) -> int:
    try:
        from pyinfer.serve.ray import Autoscaling, ReplicaConfig, run
    except ImportError as e:
        print(f"pyinfer serve --ray: error: {e.name} is missing: pip install 'pyinfer[ray]'", file=sys.stderr)
        return 1
    config = ReplicaConfig(n_threads=args.threads or 1, **engine)
    autoscaling = None
    if args.max_replicas is not None:
        autoscaling = Autoscaling(min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                                  target_ongoing_requests=args.target_ongoing)
    run(config, host=args.host, port=args.port, address=args.ray_address, replicas=args.replicas,
        autoscaling=autoscaling, api_key=api_key)
    return 0


# -- run and chat --------------------------------------------------------------------------


def _load_model(args: argparse.Namespace) -> Any:
    from pyinfer.model import Model

    return Model.load(args.model, n_ctx=args.ctx, n_threads=args.threads, precision=args.precision,
                      kv_dtype=args.kv_dtype)


def _sampling_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_k": args.top_k,
            "top_p": args.top_p, "min_p": args.min_p, "repeat_penalty": args.repeat_penalty,
            "seed": args.seed}


def timing_line(timings: Any, weight_bytes: int) -> str:
    """TTFT, prefill and decode speed, and the weight bandwidth decode achieved."""
    tps = timings.decode_tokens_per_s
    ttft = timings.ttft_s if timings.ttft_s is not None else float("nan")
    return (f"[TTFT {ttft * 1e3:.0f} ms | prefill {timings.prompt_tokens} tok at "
            f"{timings.prefill_tokens_per_s:.0f} tok/s | decode {timings.sampled_tokens} tok at {tps:.1f} tok/s, "
            f"{tps * weight_bytes / 1e9:.1f} GB/s of weights]")


def _stream(model: Any, chunks: Any, out: TextIO) -> tuple[str, Any]:
    """Print a stream as it comes; Ctrl-C ends it cleanly. Returns (text, last chunk)."""
    text, last = [], None
    try:
        for last in chunks:
            out.write(last.text)
            out.flush()
            text.append(last.text)
    except KeyboardInterrupt:
        chunks.close()
        out.write("\n")
        raise
    return "".join(text), last


def _check_text_arguments(args: argparse.Namespace, *names: str) -> None:
    """ValueError naming an argument whose bytes are not UTF-8 (the shell passes them as they are)."""
    for name in names:
        value = getattr(args, name, None)
        if not isinstance(value, str):
            continue
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            bad = value[e.start].encode("utf-8", "surrogateescape")
            raise ValueError(
                f"the {name} argument is not UTF-8 text: byte 0x{bad.hex()} at character {e.start}"
            ) from None


def _cmd_run(args: argparse.Namespace) -> int:
    from pyinfer.chat import has_chat_template

    _check_text_arguments(args, "prompt", "system")
    model = _load_model(args)
    kw = _sampling_kwargs(args)
    use_chat = not args.raw and has_chat_template(model.reader.metadata)
    if use_chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else [])
        messages.append({"role": "user", "content": args.prompt})
    if args.json:
        c = model.chat(messages, **kw) if use_chat else model.generate(args.prompt, **kw)
        out = dataclasses.asdict(c)
        out["timings"]["decode_tokens_per_s"] = c.timings.decode_tokens_per_s
        out["timings"]["prefill_tokens_per_s"] = c.timings.prefill_tokens_per_s
        print(json.dumps(out, indent=1))
        return 0
    chunks = model.chat(messages, stream=True, **kw) if use_chat else model.generate(args.prompt, stream=True, **kw)
    try:
        _, last = _stream(model, chunks, sys.stdout)
    except KeyboardInterrupt:
        return 130
    print(flush=True)
    if last is not None and last.timings is not None:
        print(timing_line(last.timings, model.weight_bytes_per_token), file=sys.stderr)
    return 0


def _cmd_chat(args: argparse.Namespace) -> int:
    model = _load_model(args)
    kw = _sampling_kwargs(args)
    system = [{"role": "system", "content": args.system}] if args.system else []
    history: list[dict[str, str]] = []
    print("pyinfer chat: /reset forgets the conversation, /exit (or Ctrl-D) quits.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        cmd = line.strip()
        if not cmd:
            continue
        if cmd in ("/exit", "/quit"):
            return 0
        if cmd == "/reset":
            history.clear()
            print("(conversation cleared)", file=sys.stderr)
            continue
        history.append({"role": "user", "content": line})
        try:
            text, last = _stream(model, model.chat(system + history, stream=True, **kw), sys.stdout)
        except KeyboardInterrupt:
            history.pop()  # the reply was cut short: forget the question too
            continue
        except ContextOverflowError as e:
            history.pop()  # the conversation stays as it was, and the session goes on
            print(f"(the conversation with this message is {e.n_tokens} tokens, more than --ctx {e.n_ctx}: "
                  "/reset to start over, or start again with a larger --ctx)", file=sys.stderr)
            continue
        print(flush=True)
        history.append({"role": "assistant", "content": text})
        if last is not None and last.timings is not None and args.verbose:
            print(timing_line(last.timings, model.weight_bytes_per_token), file=sys.stderr)


def _add_kv_dtype(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv-dtype", choices=KV_DTYPES, default="float32",
                   help="KV cache elements: q8_0 takes 0.28x float32's memory, float16 0.5x (default: %(default)s)")


def _add_generation_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", default=None, help="GGUF path or known model name (default: smollm2)")
    p.add_argument("--threads", "-t", type=int, default=None, help="threads (default: all cores)")
    p.add_argument("--ctx", "-c", type=int, default=2048, help="context length in tokens (default: %(default)s)")
    p.add_argument("--max-tokens", "-n", type=int, default=512,
                   help="tokens to generate at most (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=DEFAULT_PARAMS.temperature,
                   help="0 is greedy (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=DEFAULT_PARAMS.top_k,
                   help="0 is off (default: %(default)s)")
    p.add_argument("--top-p", type=float, default=DEFAULT_PARAMS.top_p,
                   help="1 is off (default: %(default)s)")
    p.add_argument("--min-p", type=float, default=DEFAULT_PARAMS.min_p,
                   help="0 is off (default: %(default)s)")
    p.add_argument("--repeat-penalty", type=float, default=DEFAULT_PARAMS.repeat_penalty,
                   help="1 is off (default: %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="makes sampling reproducible")
    p.add_argument("--precision", choices=["fast", "exact"], default="fast",
                   help="fast: 8-bit activations, integer dot products; exact: float32 (default: %(default)s)")
    p.add_argument("--system", default=None, help="a system message for chat models")
    _add_kv_dtype(p)


def _port(text: str) -> int:
    """A TCP port number, refused by argparse (naming --port) outside 0-65535."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"{v} is outside 0-65535")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pyinfer", description="Fast LLM inference on CPUs.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="generate a reply to PROMPT, streamed, with a timing line on stderr")
    run.add_argument("prompt")
    _add_generation_options(run)
    run.add_argument("--raw", action="store_true",
                     help="continue PROMPT as plain text instead of answering it through the chat template")
    run.add_argument("--json", action="store_true", help="print the whole completion as JSON, timings included")
    run.set_defaults(func=_cmd_run)

    chat = sub.add_parser("chat", help="an interactive chat (/reset, /exit)")
    _add_generation_options(chat)
    chat.add_argument("--verbose", "-v", action="store_true", help="a timing line after each reply")
    chat.set_defaults(func=_cmd_chat)

    info = sub.add_parser("info", help="describe a model: dimensions, tensors, bytes per token")
    info.add_argument("model", nargs="?", default=None, help="GGUF path or known model name (default: smollm2)")
    info.add_argument("--json", action="store_true", help="print machine-readable JSON")
    info.add_argument("--tensors", action="store_true", help="list every tensor")
    info.set_defaults(func=_cmd_info)

    pl = sub.add_parser("pull", help="fetch a known model into the cache")
    pl.add_argument("name", nargs="?", default=DEFAULT_MODEL, help="model name (default: %(default)s)")
    pl.add_argument("--list", action="store_true", help="list the known models")
    pl.add_argument("--force", action="store_true", help="fetch again even if present")
    pl.set_defaults(func=_cmd_pull)

    from pyinfer.quantize import TARGET_TYPES

    q = sub.add_parser("quantize", help="rewrite a GGUF model with every weight matrix in one format")
    q.add_argument("input", help="GGUF path or known model name")
    q.add_argument("output", help="GGUF file to write")
    q.add_argument("--type", required=True, choices=list(TARGET_TYPES), help="format of the weight matrices")
    q.set_defaults(func=_cmd_quantize)

    b = sub.add_parser("bench", help="measure decode against memory bandwidth; JSON, Markdown and plots")
    b.add_argument("studies", nargs="*", metavar="STUDY",
                   help="ceiling roofline formats context batch contention prefill model_size peers speculative serve "
                        "(default: all)")
    b.add_argument("--quick", action="store_true", help="short runs (under 2 minutes): a smoke test")
    b.add_argument("--out", default="bench-results", help="directory for the results (default: %(default)s)")
    b.add_argument("--model", "-m", default=None, help="GGUF path or known model name (default: smollm2)")
    b.add_argument("--threads", "-t", type=int, nargs="+", default=None,
                   help="thread counts (default: 1, 2, 4, ... up to the usable cores)")
    b.add_argument("--llama-bench", default=None, action="append", metavar="[NAME=]PATH",
                   help="a llama-bench binary to compare with, named in the report as 'llama-bench NAME' "
                        "(or 'llama-bench'); repeat it for several (llama.cpp's, a fork's)")
    b.add_argument("--peer-openvino", default=None, metavar="PYTHON",
                   help="peers study: a Python with openvino-genai, to time OpenVINO GenAI on the same GGUF")
    b.add_argument("--no-peers", action="store_true", help="time pyinfer alone in the peers and serve studies")
    b.add_argument("--peer-python", default=None, metavar="PATH",
                   help="serve study: a Python with llama-cpp-python[server] (default: this one, if it has it)")
    b.add_argument("--peer-server", default=None, metavar="PATH", help="serve study: a llama-server binary")
    b.add_argument("--ray", action="store_true",
                   help="serve study: also through Ray Serve (the [ray] extra), one replica of all the threads "
                        "and one replica per thread")
    b.set_defaults(func=_cmd_bench)

    sv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (needs the [server] extra)")
    sv.add_argument("--model", "-m", default=None, help="GGUF path or known model name (default: smollm2)")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    sv.add_argument("--port", type=_port, default=8000, help="port to listen on (default: %(default)s)")
    sv.add_argument("--api-key", default=None,
                    help="require 'Authorization: Bearer KEY' (default: $PYINFER_API_KEY, else none)")
    sv.add_argument("--threads", "-t", type=int, default=None, help="threads (default: all cores)")
    sv.add_argument("--ctx", "-c", type=int, default=4096, help="longest sequence in tokens (default: %(default)s)")
    sv.add_argument("--precision", choices=["fast", "exact"], default="fast",
                    help="fast keeps batched outputs bit-identical to single ones (default: %(default)s)")
    _add_kv_dtype(sv)
    sv.add_argument("--max-batch", type=int, default=16, help="sequences running at once (default: %(default)s)")
    sv.add_argument("--token-budget", type=int, default=TOKEN_BUDGET,
                    help="prompt tokens per scheduler step, beside the decoding rows (default: %(default)s)")
    sv.add_argument("--draft", type=int, default=None, metavar="N",
                    help="speculative decoding by prompt lookup: up to N guessed tokens per sequence and step, "
                         "0 off (default: 8 with --precision fast, else off)")
    sv.add_argument("--no-prefix-cache", action="store_true",
                    help="evaluate every prompt whole (no reuse of a cached prefix's KV cache)")
    sv.add_argument("--kv-budget-mib", type=float, default=None,
                    help="memory for the sequences' contexts (their KV caches) in MiB "
                         "(default: half the memory available)")
    sv.add_argument("--max-queue", type=int, default=64,
                    help="requests waiting for admission before 503 (default: %(default)s)")
    sv.add_argument("--max-body-bytes", type=int, default=4 << 20, help="request body limit (default: %(default)s)")
    sv.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                    help="uvicorn's log level (default: %(default)s)")
    r = sv.add_argument_group("Ray Serve (the [ray] extra)")
    r.add_argument("--ray", action="store_true",
                   help="serve through Ray Serve: replicas of the engine behind Serve's HTTP proxy")
    r.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="the cluster to join (default: $RAY_ADDRESS, else a new one here; "
                        "auto: the one `ray start` left on this machine)")
    r.add_argument("--replicas", type=int, default=1, help="replicas, each with --threads threads (default: 1)")
    r.add_argument("--min-replicas", type=int, default=1, help="autoscaling: fewest replicas (default: 1)")
    r.add_argument("--max-replicas", type=int, default=None, help="autoscaling: most replicas (turns it on)")
    r.add_argument("--target-ongoing", type=float, default=None,
                   help="autoscaling: requests in flight per replica to aim at (default: --max-batch)")
    sv.set_defaults(func=_cmd_serve)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # the reader went away (`pyinfer info | head`): not an error
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - stops the flush at exit from failing
        return 0
    except ContextOverflowError as e:
        where = f"--ctx {e.n_ctx}" if getattr(args, "ctx", None) == e.n_ctx else f"the context ({e.n_ctx})"
        print(f"pyinfer {args.command}: error: the prompt has {e.n_tokens} tokens, more than {where} holds: "
              "shorten it" + (", or raise --ctx" if hasattr(args, "ctx") else ""), file=sys.stderr)
        return 1
    except (GGUFError, ModelNotFoundError, RuntimeError, ValueError, MemoryError) as e:
        print(f"pyinfer {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
