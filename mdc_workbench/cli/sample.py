"""``mdc sample`` (caption one image: MDC's confidence unmasking, D3PM ancestral sampling for ``d3pm`` runs,
optionally guided; ``--length auto``) and ``mdc score`` (likelihood of captions given an image).

Thin wrappers around :mod:`mdc_core.sampler`, :mod:`mdc_core.scoring` (likelihoods, ``--length auto``) and, for
MC-Diffusion runs and guidance, :mod:`mdc_workbench.masked_conditional`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

from mdc_core.config import SCORE_METHODS, apply_overrides, sampler_options
from mdc_core.registry import objective_spec
from mdc_workbench.cli import trajectory
from mdc_workbench.cli.common import flags
from mdc_workbench.masked_conditional.plugin import GUIDANCE_MODES

D3PM_SAMPLER_OPTIONS = ("length", "temperature", "seed")  # the sampler options D3PM's ancestral sampler reads


def add_parsers(sub: argparse._SubParsersAction) -> None:
    samp = sub.add_parser("sample", help="caption one image: confidence unmasking (MDC), ancestral D3PM sampling "
                          "(--objective d3pm runs), optionally guided",
                          parents=[flags(run=True, image=True, ema=True, device=True, precision=True,
                                         json="print the caption and its full trajectory as JSON")])
    add_sampler_flags(samp)
    samp.add_argument("--auto-range", default="3-20", help="N' tried by --length auto: LO-HI or a list 5,10,15")
    add_guidance_args(samp)
    trajectory.add_trajectory_args(samp)  # --prompt, --remask-*, --attention, --gif (mdc_workbench/cli/trajectory.py)

    score = sub.add_parser("score", help="likelihood score of captions for one image (mc, heuristic or ar)",
                           parents=[flags(run="run or checkpoint folder (MDC-family or ARC)", image=True,
                                          seed="seed of the Monte Carlo masks (mc)",
                                          batch_size={"default": 256,
                                                      "help": "decoder rows per forward pass (memory only)"},
                                          ema=True, device=True, precision=True,
                                          json="print a JSON list: caption, score, stderr (mc), tokens...")])
    score.add_argument("--caption", action="append", required=True, help="caption text (repeatable)")
    score.add_argument("--method", required=True, choices=SCORE_METHODS,
                       help="heuristic / mc: MDC; ar: ARC chain rule, or left-to-right order for MDC")
    score.add_argument("--samples", type=int, default=1024, help="Monte Carlo samples per caption (mc)")
    score.add_argument("--prompt", help="conditional scores: a caption with [MASK] or _ slots; each --caption is "
                       "then a filling of the slots (e.g. --prompt \"a _ square\" --caption red --caption blue) and "
                       "only the slots are scored, given the fixed words")


def add_sampler_flags(p: argparse.ArgumentParser) -> None:
    """One flag per sampler option (:func:`mdc_core.config.sampler_options`: its type, range and help), not given
    = the run's ``sampler.*`` value; ``--length`` also takes ``auto``. The checks of
    :mod:`mdc_workbench.cli.checks` read the same ranges."""
    for opt in sampler_options():
        bounds = "" if opt.range is None else f"{opt.range[0]:g}-{opt.range[1]:g}; "
        text = f"{opt.help} ({bounds}default: the run's)"
        if opt.name == "length":
            text += ", or 'auto': sample every N' of --auto-range and keep the best heuristic score per token"
        p.add_argument(opt.flag, type=_length_arg if opt.name == "length" else opt.type, help=text)


def _length_arg(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of tokens or 'auto', got {text!r}") from None


def sampler_overrides(args: argparse.Namespace) -> list[str]:
    """``sampler.*`` overrides of the sampler flags given (``--length auto`` overrides nothing)."""
    pairs = {opt.name: getattr(args, opt.name) for opt in sampler_options()}
    if pairs["length"] == "auto":
        pairs["length"] = None
    return [f"sampler.{k}={json.dumps(v)}" for k, v in pairs.items() if v is not None]


def add_guidance_args(p: argparse.ArgumentParser) -> None:
    """``mdc sample`` options for guided sampling and for D3PM runs."""
    p.add_argument("--guidance", choices=GUIDANCE_MODES, default="none",
                   help="guided sampling (run trained with --set objective.guidance=cfg|mcs): cfg = classifier-free "
                   "(1-w) log p(x|null) + w log p(x|y); mcs = masked condition w log p(x|y_[M],y_o) + "
                   "(1-w) log p(x|y); mcs_cfg = cfg's form with the masked condition as reference")
    p.add_argument("--guidance-scale", type=float, metavar="W",
                   help="guidance scale w (needed with --guidance; cfg w = 1 is the plain conditional model)")
    p.add_argument("--guidance-p-mask", type=float, metavar="P",
                   help="mcs/mcs_cfg: probability that a reference image token is masked (default: the run's "
                   "objective.p_mask)")
    p.add_argument("--diffusion-stride", type=int,
                   help="D3PM runs: jump t -> t - stride (T/stride network calls; default 1 = all T steps)")


def cmd_sample(args: argparse.Namespace) -> None:
    from mdc_core.factory import load_model
    from mdc_core.transforms import load_image
    model, cfg = load_model(args.run, device=args.device, ema=args.ema)
    spec = objective_spec(cfg.objective.name)
    if spec.decoder == "none":
        raise ValueError(f"{args.run} is a {spec.display(cfg.objective.name)} run (objective {cfg.objective.name}): it "
                         "has no caption decoder to sample from; "
                         "caption with an MDC or ARC run (CLIP runs serve mdc probe and mdc eval compositionality)")
    guidance = guidance_config(args, cfg)
    image = load_image(args.image, cfg.model.image_size)[None].to(args.device)
    trajectory.check_args(args, cfg.objective.name)
    if spec.decoder == "ancestral":  # MC-Diffusion: T-step ancestral sampling
        return cmd_sample_d3pm(args, model, cfg, image, guidance)
    check_mdc_sampler_args(args, cfg)
    cfg = apply_overrides(cfg, sampler_overrides(args))
    if args.length == "auto":
        if guidance.mode != "none":
            raise ValueError("--length auto ranks lengths by the unguided heuristic score; drop --guidance or "
                             "give --length N")
        return cmd_sample_auto(args, model, cfg, image)
    record = trajectory.sample_one(args, model, cfg, image, args.image, guidance)
    latency = record["latency_s"]
    if args.json:
        print(json.dumps(record))
        return
    print(record["caption"])
    order = " ".join(f"{s['token']}@{s['position']}({s['confidence']:.2f})" for s in record["steps"])
    print(f"reveal order: {order}")
    shown = "" if guidance.mode == "none" else f", guidance {guidance.mode} w={guidance.scale:g}"
    print(f"{record['settings']['steps']} steps in {latency * 1000:.0f} ms{shown}")
    trajectory.report(args, record)


def cmd_sample_auto(args: argparse.Namespace, model, cfg, image) -> None:
    """``mdc sample --length auto``: the best candidate of each N' in ``--auto-range`` by heuristic score per token."""
    import torch

    from mdc_core.scoring import sample_auto_length
    from mdc_core.tokenizer import CaptionTokenizer
    from mdc_workbench.eval.captioning import parse_range
    from mdc_workbench.viz.animation import trajectory
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


