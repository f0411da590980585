"""``mdc eval compositionality | captioning | central-claim | parallel-decoding | objects`` and ``mdc probe``.

Each handler calls one evaluation of :mod:`mdc_workbench.eval`, writes its JSON (and figure) into ``--out`` and
prints a table; :func:`mdc_workbench.cli.main` turns the user errors they raise into one ``mdc: error:`` line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mdc_workbench.cli.common import flags

# = mdc_workbench.data.LABEL_NAMES, written out so that building the parser imports no torch (mdc_core.data does);
# tests/workbench/test_cli_reliability.py checks that they agree
PROBE_LABELS = ("shape", "colour", "size", "position", "count", "background")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """``mdc eval <verb>`` (one sub-parser per evaluation; its handler goes into EVAL_HANDLERS) and ``mdc probe``."""
    verbs = sub.add_parser("eval", help="evaluate runs (compositionality, captioning, ...)").add_subparsers(
        dest="eval_verb", required=True)
    # further `mdc eval` verbs: a function here that adds the parser, the handler in EVAL_HANDLERS
    for add in (_add_compositionality, _add_captioning, _add_central_claim, _add_parallel_decoding,
                _add_objects):
        add(verbs)
    _add_probe_parser(sub)


def _add_compositionality(verbs: argparse._SubParsersAction) -> None:
    comp = verbs.add_parser("compositionality", help="pick-the-true-caption accuracy (paper Table 2)", parents=[flags(
        runs=True, data="benchmark data: folder or json (see README)",
        limit="at most N examples (per task file for SugarCrepe)", split="split of the embedded data (synth)",
        seed="seed of the mc estimator and of order perturbations", device=True, precision=True,
        out={"default": "outputs/eval", "required": False, "help": "folder for compositionality_<benchmark>.json/.md"},
        json="print the result JSON instead of the table", quiet=True)])
    comp.add_argument("--benchmark", default="synth", choices=("synth", "aro-relation", "aro-attribution",
                                                              "coco-order", "flickr-order", "sugarcrepe"))
    comp.add_argument("--methods", nargs="+", help="mc heuristic ar (MDC), ar (ARC), cosine (CLIP); "
                      "default: mc heuristic / ar / cosine")
    comp.add_argument("--samples", type=int, default=1024, help="Monte Carlo samples per caption (mc)")
    comp.add_argument("--images", help="image folder, when not where the benchmark keeps it")
    comp.add_argument("--no-blind", dest="blind", action="store_false",
                      help="skip the blind rows (each run scored again with the mean image instead of the image)")
    comp.add_argument("--length-norm", action="store_true",
                      help="add per-token rows: likelihood scores divided by the caption's token count")


def _add_captioning(verbs: argparse._SubParsersAction) -> None:
    cap = verbs.add_parser("captioning", help="fine-tune (optional) and caption a test split (paper Table 3)",
                           parents=[flags(
        runs="run folder, MDC-family or ARC (repeatable)",
        data="Karpathy json, COCO caption json, CSV or embedded data folder", limit="caption at most N test images",
        batch_size={"default": 32, "help": "images per decoding batch"}, device=True, precision=True,
        out={"default": "outputs/eval", "required": False, "help": "folder for captioning.json/.md and finetune/ runs"},
        json="print the result JSON instead of the table", quiet="no progress bars")])
    cap.add_argument("--images", help="image folder of a caption json/CSV (default: beside it, or the COCO layout "
                     "annotations/ + val2017/)")
    cap.add_argument("--lengths", nargs="+", default=["10", "15", "20"],
                     help="MDC caption lengths: numbers of tokens N', and median (the test captions' median length), "
                     "oracle (each image at its reference's length), auto (MDC picks its own, --auto-range)")
    cap.add_argument("--auto-range", default="3-20", help="N' tried by --lengths auto: LO-HI or a list 5,10,15")
    cap.add_argument("--beam", type=int, default=6, help="ARC beam size (ARC is also decoded greedily)")
    cap.add_argument("--finetune-steps", type=int, default=0, help="fine-tune each run this many steps first")
    cap.add_argument("--finetune-data", help="training data for fine-tuning (default: --data's train split)")
    cap.add_argument("--finetune-set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                     help="config override for fine-tuning, e.g. train.batch_size=32 (repeatable)")
    cap.add_argument("--metrics", nargs="+", default=["BLEU", "METEOR", "ROUGE-L", "CIDEr", "SPICE"],
                     help="pycocoevalcap metrics (METEOR and SPICE need Java)")
    cap.add_argument("--max-length", type=int, help="ARC: most tokens generated, <eot> included (default: the context)")


def _add_central_claim(verbs: argparse._SubParsersAction) -> None:
    cc = verbs.add_parser("central-claim", help="the paper's central claim: the visual learning signal (image "
                          "gradient, in-distribution PMI) along short and two-clause captions", parents=[flags(
        limit={"default": 512, "help": "test captions scored per caption kind (the first N)"},
        batch_size={"default": 32, "help": "captions per batch (the PMI's pool comes from the batch)"}, seed=True,
        device=True,
        out={"default": "outputs/eval", "required": False, "help": "folder for central_claim.json and .png"},
        json="print the result JSON")])
    for kind, what in (("short", "short captions"), ("clauses", "two-clause captions (caption style clauses)")):
        cc.add_argument(f"--{kind}-runs", nargs="+", required=True, metavar="RUN",
                        help=f"captioner runs (an ARC and an MDC) trained on {what}")
        cc.add_argument(f"--{kind}-data", required=True, help=f"the data set of those {what}")
    cc.add_argument("--draws", type=int, default=4, help="training-mask draws per batch of a masked model")
    cc.add_argument("--pool", type=int, default=15, help="other images of the batch in the PMI's pool")


def _add_parallel_decoding(verbs: argparse._SubParsersAction) -> None:
    par = verbs.add_parser("parallel-decoding", help="caption quality and speed vs denoising steps (k per step, "
                           "confidence threshold)", parents=[flags(
        run="MDC-family run folder", data="embedded data folder (single-object labels give the accuracies)",
        split=True, limit={"default": 256, "help": "caption the first N images of the split"},
        batch_size={"default": 64, "help": "images per decoding batch"}, device=True, precision=True,
        out={"default": "outputs/eval", "required": False, "help": "folder for parallel_decoding.json and .png"},
        json="print the result JSON instead of the table", quiet=True)])
    par.add_argument("--thresholds", default="0.9,0.7,0.5,0.3", help="confidence thresholds in (0, 1] (with k=1)")
    par.add_argument("--ks", default="1,2,3", help="tokens per step k (k=1 is the greedy reference)")
    par.add_argument("--length", type=int, help="caption length N' (default: the run's sampler.length)")
    par.add_argument("--timing-repeats", type=int, default=3, help="time each batch this often, keep the fastest")


def _add_objects(verbs: argparse._SubParsersAction) -> None:
    obj = verbs.add_parser("objects", help="single-object colour+shape accuracy at every checkpoint of a run "
                           "(embedded data): when did the run learn to name shapes?", parents=[flags(
        runs="MDC-family run folder (repeatable: one line each in the plot)",
        data={"required": False, "help": "embedded data folder (default: each run's own data.path)"}, split=True,
        limit={"default": 512, "help": "caption the first N images of the split"},
        batch_size={"default": 64, "help": "images per decoding batch"}, ema=True, device=True, precision=True,
        out={"default": "outputs/eval", "required": False, "help": "folder for objects.json and objects.png"},
        json="print the result JSON instead of the tables", quiet="no progress bars")])
    obj.add_argument("--lengths", type=int, nargs="+", help="caption lengths N' (default: the run's sampler.length)")


def cmd_eval_compositionality(args: argparse.Namespace) -> None:
    from mdc_workbench.eval.compositionality import compositionality
    result = compositionality(args.run, args.benchmark, args.data, methods=args.methods, samples=args.samples,
                              limit=args.limit, images=args.images, split=args.split, seed=args.seed,
                              device=args.device, progress=not args.quiet, blind=args.blind,
                              length_norm=args.length_norm)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"compositionality_{args.benchmark}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"compositionality_{args.benchmark}.md").write_text(result["table"] + "\n")
    if args.json:
        print(json.dumps(result))
        return
    print(result["table"])
    for r in result["results"] + result["blind"]:
        skipped = f", skipped {r['skipped']}" if r["skipped"] else ""
        print(f"  {r['label']} [{r['run']}]: {r['n_examples']} examples in {r['seconds']:.1f} s{skipped}")
    print(f"results: {out / f'compositionality_{args.benchmark}.json'}")


def cmd_eval_captioning(args: argparse.Namespace) -> None:
    from mdc_workbench.eval.captioning import captioning
    result = captioning(args.run, args.data, lengths=args.lengths, beam=args.beam, finetune_steps=args.finetune_steps,
                        finetune_data=args.finetune_data, finetune_overrides=args.finetune_set, out=args.out,
                        limit=args.limit, metrics=args.metrics, batch_size=args.batch_size,
                        max_length=args.max_length, device=args.device, progress=not args.quiet,
                        images=args.images, auto_range=args.auto_range)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "captioning.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "captioning.md").write_text(result["table"] + "\n")
    if args.json:
        print(json.dumps(result))
        return
    print(result["table"])
    for name, reason in (result["results"][0]["unavailable"] if result["results"] else {}).items():
        print(f"  {name} unavailable: {reason[:160]}")
    for r in result["results"]:
        first = r["captions"][0] if r["captions"] else None
        if first:
            print(f"  {r['label']} {r['length']} [{r['run']}] e.g. {first['caption']!r}  ({r['seconds']:.1f} s)")
    print(f"results: {out / 'captioning.json'}  ({result['n_images']} test images)")


def _ratios(text: str) -> list[float] | None:
    try:
        return [float(r) for r in text.split(",") if r.strip()] or None
    except ValueError as err:
        raise ValueError(f"--ratios must be comma-separated numbers, got {text!r}") from err


def cmd_eval_central_claim(args: argparse.Namespace) -> None:
    from mdc_workbench.eval.central_claim import (
        central_claim_runs,
        claim_markdown,
        claim_table,
        connector_ids,
        plot_profiles,
    )
    from mdc_workbench.eval.claims import claims_markdown, evaluate_claims, gather_tables
    from mdc_workbench.eval.paper import CENTRAL_TABLE

    scores = central_claim_runs({"short": args.short_runs, "clauses": args.clauses_runs},
                                {"short": args.short_data, "clauses": args.clauses_data}, limit=args.limit,
                                draws=args.draws, pool=args.pool, seed=args.seed, device=args.device,
                                batch_size=args.batch_size)
    table = claim_table(scores, connector_ids())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "central_claim.json").write_text(json.dumps({"tables": {CENTRAL_TABLE: table}}) + "\n")
    plot = plot_profiles(table, out / "central_claim.png")
    if args.json:
        print(json.dumps(table, indent=1))
        return
    verdicts = [r for r in evaluate_claims(gather_tables([("cli", 0, {"tables": {CENTRAL_TABLE: table}})]))
                if r["table"] == CENTRAL_TABLE]
    print(claim_markdown(table))
    print("\n".join(["", "one training seed: every verdict is about these runs", *claims_markdown(verdicts, 3)]))
    print(f"results: {out / 'central_claim.json'}  plot: {plot}")


def _number_list(text: str, kind: type, flag: str) -> list:
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise ValueError(f"{flag} must be comma-separated {kind.__name__} values, got {text!r}") from err


def cmd_eval_parallel_decoding(args: argparse.Namespace) -> None:
    from mdc_workbench.eval.parallel_decoding import decoding_curve, plot_decoding_curve
    result = decoding_curve(args.run, args.data, thresholds=_number_list(args.thresholds, float, "--thresholds"),
                            ks=_number_list(args.ks, int, "--ks"), length=args.length, split=args.split,
                            limit=args.limit, batch_size=args.batch_size, device=args.device,
                            timing_repeats=args.timing_repeats, progress=not args.quiet)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "parallel_decoding.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    plot = plot_decoding_curve(result, out / "parallel_decoding.png")
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
        return
    print(result["table"])
    print(f"N'={result['length']}, {result['n_images']} images ({result['n_single_object']} single-object), "
          f"batch {args.batch_size} on {args.device}")
    print(f"results: {out / 'parallel_decoding.json'}  plot: {plot}")


def cmd_eval_objects(args: argparse.Namespace) -> None:
    from mdc_workbench.eval.object_curve import curve_table, object_accuracy_curve, plot_object_curves
    results = [object_accuracy_curve(run, data=args.data, lengths=args.lengths or (), split=args.split,
                                     limit=args.limit, batch_size=args.batch_size, device=args.device, ema=args.ema,
                                     progress=not args.quiet) for run in args.run]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "objects.json").write_text(json.dumps({"runs": results}, indent=1) + "\n")
    plot = plot_object_curves(results, out / "objects.png")
    if args.json:
        print(json.dumps({"runs": results}))
        return
    for result in results:
        print(f"{result['run']} ({result['split']} split of {result['data']}):")
        print(curve_table(result))
    print(f"results: {out / 'objects.json'}  plot: {plot}")


EVAL_HANDLERS = {"compositionality": cmd_eval_compositionality, "captioning": cmd_eval_captioning,
                 "central-claim": cmd_eval_central_claim, "parallel-decoding": cmd_eval_parallel_decoding,
                 "objects": cmd_eval_objects}


def cmd_eval(args: argparse.Namespace) -> None:
    EVAL_HANDLERS[args.eval_verb](args)


def _add_probe_parser(sub: argparse._SubParsersAction) -> None:
    probe = sub.add_parser("probe", help="linear probe of a run's frozen encoder (converged L-BFGS; Table 1)",
                           parents=[flags(
        runs="run or checkpoint folder (repeatable)",
        data="synthetic data folder, class folders root/train|val/CLASS/, or CIFAR python pickles",
        device="cpu | cuda | cuda:N (features and probe)", limit="only the first N images of each split (quick looks)",
        batch_size={"default": 64, "help": "images per feature-extraction batch"}, ema=True,
        out={"required": False, "help": "also write the result JSON to this file"}, json=True,
        quiet="no progress bars")])
    probe.add_argument("--task", default="all", choices=("all", *PROBE_LABELS, "class"),
                       help="synthetic-data label to probe, or all of them (folder/CIFAR data: class)")
    probe.add_argument("--format", default="auto", choices=("auto", "synth", "folder", "cifar"))
    probe.add_argument("--protocol", default="lbfgs", choices=("lbfgs", "clip_benchmark"),
                       help="lbfgs: logistic regression to convergence, C searched on a val split (CLIP paper A.3); "
                       "clip_benchmark: AdamW lr 0.1, 10 epochs, batch 64 (under-fits small sets)")
    probe.add_argument("--C", dest="c", type=float, help="lbfgs: fixed inverse regularisation (default: search)")
    probe.add_argument("--weight-decay", type=float, help="clip_benchmark: fixed weight decay (default: search)")
    probe.add_argument("--baselines", nargs="*", default=["random"], choices=("random", "pixels"),
                       help="baseline rows: random = the architecture untrained, pixels = raw pixels (default: random)")
    probe.add_argument("--cache-dir", help="feature cache folder (default: RUN/probe_features)")
    probe.add_argument("--heldout", action="store_true",
                       help="refuse to probe on the images a run was pretrained on (--data is its data.path); each "
                       "result records seen_in_pretraining either way")


def cmd_probe(args: argparse.Namespace) -> None:
    from mdc_workbench.eval.probe_data import probe_runs
    result = probe_runs(args.run, args.data, task=args.task, fmt=args.format, device=args.device,
                        batch_size=args.batch_size, cache_dir=args.cache_dir, ema=args.ema, limit=args.limit,
                        weight_decay=args.weight_decay, progress=not args.quiet, protocol=args.protocol, c=args.c,
                        baselines=args.baselines, heldout=args.heldout)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result))
        return
    for run in result["runs"]:
        seen = " (its pretraining images)" if run.get("seen_in_pretraining") and run["init"] == "trained" else ""
        print(f"{run['objective']} run {run['run']} ({run['init']} weights, step {run['step']}, {run['pool']} "
              f"features, {run['protocol']} probe) on {run['format']} data {run['data']}{seen}")
        reg = "C" if run["protocol"] == "lbfgs" else "wd"
        print(f"  {'task':12s} {'classes':>7s} {'top-1':>7s} {'top-5':>7s} {'balanced':>8s} {reg:>9s}")
        for task, r in run["tasks"].items():
            print(f"  {task:12s} {r['n_classes']:7d} {r['top1']:7.1%} {r['top5']:7.1%} "
                  f"{r['balanced_accuracy']:8.1%} {r['C'] if reg == 'C' else r['weight_decay']:9.2e}")
    print("\ntop-1 (%):\n" + result["table"])
    for run in result["runs"]:
        if any(run.get("skipped", {}).values()):
            print(f"skipped unreadable images of {run['run']}: {run['skipped']}")


HANDLERS = {"eval": cmd_eval, "probe": cmd_probe}
