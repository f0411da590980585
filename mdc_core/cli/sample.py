"""``mdc score`` (likelihood of captions given an image) and ``mdc sample --length auto`` (adaptive length).

Thin wrappers around :mod:`mdc_core.scoring` and :mod:`mdc_core.auto_length`; :mod:`mdc_core.cli` registers them.
"""

from __future__ import annotations

import argparse
import json
import time


def add_score_parser(sub: argparse._SubParsersAction) -> None:
    score = sub.add_parser("score", help="likelihood score of captions for one image (mc, heuristic or ar)")
    score.add_argument("--run", required=True, help="run or checkpoint folder (MDC-family or ARC)")
    score.add_argument("--image", required=True, help="image file")
    score.add_argument("--caption", action="append", required=True, help="caption text (repeatable)")
    score.add_argument("--method", required=True, choices=("heuristic", "mc", "ar"),
                       help="heuristic / mc: MDC; ar: ARC chain rule, or left-to-right order for MDC")
    score.add_argument("--samples", type=int, default=1024, help="Monte Carlo samples per caption (mc)")
    score.add_argument("--seed", type=int, default=0, help="seed of the Monte Carlo masks (mc)")
    score.add_argument("--batch-size", type=int, default=256, help="decoder rows per forward pass (memory only)")
    score.add_argument("--ema", action="store_true", help="use the EMA weights")
    score.add_argument("--device", default="cpu")
    score.add_argument("--json", action="store_true", help="print a JSON list: caption, score, stderr (mc), tokens...")


def cmd_score(args: argparse.Namespace) -> None:
    import torch

    from mdc_core.checkpoint import load_model
    from mdc_core.data import load_image
    from mdc_core.scoring import model_kind, score_captions
    model, cfg = load_model(args.run, device=args.device, ema=args.ema)
    model_kind(model)  # a CLIP run fails here, before any work
    image = load_image(args.image, cfg.model.image_size)[None].to(args.device)
    start = time.perf_counter()
    with torch.no_grad():
        image_tokens = model.encode_image(image)  # encoded once for all captions
    rows = score_captions(model, image_tokens, args.caption, args.method, samples=args.samples, seed=args.seed,
                          batch_size=args.batch_size)
    seconds = time.perf_counter() - start
    if args.json:
        print(json.dumps(rows))
        return
    best = max(range(len(rows)), key=lambda i: rows[i]["score"])
    for i, r in enumerate(rows):
        err = f" +- {r['stderr']:.3f}" if "stderr" in r else ""
        print(f"{'*' if i == best else ' '} {r['score']:10.3f}{err}  ({len(r['tokens'])} tokens)  {r['caption']}")
    print(f"{args.method} scores (log-likelihood, higher = more likely) of {len(rows)} captions in {seconds:.2f} s")


def cmd_sample_auto(args: argparse.Namespace, model, cfg, image) -> None:  # noqa: ANN001 - see cli.cmd_sample
    """``mdc sample --length auto``: the best candidate of each N' in ``--auto-range`` by heuristic score per token."""
    import torch

    from mdc_core.auto_length import parse_range, sample_auto_length
    from mdc_core.sampler import trajectory
    from mdc_core.tokenizer import CaptionTokenizer
    lengths = parse_range(args.auto_range, cfg.model.context_length)
    tok = CaptionTokenizer(cfg.model.context_length)
    start = time.perf_counter()
    with torch.no_grad():
        out = sample_auto_length(model, model.encode_image(image), cfg.sampler, lengths)
    latency = time.perf_counter() - start
    k = int(out.choice[0])
    record = trajectory(out.candidates[k], tok)
    record["length"] = lengths[k]
    record["candidates"] = [
        {"length": n, "caption": tok.decode(c.tokens[0]), "score": float(out.scores[0, j]),
         "normalized_score": float(out.normalized[0, j])}
        for j, (n, c) in enumerate(zip(lengths, out.candidates, strict=True))]
    record["latency_s"] = latency
    if args.json:
        print(json.dumps(record))
        return
    print(record["caption"])
    print(f"chosen N' = {lengths[k]} of {lengths[0]}..{lengths[-1]} by heuristic score per token "
          f"({len(lengths)} lengths sampled and scored in {latency * 1000:.0f} ms)")
    for c in record["candidates"]:
        mark = "*" if c["length"] == lengths[k] else " "
        print(f"  {mark} N'={c['length']:2d}  {c['normalized_score']:8.3f}/token  {c['caption']}")
