"""``mdc export RUN --format timm|hf --out DIR``: the trained encoder for other code
(:mod:`mdc_workbench.export.encoder_export`)."""

from __future__ import annotations

import argparse

from mdc_workbench.cli.common import flags
from mdc_workbench.export.encoder_io import EXPORT_FORMATS


def add_parsers(sub: argparse._SubParsersAction) -> None:
    export = sub.add_parser("export", help="export a run's encoder: a timm model (plain timm loads it) or a Hugging "
                            "Face-style folder with a model card (mdc_workbench.export.load_encoder loads it)",
                            parents=[flags(out="folder to write (an earlier export is replaced only with --force)")])
    export.add_argument("run", help="run folder (its latest checkpoint, or --step's) or checkpoint folder")
    # checked by the library (one-line error), not by argparse choices, which would print the usage as well
    export.add_argument("--format", dest="fmt", default="hf", metavar="{timm,hf}",
                        help="timm: the encoder alone for plain timm (every timm encoder, the conv stem too); hf: the "
                        "whole captioner, config.json, model.safetensors, README.md (default hf)")
    export.add_argument("--step", type=int, help="checkpoint step to export (default: the latest)")
    export.add_argument("--no-ema", dest="ema", action="store_const", const=False, default=None,
                        help="export the raw weights even when the run kept an EMA (default: the EMA when kept)")
    export.add_argument("--metrics", action="append", default=[], metavar="FILE",
                        help="an evaluation result for the model card (mdc probe --out, captioning.json, a notebook's "
                        "metrics.json; repeatable), besides the ones found beside the run")
    export.add_argument("--force", action="store_true",
                        help="replace a non-empty --out that an earlier export wrote (never anything else)")


def cmd_export(args: argparse.Namespace) -> None:
    from mdc_workbench.export.encoder_export import export_run
    out = export_run(args.run, args.out, fmt=args.fmt, step=args.step, ema=args.ema, force=args.force,
                     metrics=args.metrics)
    print(f"exported {args.run} as {args.fmt} into {out}: " + ", ".join(sorted(p.name for p in out.iterdir())))
    print(f"load it: see {out / 'README.md'}")


def check_export(args: argparse.Namespace) -> None:
    """An unknown --format is an error before torch is imported (the library checks it again)."""
    if args.fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {args.fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}")


HANDLERS = {"export": cmd_export}
CHECKS = {"export": check_export}  # run before the heavy imports (mdc_workbench.cli.main)
