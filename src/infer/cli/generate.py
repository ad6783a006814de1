"""``infer generate``: one prompt or chat message, streamed to the terminal."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from infer.cli.engine_args import add_engine_args, engine_config_from_args
from infer.contract.outputs import RequestOutput
from infer.contract.sampling_params import SamplingParams
from infer.distributed.layout import node_ranks
from infer.engine.core.engine import Engine
from infer.engine.loop import UpFront, drive
from infer.engine.setup.tp_node import serve_node


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("generate", help="generate text for a prompt or a chat")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="plain text prompt")
    source.add_argument("--chat", help="a user message; the chat template is applied")
    source.add_argument(
        "--prompt-ids",
        help="comma-separated token ids (models without a tokenizer, e.g. dummy weights)",
    )
    parser.add_argument("--system", help="system message for --chat")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None, help="sampling seed")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument(
        "--no-stream",
        dest="stream",
        action="store_false",
        help="print the answer only when complete",
    )
    add_engine_args(parser, exclude=frozenset({"seed"}))
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    params = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        seed=args.seed,
        max_tokens=args.max_tokens,
        stop=args.stop,
        ignore_eos=args.ignore_eos,
    )
    config = engine_config_from_args(argparse.Namespace(**{**vars(args), "seed": 0}))
    if not node_ranks(config).runs_engine:  # another node's ranks: rank 0 generates
        return serve_node(config)
    engine = Engine(config)
    if args.chat is not None:
        messages = [{"role": "system", "content": args.system}] if args.system else []
        messages.append({"role": "user", "content": args.chat})
        prompt = engine.encode_chat(messages)
    elif args.prompt_ids is not None:
        prompt = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
    else:
        prompt = args.prompt
    engine.add_request(prompt, params)
    printer = _Printer(engine, stream=args.stream)
    drive(engine, printer)
    return 1 if printer.failed else 0


class _Printer(UpFront[RequestOutput]):
    """Writes one request's text (as it comes, with ``--stream``)."""

    def __init__(self, engine: Engine, stream: bool) -> None:
        super().__init__(engine, engine.wakeup)
        self.tokenizer = engine.tokenizer
        self.stream = stream
        self.failed = False

    def put_out(self, outputs: Sequence[RequestOutput]) -> None:
        for out in outputs:
            self._write(out)

    def _write(self, out: RequestOutput) -> None:
        ids = self.tokenizer is None
        text = " ".join(map(str, out.new_token_ids)) if ids else out.new_text
        if self.stream and text:
            sys.stdout.write(text + " " if ids else text)
            sys.stdout.flush()
        if out.finished:
            if not self.stream:
                sys.stdout.write(" ".join(map(str, out.token_ids)) if ids else out.text)
            sys.stdout.write("\n")
            if out.error:
                print(f"error: {out.error}", file=sys.stderr)
                self.failed = True
