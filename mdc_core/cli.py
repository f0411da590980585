"""Command line: ``mdc data synth | train | sample | demo | presets`` (also ``python -m mdc_core``).

Every verb is a thin wrapper: it parses arguments, calls the library, prints a result. Errors a user can fix
(missing files, bad config keys, unreadable images) print one line ``mdc: error: ...`` and exit with 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from .bench.cli import add_bench_parser, cmd_bench
from .config import SAMPLER_RANGES, ConfigError, apply_overrides, list_presets, load_preset
from .eval_cli import add_eval_parser, cmd_eval
from .mc_diffusion_cli import add_guidance_args, add_vqvae_parser, cmd_vqvae
from .score_cli import add_score_parser, cmd_sample_auto, cmd_score

USER_ERRORS = (ConfigError, FileNotFoundError, FileExistsError, ValueError)


def _add_sampler_args(p: argparse.ArgumentParser) -> None:
    lo, hi = SAMPLER_RANGES["length"]
    p.add_argument("--length", type=_length_arg,
                   help=f"caption length N' in tokens ({lo:.0f}-{hi:.0f}; default: the run's), or 'auto': sample "
                   "every N' of --auto-range and keep the best heuristic score per token")
    p.add_argument("--threshold", type=float,
                   help="parallel decoding: also reveal every masked token this confident (0-1; 0 = off)")
    p.add_argument("--tokens-per-step", type=int, help="tokens revealed per step k (default 1, as the paper)")
    p.add_argument("--temperature", type=float, help="0 = greedy (default); > 0 samples the candidate tokens")
    p.add_argument("--top-k", type=int, help="with --temperature, sample among the k best tokens (0 = all)")
    p.add_argument("--seed", type=int, help="seed for temperature sampling")


def _length_arg(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of tokens or 'auto', got {text!r}") from None


def _sampler_overrides(args: argparse.Namespace) -> list[str]:
    pairs = {"length": None if args.length == "auto" else args.length, "tokens_per_step": args.tokens_per_step,
             "temperature": args.temperature, "top_k": args.top_k, "seed": args.seed,
             "threshold": args.threshold}
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
    shards = data.add_parser("shards", help="write your image-caption folder or CSV/TSV/COCO json as tar shards")
    shards.add_argument("--from", dest="source", required=True,
                        help="caption table (.csv/.tsv/.json) or a folder of images with same-name .txt captions")
    shards.add_argument("--out", required=True, help="output folder for 00000.tar, 00001.tar, ...")
    shards.add_argument("--shard-size", type=int, default=10_000, help="samples per tar shard")
    shards.add_argument("--no-check", action="store_true", help="do not decode images (faster; broken ones stay)")
    shards.add_argument("--quiet", action="store_true", help="no progress bar")
    dbench = data.add_parser("bench", help="data throughput: images/s decoded + augmented, per worker")
    dbench.add_argument("--data", required=True, help="data path (shard folder, brace pattern, CSV/TSV, COCO)")
    dbench.add_argument("--image-size", type=int, nargs="+", default=[64, 224], help="output pixels (square)")
    dbench.add_argument("--workers", type=int, default=0, help="DataLoader workers (0 = this process)")
    dbench.add_argument("--batch-size", type=int, default=64)
    dbench.add_argument("--batches", type=int, default=20, help="batches timed (after 2 warm-up batches)")
    dbench.add_argument("--augment", choices=("none", "rrc"), default="rrc", help="random resized crop or not")
    dbench.add_argument("--json", action="store_true", help="print the results as JSON")

    train = sub.add_parser("train", help="train a captioner")
    train.add_argument("--preset", default="tiny", help=f"one of: {', '.join(list_presets())}")
    train.add_argument("--data", help="data path (shard folder, brace pattern, CSV/TSV or COCO JSON)")
    train.add_argument("--out", required=True, help="run folder")
    train.add_argument("--objective", choices=("mdc", "mdc_no_t", "bert", "parallel", "arc", "clip", "d3pm"))
    train.add_argument("--steps", type=int, help="optimizer steps")
    train.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override any config key, e.g. --set train.lr=1e-3 (repeatable)")
    train.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    train.add_argument("--quiet", action="store_true", help="no progress bar")

    samp = sub.add_parser("sample", help="caption one image: confidence unmasking (MDC), ancestral D3PM sampling "
                          "(--objective d3pm runs), optionally guided")
    samp.add_argument("--run", required=True, help="run or checkpoint folder")
    samp.add_argument("--image", required=True, help="image file")
    _add_sampler_args(samp)
    samp.add_argument("--ema", action="store_true", help="use the EMA weights")
    samp.add_argument("--device", default="cpu")
    samp.add_argument("--json", action="store_true", help="print the caption and its full trajectory as JSON")
    samp.add_argument("--auto-range", default="3-20", help="N' tried by --length auto: LO-HI or a list 5,10,15")
    add_guidance_args(samp)  # --guidance, --guidance-scale, --guidance-p-mask, --diffusion-stride: mc_diffusion_cli

    demo = sub.add_parser("demo", help="the main job: synthesize data, train the tiny MDC model, caption test images")
    demo.add_argument("--out", default="outputs/demo", help="folder for data, run and report")
    demo.add_argument("--n", type=int, default=20000, help="training pairs to synthesize")
    demo.add_argument("--steps", type=int, help="training steps (default: the tiny preset's)")
    demo.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    demo.add_argument("--limit", type=int, default=256, help="test images to caption")
    demo.add_argument("--quiet", action="store_true")

    sub.add_parser("presets", help="list the registered presets")
    _add_probe_parser(sub)

    app = sub.add_parser("app", help="the gradio app: watch a caption being unmasked (binds 127.0.0.1)")
    app.add_argument("--run", help="run folder selected at start (default: the MDC model of `make demo`, "
                     "else outputs/demo/run of `mdc demo`)")
    app.add_argument("--root", default=".", help="run folders under it (4 levels deep) are offered in the run menu")
    app.add_argument("--host", default="127.0.0.1", help="interface to bind (other than loopback: on purpose only)")
    app.add_argument("--port", type=int, help="port (default: gradio's first free one from 7860)")
    app.add_argument("--share", action="store_true", help="also open a public gradio.live link (off by default)")

    add_eval_parser(sub)  # mdc eval <verb>: mdc_core.eval_cli
    add_bench_parser(sub)  # mdc bench [model]: mdc_core.bench.cli
    add_score_parser(sub)  # mdc score: mdc_core.score_cli
    add_vqvae_parser(sub)  # mdc vqvae train | show: mdc_core.mc_diffusion_cli

    runs = sub.add_parser("runs", help="execute notebooks with papermill over a plan's parameter grid")
    runs.add_argument("plan", help="plan YAML file (see plans/)")
    runs.add_argument("--dry-run", action="store_true", help="check the plan, parameters and notebooks; run nothing")
    runs.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def cmd_data(args: argparse.Namespace) -> None:
    {"synth": cmd_data_synth, "shards": cmd_data_shards, "bench": cmd_data_bench}[args.data_verb](args)


def cmd_data_shards(args: argparse.Namespace) -> None:
    from .data.shards import write_shards
    stats = write_shards(args.source, args.out, shard_size=args.shard_size, check_images=not args.no_check,
                         progress=not args.quiet)
    print(f"wrote {stats['written']} pairs in {stats['shards']} shards; skipped {stats['skipped'] or 'none'}")
    print(f"train with: --data '{stats['pattern']}'")


def cmd_data_bench(args: argparse.Namespace) -> None:
    from .data.throughput import bench_data
    rows = bench_data(args.data, image_sizes=tuple(args.image_size), workers=args.workers,
                      batch_size=args.batch_size, batches=args.batches, augment=args.augment)
    if args.json:
        print(json.dumps(rows))
        return
    for r in rows:
        print(f"{r['image_size']:4d} px  augment={r['augment']:4s}  {r['workers']} worker(s): "
              f"{r['images_per_s']:8.1f} images/s  = {r['images_per_s_per_worker']:8.1f} per worker "
              f"({r['images']} images in {r['seconds']:.2f} s)")


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
    from .guidance import GuidedCaptioner
    from .mc_diffusion_cli import check_mdc_sampler_args, cmd_sample_d3pm, guidance_config
    from .sampler import sample, trajectory
    from .tokenizer import CaptionTokenizer
    model, cfg = load_model(args.run, device=args.device, ema=args.ema)
    guidance = guidance_config(args, cfg)
    image = load_image(args.image, cfg.model.image_size)[None].to(args.device)
    if cfg.objective.name == "d3pm":  # MC-Diffusion: T-step ancestral sampling
        return cmd_sample_d3pm(args, model, cfg, image, guidance)
    check_mdc_sampler_args(args, cfg)
    cfg = apply_overrides(cfg, _sampler_overrides(args))
    if args.length == "auto":
        if guidance.mode != "none":
            raise ValueError("--length auto ranks lengths by the unguided heuristic score; drop --guidance or "
                             "give --length N")
        return cmd_sample_auto(args, model, cfg, image)
    start = time.perf_counter()
    with torch.no_grad():
        out = sample(GuidedCaptioner(model, guidance), model.encode_image(image), cfg.sampler)
    latency = time.perf_counter() - start
    record = trajectory(out, CaptionTokenizer(cfg.model.context_length))
    record["sampler"] = "mdc"
    record["settings"]["guidance"] = dataclasses.asdict(guidance)
    record["latency_s"] = latency
    if args.json:
        print(json.dumps(record))
        return
    print(record["caption"])
    order = " ".join(f"{s['token']}@{s['position']}({s['confidence']:.2f})" for s in record["steps"])
    print(f"reveal order: {order}")
    shown = "" if guidance.mode == "none" else f", guidance {guidance.mode} w={guidance.scale:g}"
    print(f"{record['settings']['steps']} steps in {latency * 1000:.0f} ms{shown}")


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
    print(f"\nheld-out test captions (reference -> MDC greedy, N' = {cfg.sampler.length}):")
    for row in report["captions"][:12]:
        mark = {True: "ok ", False: "BAD"}.get(row.get("correct"), "   ")
        print(f"  {mark} {row['reference'][:60]:<60} -> {row['caption']}")
    acc = report["single_object_accuracy"]
    if acc is not None:
        print(f"\nsingle-object scenes naming the right colour and shape: {acc:.1%} "
              f"of {report['n_single_object']}")
    print(f"report: {out / 'report.json'}   run: {run_dir}   try: mdc sample --run {run_dir} --image IMG")


def cmd_runs(args: argparse.Namespace) -> None:
    from .runs import describe_plan, load_plan, run_plan
    plan = load_plan(args.plan)
    if args.dry_run:
        print(describe_plan(plan))
        print("\nplan is valid (nothing was run)")
        return
    results = run_plan(plan, progress=not args.quiet)
    failed = [r for r in results if r.status == "failed"]
    print(f"plan {plan.name}: {len(results) - len(failed)} of {len(results)} runs finished; "
          f"summary: {plan.out_dir / 'summary.md'}")
    for r in failed:
        print(f"  FAILED {r.run_id}: {r.error.splitlines()[0][:200]}  (see {r.run_dir})")
    for r in results:  # notebooks that name the model they trained (01) point at the app
        try:
            model_dir = json.loads((r.run_dir / "metrics.json").read_text())["run_dir"]
        except (OSError, ValueError, KeyError):
            continue
        print(f"watch {r.run_id}'s model caption: mdc app --run {model_dir}")
    if failed:
        raise SystemExit(1)


def cmd_app(args: argparse.Namespace) -> None:
    from app.mdc_app import serve
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"mdc app: binding {args.host}: anyone who can reach this machine can use the app", file=sys.stderr)
    serve(args.run, root=args.root, host=args.host, port=args.port, share=args.share)


def cmd_presets(args: argparse.Namespace) -> None:
    for name in list_presets():
        cfg = load_preset(name)
        m = cfg.model
        print(f"{name:10s} encoder={m.encoder} {m.image_size}px  decoder {m.text_layers}x{m.text_width} "
              f"({m.text_heads} heads)  ctx={m.context_length}  lr={cfg.train.lr} wd={cfg.train.weight_decay}")


def _add_probe_parser(sub: argparse._SubParsersAction) -> None:
    from .data import LABEL_NAMES
    probe = sub.add_parser("probe", help="linear probe of a run's frozen encoder (converged L-BFGS; Table 1)")
    probe.add_argument("--run", action="append", required=True, help="run or checkpoint folder (repeatable)")
    probe.add_argument("--data", required=True, help="synthetic data folder, class folders root/train|val/CLASS/, "
                       "or CIFAR python pickles")
    probe.add_argument("--task", default="all", choices=("all", *LABEL_NAMES, "class"),
                       help="synthetic-data label to probe, or all of them (folder/CIFAR data: class)")
    probe.add_argument("--format", default="auto", choices=("auto", "synth", "folder", "cifar"))
    probe.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (features and probe)")
    probe.add_argument("--batch-size", type=int, default=64, help="images per feature-extraction batch")
    probe.add_argument("--limit", type=int, help="only the first N images of each split (quick looks)")
    probe.add_argument("--protocol", default="lbfgs", choices=("lbfgs", "clip_benchmark"),
                       help="lbfgs: logistic regression to convergence, C searched on a val split (CLIP paper A.3); "
                       "clip_benchmark: AdamW lr 0.1, 10 epochs, batch 64 (under-fits small sets)")
    probe.add_argument("--C", dest="c", type=float, help="lbfgs: fixed inverse regularisation (default: search)")
    probe.add_argument("--weight-decay", type=float, help="clip_benchmark: fixed weight decay (default: search)")
    probe.add_argument("--baselines", nargs="*", default=["random"], choices=("random", "pixels"),
                       help="baseline rows: random = the architecture untrained, pixels = raw pixels (default: random)")
    probe.add_argument("--cache-dir", help="feature cache folder (default: RUN/probe_features)")
    probe.add_argument("--ema", action="store_true", help="use the EMA weights")
    probe.add_argument("--out", help="also write the result JSON to this file")
    probe.add_argument("--json", action="store_true", help="print the result as JSON")
    probe.add_argument("--quiet", action="store_true", help="no progress bars")


def cmd_probe(args: argparse.Namespace) -> None:
    from .eval.probe_data import probe_runs
    result = probe_runs(args.run, args.data, task=args.task, fmt=args.format, device=args.device,
                        batch_size=args.batch_size, cache_dir=args.cache_dir, ema=args.ema, limit=args.limit,
                        weight_decay=args.weight_decay, progress=not args.quiet, protocol=args.protocol, c=args.c,
                        baselines=args.baselines)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result))
        return
    for run in result["runs"]:
        print(f"{run['objective']} run {run['run']} ({run['init']} weights, step {run['step']}, {run['pool']} "
              f"features, {run['protocol']} probe) on {run['format']} data {run['data']}")
        reg = "C" if run["protocol"] == "lbfgs" else "wd"
        print(f"  {'task':12s} {'classes':>7s} {'top-1':>7s} {'top-5':>7s} {'balanced':>8s} {reg:>9s}")
        for task, r in run["tasks"].items():
            print(f"  {task:12s} {r['n_classes']:7d} {r['top1']:7.1%} {r['top5']:7.1%} "
                  f"{r['balanced_accuracy']:8.1%} {r['C'] if reg == 'C' else r['weight_decay']:9.2e}")
    print("\ntop-1 (%):\n" + result["table"])


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = {"data": cmd_data, "train": cmd_train, "sample": cmd_sample, "demo": cmd_demo,
               "presets": cmd_presets, "probe": cmd_probe,
               "app": cmd_app, "runs": cmd_runs, "eval": cmd_eval, "bench": cmd_bench,
               "score": cmd_score, "vqvae": cmd_vqvae}[args.verb]
    try:
        handler(args)
    except USER_ERRORS as err:
        print(f"mdc: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mdc: interrupted", file=sys.stderr)
        return 130
    except RuntimeError as err:  # a training run stopped for a reason its message explains
        from .distributed import RankFailure
        from .train import TrainingDiverged
        if not isinstance(err, (TrainingDiverged, RankFailure)):
            raise
        print(f"mdc: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
