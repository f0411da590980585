"""``mdc vqvae train | show``: discrete image tokens for MC-Diffusion (a VQ-VAE, or a local diffusers VQ model).

Thin wrappers around :mod:`mdc_workbench.masked_conditional.vqvae` and :mod:`mdc_workbench.masked_conditional.vqgan`.
Guided and D3PM sampling are part of ``mdc sample`` (:mod:`mdc_workbench.cli.sample`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import time
from pathlib import Path

from mdc_workbench.cli.common import flags

# VQVAEConfig field -> (type, help) of its `mdc vqvae train` option; unset = VQVAEConfig's default. Literal, not derived
# from VQVAEConfig, so that importing mdc_workbench.cli imports no torch
# (tests/workbench/test_masked_conditional_cli.py checks
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










# ---------------------------------------------------------------------------------------------------- mdc vqvae


def add_parsers(sub: argparse._SubParsersAction) -> None:
    verbs = sub.add_parser("vqvae", help="discrete image tokens for MC-Diffusion: train a VQ-VAE, show the train "
                           "flags of a VQ model").add_subparsers(dest="vqvae_verb", required=True)
    train = verbs.add_parser("train", help="train a VQ-VAE on a data set's training images (one .safetensors file)",
                             parents=[flags(data=True, out="weights file to write (.safetensors; not overwritten)",
                                            batch_size={"default": 64}, seed=True, device=True,
                                            json="print the training metrics and flags as JSON")])
    train.add_argument("--steps", type=int, default=1000, help="Adam steps")
    for name, (kind, text) in VQVAE_OPTIONS.items():
        train.add_argument("--" + name.replace("_", "-"), type=kind, help=text)
    train.add_argument("--lr", type=float, default=2e-3)
    show = verbs.add_parser("show", help="the `mdc train --set` flags that condition a captioner on a VQ model")
    show.add_argument("--path", required=True, help="a VQ-VAE file (mdc vqvae train) or a local diffusers VQModel "
                      "folder (model.encoder=vqgan)")
    show.add_argument("--token-width", type=int, help="width of the code embeddings (default: the file's / 128)")


def encoder_flags(path: str | Path, token_width: int | None = None) -> list[str]:
    """``mdc train`` arguments that set a captioner's encoder to the VQ model at `path`: a file written by
    :func:`mdc_workbench.masked_conditional.vqvae.save_vqvae` (``model.encoder=vqvae``) or a diffusers VQModel folder
    (``vqgan``)."""
    path = Path(path)
    if path.is_dir():
        from mdc_workbench.masked_conditional.vqgan import vqgan_encoder_kwargs
        name, kwargs, size = "vqgan", vqgan_encoder_kwargs(path, token_width), None
    else:
        from mdc_workbench.masked_conditional.vqvae import vqvae_encoder_kwargs
        kwargs = vqvae_encoder_kwargs(path, token_width)
        name, size = "vqvae", kwargs["image_size"]
    flags = ["--set", f"model.encoder={name}", "--set", f"model.pretrained_path={json.dumps(str(path))}",
             "--set", f"model.encoder_kwargs={json.dumps(kwargs, separators=(',', ':'))}"]
    return flags + (["--set", f"model.image_size={size}"] if size else [])


def cmd_vqvae(args: argparse.Namespace) -> None:
    {"train": cmd_vqvae_train, "show": cmd_vqvae_show}[args.vqvae_verb](args)


def cmd_vqvae_train(args: argparse.Namespace) -> None:
    from mdc_core.config import DataConfig
    from mdc_workbench.masked_conditional.vqvae import VQVAEConfig, save_vqvae, train_vqvae
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


HANDLERS = {"vqvae": cmd_vqvae}