def guidance_config(args: argparse.Namespace, cfg: Any) -> Any:
    """The :class:`GuidanceConfig` of ``mdc sample``'s options for a run with config `cfg`; ValueError explains
    options that do not fit the run. Notes on stderr where the sampling mode differs from the training mode."""
    from mdc_workbench.masked_conditional.guidance import GuidanceConfig
    mode, trained = args.guidance, cfg.objective.guidance
    if mode == "none":
        for value, flag in ((args.guidance_scale, "--guidance-scale"), (args.guidance_p_mask, "--guidance-p-mask")):
            if value is not None:
                raise ValueError(f"{flag} needs --guidance cfg|mcs|mcs_cfg")
        return GuidanceConfig()
    if trained == "none":
        raise ValueError(
            f"--guidance {mode} needs a run trained with condition dropping, but {args.run} was trained with "
            f"objective.guidance=none: the model never learned p(x | null) or p(x | masked image tokens), so the "
            f"guided combination would extrapolate from untrained predictions. Train with --set objective.guidance="
            f"{'cfg' if mode == 'cfg' else 'mcs'} (and objective.p_cond / objective.p_mask), or sample without "
            "--guidance.")
    if args.guidance_scale is None:
        raise ValueError(f"--guidance {mode} needs --guidance-scale W (the paper sweeps w = 1..5; with cfg, w = 1 is "
                         "the plain conditional model)")
    if mode == "cfg" and args.guidance_p_mask is not None:
        raise ValueError("--guidance-p-mask applies to mcs/mcs_cfg; cfg's reference masks every image token")
    p_mask = cfg.objective.p_mask if args.guidance_p_mask is None else args.guidance_p_mask
    seed = cfg.sampler.seed if args.seed is None else args.seed
    guidance = GuidanceConfig(mode, args.guidance_scale, p_mask, seed).validate()
    if (mode == "cfg") != (trained == "cfg"):
        reference = "every image token masked" if mode == "cfg" else "image tokens masked with p_mask"
        print(f"mdc sample: note: {args.run} was trained with objective.guidance={trained}; the --guidance {mode} "
              f"reference ({reference}) is a condition it saw rarely or never in training", file=sys.stderr)
    return guidance


