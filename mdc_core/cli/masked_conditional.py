"""MC-Diffusion on the command line: guided ``mdc sample`` (MDC and D3PM runs) and ``mdc vqvae train | show``.

Thin wrappers around :mod:`mdc_core.masked_conditional.guidance`, :mod:`mdc_core.masked_conditional.diffusion`
and :mod:`mdc_core.masked_conditional.vqvae`;
:mod:`mdc_core.cli` registers them. ``mdc sample`` on a run trained with ``objective.name = "d3pm"`` runs the T-step
ancestral sampler; on any other masked run MDC's confidence sampler. ``--guidance`` wraps either model in a
:class:`~mdc_core.masked_conditional.guidance.GuidedCaptioner`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from mdc_core.config import GUIDANCE_MODES

# ``mdc sample`` options of MDC's confidence sampler that the D3PM sampler has no use for: (dest, flag)
MDC_ONLY_ARGS = (("tokens_per_step", "--tokens-per-step"), ("threshold", "--threshold"), ("top_k", "--top-k"))
# VQVAEConfig field -> (type, help) of its `mdc vqvae train` option; unset = VQVAEConfig's default. Literal, not
# derived from VQVAEConfig, so that importing mdc_core.cli imports no torch (tests/test_mc_diffusion_cli.py checks
# that the fields and defaults match).
VQVAE_OPTIONS = {
    "image_size": (int, "input pixels (square; default 64); the captioner's model.image_size must equal it"),
    "channels": (int, "hidden conv channels (default 64)"),
    "downsample": (int, "stride-2 stages: (image_size / 2**downsample)^2 image tokens (default 3)"),
    "codebook_size": (int, "codes K (default 256)"),
    "code_dim": (int, "codebook vector size (default 32)"),
    "beta": (float, "commitment loss weight (default 0.25)"),
    "token_width": (int, "width of the code embeddings the captioner cross-attends to (default 128)"),
}


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


def guidance_config(args: argparse.Namespace, cfg: Any) -> Any:
    """The :class:`GuidanceConfig` of ``mdc sample``'s options for a run with config `cfg`; ValueError explains
    options that do not fit the run. Notes on stderr where the sampling mode differs from the training mode."""
    from mdc_core.masked_conditional.guidance import GuidanceConfig
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

    from mdc_core.masked_conditional.d3pm import reverse_times
    from mdc_core.masked_conditional.diffusion import d3pm_sample
    from mdc_core.masked_conditional.guidance import GuidedCaptioner
    from mdc_core.tokenizer import CaptionTokenizer
    given = [flag for dest, flag in MDC_ONLY_ARGS if getattr(args, dest) is not None]
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


# ---------------------------------------------------------------------------------------------------- mdc vqvae


def add_vqvae_parser(sub: argparse._SubParsersAction) -> None:
    verbs = sub.add_parser("vqvae", help="discrete image tokens for MC-Diffusion: train a VQ-VAE, show the train "
                           "flags of a VQ model").add_subparsers(dest="vqvae_verb", required=True)
    train = verbs.add_parser("train", help="train a VQ-VAE on a data set's training images (one .safetensors file)")
    train.add_argument("--data", required=True, help="data path (shard folder, brace pattern, CSV/TSV or COCO JSON)")
    train.add_argument("--out", required=True, help="weights file to write (.safetensors; not overwritten)")
    train.add_argument("--steps", type=int, default=1000, help="Adam steps")
    for name, (kind, text) in VQVAE_OPTIONS.items():
        train.add_argument("--" + name.replace("_", "-"), type=kind, help=text)
    train.add_argument("--batch-size", type=int, default=64)
    train.add_argument("--lr", type=float, default=2e-3)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--device", default="cpu")
    train.add_argument("--json", action="store_true", help="print the training metrics and flags as JSON")
    show = verbs.add_parser("show", help="the `mdc train --set` flags that condition a captioner on a VQ model")
    show.add_argument("--path", required=True, help="a VQ-VAE file (mdc vqvae train) or a local diffusers VQModel "
                      "folder (model.encoder=vqgan)")
    show.add_argument("--token-width", type=int, help="width of the code embeddings (default: the file's / 128)")


def encoder_flags(path: str | Path, token_width: int | None = None) -> list[str]:
    """``mdc train`` arguments that set a captioner's encoder to the VQ model at `path`: a file written by
    :func:`mdc_core.masked_conditional.vqvae.save_vqvae` (``model.encoder=vqvae``) or a diffusers VQModel folder
    (``vqgan``)."""
    path = Path(path)
    if path.is_dir():
        from mdc_core.masked_conditional.vqgan import vqgan_encoder_kwargs
        name, kwargs, size = "vqgan", vqgan_encoder_kwargs(path, token_width), None
    else:
        from mdc_core.masked_conditional.vqvae import vqvae_encoder_kwargs
        kwargs = vqvae_encoder_kwargs(path, token_width)
        name, size = "vqvae", kwargs["image_size"]
    flags = ["--set", f"model.encoder={name}", "--set", f"model.pretrained_path={json.dumps(str(path))}",
             "--set", f"model.encoder_kwargs={json.dumps(kwargs, separators=(',', ':'))}"]
    return flags + (["--set", f"model.image_size={size}"] if size else [])


def cmd_vqvae(args: argparse.Namespace) -> None:
    {"train": cmd_vqvae_train, "show": cmd_vqvae_show}[args.vqvae_verb](args)


def cmd_vqvae_train(args: argparse.Namespace) -> None:
    from mdc_core.config import DataConfig
    from mdc_core.masked_conditional.vqvae import VQVAEConfig, save_vqvae, train_vqvae
    out = Path(args.out)
    if out.exists():
        raise FileExistsError(f"{out} exists; choose another --out or delete it")
    if args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    vq_cfg = VQVAEConfig(**{k: getattr(args, k) for k in VQVAE_OPTIONS if getattr(args, k) is not None}).validate()
    start = time.perf_counter()
    model, history = train_vqvae(vq_cfg, DataConfig(path=args.data), steps=args.steps, batch_size=args.batch_size,
                                 lr=args.lr, seed=args.seed, device=args.device)
    save_vqvae(model.cpu(), out)
    last = history[-1]
    flags = encoder_flags(out)
    command = f"mdc train --data {shlex.quote(args.data)} --objective d3pm --out RUN {shlex.join(flags)}"
    if args.json:
        print(json.dumps({"path": str(out), "config": dataclasses.asdict(vq_cfg), "history": history,
                          "train_flags": flags, "seconds": time.perf_counter() - start}))
        return
    print(f"VQ-VAE: {vq_cfg.grid ** 2} tokens per {vq_cfg.image_size} px image; after {last['step']} steps "
          f"recon MSE {last['recon_mse']:.4f}, codes used {last['codes_used']:.0f} of {vq_cfg.codebook_size} "
          f"(perplexity {last['perplexity']:.1f}) in {time.perf_counter() - start:.0f} s; wrote {out}")
    print(f"train a captioner on its codes (add --set objective.guidance=cfg|mcs for guided sampling):\n  {command}")


def cmd_vqvae_show(args: argparse.Namespace) -> None:
    path = Path(args.path)
    if not path.exists():
        raise FileNotFoundError(f"VQ model not found: {path}")
    print(shlex.join(encoder_flags(path, args.token_width)))
