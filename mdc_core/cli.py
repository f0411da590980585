"""Command line: ``mdc data synth | train | sample | demo | presets`` (also ``python -m mdc_core``).

Every verb is a thin wrapper: it parses arguments, calls the library, prints a result. Errors a user can fix
(missing files, bad config keys, unreadable images) print one line ``mdc: error: ...`` and exit with 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .config import SAMPLER_RANGES, ConfigError, apply_overrides, list_presets, load_preset

USER_ERRORS = (ConfigError, FileNotFoundError, FileExistsError, ValueError)


def _add_sampler_args(p: argparse.ArgumentParser) -> None:
    lo, hi = SAMPLER_RANGES["length"]
    p.add_argument("--length", type=int, help=f"caption length N' in tokens ({lo:.0f}-{hi:.0f}; default: the run's)")
    p.add_argument("--tokens-per-step", type=int, help="tokens revealed per step k (default 1, as the paper)")
    p.add_argument("--temperature", type=float, help="0 = greedy (default); > 0 samples the candidate tokens")
    p.add_argument("--top-k", type=int, help="with --temperature, sample among the k best tokens (0 = all)")
    p.add_argument("--seed", type=int, help="seed for temperature sampling")


def _sampler_overrides(args: argparse.Namespace) -> list[str]:
    pairs = {"length": args.length, "tokens_per_step": args.tokens_per_step, "temperature": args.temperature,
             "top_k": args.top_k, "seed": args.seed}
    return [f"sampler.{k}={json.dumps(v)}" for k, v in pairs.items() if v is not None]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mdc", description="Masked diffusion captioning workbench.")
    sub = parser.add_subparsers(dest="verb", required=True)

    data = sub.add_parser("data", help="data set tools").add_subparsers(dest="data_verb", required=True)
    synth = data.add_parser("synth", help="write the embedded synthetic data set as WebDataset shards")
    synth.add_argument("--out", required=True, help="output folder")
    synth.add_argument("--n", type=int, required=True, help="number of training pairs")
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--image-size", type=int, default=64, help="pixels (square)")
    synth.add_argument("--captions", choices=("short", "long", "mixed"), default="mixed", help="caption style")
    synth.add_argument("--shard-size", type=int, default=1000, help="samples per tar shard")

    train = sub.add_parser("train", help="train a captioner")
    train.add_argument("--preset", default="tiny", help=f"one of: {', '.join(list_presets())}")
    train.add_argument("--data", help="data path (shard folder, brace pattern, CSV/TSV or COCO JSON)")
    train.add_argument("--out", required=True, help="run folder")
    train.add_argument("--objective", choices=("mdc", "mdc_no_t", "bert", "parallel", "arc"))
    train.add_argument("--steps", type=int, help="optimizer steps")
    train.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override any config key, e.g. --set train.lr=1e-3 (repeatable)")
    train.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    train.add_argument("--quiet", action="store_true", help="no progress bar")

    samp = sub.add_parser("sample", help="caption one image by confidence unmasking")
    samp.add_argument("--run", required=True, help="run or checkpoint folder")
    samp.add_argument("--image", required=True, help="image file")
    _add_sampler_args(samp)
    samp.add_argument("--ema", action="store_true", help="use the EMA weights")
    samp.add_argument("--device", default="cpu")
    samp.add_argument("--json", action="store_true", help="print the caption and its full trajectory as JSON")

    demo = sub.add_parser("demo", help="the main job: synthesize data, train the tiny MDC model, caption test images")
    demo.add_argument("--out", default="outputs/demo", help="folder for data, run and report")
    demo.add_argument("--n", type=int, default=20000, help="training pairs to synthesize")
    demo.add_argument("--steps", type=int, help="training steps (default: the tiny preset's)")
    demo.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    demo.add_argument("--limit", type=int, default=256, help="test images to caption")
    demo.add_argument("--quiet", action="store_true")

    sub.add_parser("presets", help="list the registered presets")
    return parser


def cmd_data_synth(args: argparse.Namespace) -> None:
    from .data import write_synthetic_dataset
    manifest = write_synthetic_dataset(args.out, args.n, seed=args.seed, image_size=args.image_size,
                                       captions=args.captions, shard_size=args.shard_size)
    counts = manifest.get("counts", {})
    print(f"wrote {args.out}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


def _train_config(args: argparse.Namespace):
    overrides = list(args.set)
    if args.data:
        overrides.append(f"data.path={json.dumps(args.data)}")
    if args.objective:
        overrides.append(f"objective.name={args.objective}")
    if args.steps:
        overrides.append(f"train.steps={args.steps}")
    return load_preset(args.preset, overrides)


def cmd_train(args: argparse.Namespace) -> None:
    from .train import train
    cfg = _train_config(args)
    result = train(cfg, args.out, resume=args.resume, progress=not args.quiet)
    print(f"trained {result.steps} steps, final loss {result.final_loss:.4f}; checkpoint {result.checkpoint}")
    if result.skipped:
        print(f"skipped corrupt records: {result.skipped}")
    if result.truncated:
        print(f"captions truncated to the context: {result.truncated}")


def cmd_sample(args: argparse.Namespace) -> None:
    import torch

    from .checkpoint import load_model
    from .data import load_image
    from .sampler import sample, trajectory
    from .tokenizer import CaptionTokenizer
    model, cfg = load_model(args.run, device=args.device, ema=args.ema)
    cfg = apply_overrides(cfg, _sampler_overrides(args))
    image = load_image(args.image, cfg.model.image_size)[None].to(args.device)
    start = time.perf_counter()
    with torch.no_grad():
        out = sample(model, model.encode_image(image), cfg.sampler)
    latency = time.perf_counter() - start
    record = trajectory(out, CaptionTokenizer(cfg.model.context_length))
    record["latency_s"] = latency
    if args.json:
        print(json.dumps(record))
        return
    print(record["caption"])
    order = " ".join(f"{s['token']}@{s['position']}({s['confidence']:.2f})" for s in record["steps"])
    print(f"reveal order: {order}")
    print(f"{record['settings']['steps']} steps in {latency * 1000:.0f} ms")


def cmd_demo(args: argparse.Namespace) -> None:
    from .checkpoint import load_model
    from .data import read_manifest, write_synthetic_dataset
    from .report import caption_report
    from .train import train
    out = Path(args.out)
    data_dir = out / "data"
    try:
        manifest = read_manifest(data_dir)
        print(f"reusing data set {data_dir} ({manifest.get('counts')})")
    except (FileNotFoundError, ValueError):
        write_synthetic_dataset(data_dir, args.n, seed=0, progress=not args.quiet)
    overrides = [f"data.path={json.dumps(str(data_dir))}", *args.set]
    if args.steps:
        overrides.append(f"train.steps={args.steps}")
    cfg = load_preset("tiny", overrides)
    run_dir = out / "run"
    from .checkpoint import latest_checkpoint
    done = latest_checkpoint(run_dir)
    if done is not None and json.loads((done / "meta.json").read_text())["step"] >= cfg.train.steps:
        print(f"reusing trained run {run_dir}")
    else:
        start = time.perf_counter()
        train(cfg, run_dir, resume=done is not None, progress=not args.quiet)
        print(f"trained in {time.perf_counter() - start:.0f} s")
    model, cfg = load_model(run_dir)
    report = caption_report(model, cfg.data, cfg.sampler, split="test", limit=args.limit, progress=not args.quiet)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print("\nheld-out test captions (reference -> MDC greedy, N' = %d):" % cfg.sampler.length)
    for row in report["captions"][:12]:
        mark = {True: "ok ", False: "BAD"}.get(row.get("correct"), "   ")
        print(f"  {mark} {row['reference'][:60]:<60} -> {row['caption']}")
    acc = report["single_object_accuracy"]
    if acc is not None:
        print(f"\nsingle-object scenes naming the right colour and shape: {acc:.1%} "
              f"of {report['n_single_object']}")
    print(f"report: {out / 'report.json'}   run: {run_dir}   try: mdc sample --run {run_dir} --image IMG")


def cmd_presets(args: argparse.Namespace) -> None:
    for name in list_presets():
        cfg = load_preset(name)
        m = cfg.model
        print(f"{name:10s} encoder={m.encoder} {m.image_size}px  decoder {m.text_layers}x{m.text_width} "
              f"({m.text_heads} heads)  ctx={m.context_length}  lr={cfg.train.lr} wd={cfg.train.weight_decay}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = {"data": cmd_data_synth, "train": cmd_train, "sample": cmd_sample, "demo": cmd_demo,
               "presets": cmd_presets}[args.verb]
    try:
        handler(args)
    except USER_ERRORS as err:
        print(f"mdc: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mdc: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