def check_mdc_sampler_args(args: argparse.Namespace, cfg: Any) -> None:
    """ValueError for D3PM-only options given for a run that MDC's confidence sampler decodes."""
    if args.diffusion_stride is not None:
        raise ValueError(f"--diffusion-stride is for runs trained with --objective d3pm; {args.run} is an "
                         f"{cfg.objective.name} run, decoded by confidence unmasking")


def cmd_sample_d3pm(args: argparse.Namespace, model: Any, cfg: Any, image: Any, guidance: Any) -> None:
    """``mdc sample`` for a D3PM (MC-Diffusion) run: T-step ancestral sampling (T = the run's objective.d3pm_steps)."""
    import torch

    from mdc_core.tokenizer import CaptionTokenizer
    from mdc_workbench.masked_conditional.d3pm import reverse_times
    from mdc_workbench.masked_conditional.diffusion import d3pm_sample
    from mdc_workbench.masked_conditional.guidance import GuidedCaptioner
    given = [opt.flag for opt in sampler_options()
             if opt.name not in D3PM_SAMPLER_OPTIONS and getattr(args, opt.name) is not None]
    if given or args.length == "auto":
        raise ValueError(f"{', '.join(given) or '--length auto'}: options of MDC's confidence sampler; {args.run} "
                         "is a D3PM run (ancestral sampling: --length N, --temperature, --seed, --diffusion-stride)")
    if args.temperature is not None and args.temperature <= 0:
        raise ValueError("D3PM sampling draws from the model's distribution: --temperature must be > 0 (default 1)")
    length = cfg.sampler.length if args.length is None else args.length
    steps, stride = cfg.objective.d3pm_steps, args.diffusion_stride or 1
    temperature = 1.0 if args.temperature is None else args.temperature
    seed = cfg.sampler.seed if args.seed is None else args.seed
    start = time.perf_counter()
    with torch.no_grad():
        out = d3pm_sample(GuidedCaptioner(model, guidance), model.encode_image(image), length, steps=steps,
                          stride=stride, temperature=temperature, seed=seed)
    latency = time.perf_counter() - start
    tok = CaptionTokenizer(cfg.model.context_length)
    ids = out.tokens[0].tolist()
    times = reverse_times(steps, stride)
    record = {
        "caption": tok.decode(ids), "tokens": [tok.token_string(i) for i in ids], "token_ids": ids,
        "sampler": "d3pm",
        # one entry per reverse step t -> s: the fraction of caption tokens still [MASK] after it
        "steps": [{"step": i, "t": t, "s": s, "masked_frac": m}
                  for i, ((t, s), m) in enumerate(zip(times, out.masked_per_step, strict=True))],
        "settings": {**out.settings, "calls": len(times), "guidance": dataclasses.asdict(guidance)},
        "latency_s": latency,
    }
    if args.json:
        print(json.dumps(record))
        return
    print(record["caption"])
    quarter = [record["steps"][min(len(times) - 1, round(q * (len(times) - 1)))] for q in (0, 0.25, 0.5, 0.75, 1)]
    print("[MASK] left after t -> s: " + "  ".join(f"{r['t']}->{r['s']}: {r['masked_frac']:.2f}" for r in quarter))
    shown = "" if guidance.mode == "none" else f", guidance {guidance.mode} w={guidance.scale:g}"
    print(f"D3PM ancestral sampling, T = {steps}, stride {stride}: {len(times)} steps in {latency * 1000:.0f} ms"
          f"{shown}")


def cmd_score(args: argparse.Namespace) -> None:
    import torch

    from mdc_core.factory import load_model
    from mdc_core.scoring import model_kind
    from mdc_core.transforms import load_image
    from mdc_workbench.cli.scores import score_captions
    model, cfg = load_model(args.run, device=args.device, ema=args.ema)
    model_kind(model)  # a CLIP run fails here, before any work
    image = load_image(args.image, cfg.model.image_size)[None].to(args.device)
    start = time.perf_counter()
    with torch.no_grad():
        image_tokens = model.encode_image(image)  # encoded once for all captions
    if args.prompt is not None:  # conditional: only the slots are scored
        from mdc_workbench.cli.scores import score_fills
        rows = score_fills(model, image_tokens, args.prompt, args.caption, args.method, samples=args.samples,
                           seed=args.seed, batch_size=args.batch_size)
        rows = [{**r, "tokens": r["slot_tokens"]} for r in rows]
    else:
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


HANDLERS = {"sample": cmd_sample, "score": cmd_score}
