"""``mdc sample`` options for infilling, attention and shareable trajectories.

``mdc_workbench/cli/sample.py`` only declares these flags (:func:`add_trajectory_args`) and calls :func:`sample_one`,
which samples, builds the JSON record (seed and settings included, the image embedded so the app can replay it)
and writes the GIF. ``--prompt "a [MASK] square on the _"`` fixes the other words and takes N' from the prompt.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

from mdc_core.registry import objective_spec


def add_trajectory_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``mdc sample`` handled here."""
    p.add_argument("--prompt", help="infilling: a caption with [MASK] or _ where words should be generated, e.g. "
                   "\"a [MASK] square on the _\"; the other words stay fixed and N' is the prompt's token count")
    p.add_argument("--attention", action="store_true",
                   help="record each revealed token's cross-attention (layers x heads x image tokens) in --json")
    p.add_argument("--gif", metavar="OUT.gif", help="also write the unmasking as an animated GIF (one frame per step, "
                   "the attention of the token just revealed over the image)")


def check_args(args: argparse.Namespace, objective: str) -> None:
    """ValueError for flag combinations that cannot work."""
    given = [f for f, v in (("--prompt", args.prompt), ("--gif", args.gif), ("--attention", args.attention))
             if v not in (None, False)]
    if objective_spec(objective).decoder == "ancestral" and given:
        raise ValueError(f"{', '.join(given)} belong to MDC's confidence sampler; {args.run} is a D3PM run")
    if args.prompt is not None and args.length not in (None,) and args.length != "auto":
        raise ValueError("--prompt sets the caption length (its token count); drop --length")
    if args.prompt is not None and args.length == "auto":
        raise ValueError("--length auto tries several lengths; a --prompt fixes one: drop one of them")
    if args.gif and not args.gif.lower().endswith(".gif"):
        raise ValueError(f"--gif needs a file name ending in .gif, got {args.gif!r}")
    if args.gif and not Path(args.gif).parent.is_dir():  # a typo must not create folders
        raise FileNotFoundError(f"--gif {args.gif}: the folder {Path(args.gif).parent} does not exist")


def sample_one(args: argparse.Namespace, model: Any, cfg: Any, pixels: Any, image_path: str,
               guidance: Any) -> dict[str, Any]:
    """Sample one image (pixels (1, 3, S, S)) with the run's sampler config; returns the trajectory record with
    ``sampler``, ``run``, ``image``, ``prompt``, ``latency_s`` and the embedded image; writes ``--gif``."""
    import torch

    from mdc_core.sampler import sample
    from mdc_core.tokenizer import CaptionTokenizer, parse_prompt
    from mdc_workbench.masked_conditional.guidance import GuidedCaptioner
    from mdc_workbench.viz.animation import trajectory, trajectory_gif, with_image
    tok = CaptionTokenizer(cfg.model.context_length)
    prompt = parse_prompt(args.prompt, tok, model)[0].to(pixels.device) if args.prompt is not None else None
    want_attention = bool(args.attention or args.gif)
    start = time.perf_counter()
    with torch.no_grad():
        out = sample(GuidedCaptioner(model, guidance), model.encode_image(pixels), cfg.sampler, prompt=prompt,
                     attention=want_attention)
    latency = time.perf_counter() - start
    record = trajectory(out, tok)
    record["sampler"] = "mdc"
    record["settings"]["guidance"] = dataclasses.asdict(guidance)
    record.update(run=str(args.run), image=str(image_path), prompt=args.prompt, latency_s=latency)
    record = with_image(record, model_view(image_path, cfg.model.image_size))
    if args.gif:
        trajectory_gif(record, Path(args.gif))
    if not args.attention:  # attention computed only for the GIF stays out of the printed record
        for st in record["steps"]:
            for r in st["revealed"]:
                r.pop("attention", None)
    return record


def model_view(image_path: str | Path, image_size: int) -> Any:
    """The image as the model sees it (shorter side resized, centre crop; not normalised), as a PIL image."""
    import torchvision.transforms as T

    from mdc_core.transforms import open_image
    img = open_image(Path(image_path).read_bytes(), str(image_path))
    return T.CenterCrop(image_size)(T.Resize(image_size, interpolation=T.InterpolationMode.BICUBIC)(img))


def report(args: argparse.Namespace, record: dict[str, Any]) -> None:
    """The human-readable lines about prompts, remasks and the GIF (after the caption and reveal order)."""
    if args.prompt is not None:
        print(f"fixed by the prompt: positions {record['fixed']}")
    remasks = [f"{r['token']}@{r['position']}" for st in record["steps"] for r in st["remasked"]]
    if record["settings"]["remask_steps"]:
        print(f"remasked and predicted again: {' '.join(remasks) if remasks else 'nothing (all above threshold)'}")
    if args.gif:
        print(f"wrote {args.gif} ({len(record['steps'])} frames)")
