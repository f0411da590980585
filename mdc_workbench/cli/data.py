"""``mdc data synth | shards | bench``: write the embedded data set, pack your own pairs as shards, time loading."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from mdc_workbench.cli.common import flags


def add_parsers(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser("data", help="data set tools").add_subparsers(dest="data_verb", required=True)
    synth = data.add_parser("synth", help="write the embedded synthetic data set as WebDataset shards",
                            parents=[flags(out=True)])
    synth.add_argument("--n", type=int, required=True, help="number of training pairs")
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--image-size", type=int, default=64, help="pixels (square)")
    # short by default: a long caption outgrows the presets' context of 64 tokens (mixed: 15% of them cut)
    synth.add_argument("--captions", choices=("short", "long", "mixed", "clauses"), default="short",
                       help="caption style (mixed: short or long at random; clauses: two clauses, the second "
                       "restating the first or not); long captions may exceed a preset's model.context_length")
    synth.add_argument("--shard-size", type=int, default=1000, help="samples per tar shard")
    synth.add_argument("--difficulty", choices=("paper", "easy"), default="paper",
                       help="scene settings: paper = 7 shapes, 1-4 objects (the default); easy = 5 distinct "
                       "shapes, 1-3 objects, larger small objects (the fast CPU recipe; docs/fast_recipe.md)")
    synth.add_argument("--overwrite", action="store_true", help="replace the data set --out already holds")
    shards = data.add_parser("shards", help="write your image-caption folder or CSV/TSV/COCO json as tar shards",
                             parents=[flags(out="output folder for 00000.tar, 00001.tar, ...", quiet=True)])
    shards.add_argument("--from", dest="source", required=True,
                        help="caption table (.csv/.tsv/.json) or a folder of images with same-name .txt captions")
    shards.add_argument("--images", help="image folder of a caption json/CSV (default: beside it, or the COCO "
                        "layout annotations/ + val2017/)")
    shards.add_argument("--shard-size", type=int, default=10_000, help="samples per tar shard")
    shards.add_argument("--no-check", action="store_true", help="do not decode images (faster; broken ones stay)")
    dbench = data.add_parser("bench", help="data throughput: images/s decoded + augmented, per worker",
                             parents=[flags(data="data path (shard folder, brace pattern, CSV/TSV, COCO)",
                                            batch_size={"default": 64}, json="print the results as JSON")])
    dbench.add_argument("--images", help="image folder of a caption json/CSV (default: beside it, or the COCO layout)")
    dbench.add_argument("--image-size", type=int, nargs="+", default=[64, 224], help="output pixels (square)")
    dbench.add_argument("--workers", type=int, default=0, help="DataLoader workers (0 = this process)")
    dbench.add_argument("--batches", type=int, default=20, help="batches timed (after 2 warm-up batches)")
    dbench.add_argument("--augment", choices=("none", "rrc"), default="rrc", help="random resized crop or not")


def cmd_data(args: argparse.Namespace) -> None:
    {"synth": cmd_data_synth, "shards": cmd_data_shards, "bench": cmd_data_bench}[args.data_verb](args)


def cmd_data_shards(args: argparse.Namespace) -> None:
    from mdc_workbench.data.shards import write_shards
    stats = write_shards(args.source, args.out, shard_size=args.shard_size, check_images=not args.no_check,
                         progress=not args.quiet, images=args.images)
    print(f"wrote {stats['written']} pairs in {stats['shards']} shards; skipped {stats['skipped'] or 'none'}")
    print(f"train with: --data '{stats['pattern']}'")


def cmd_data_bench(args: argparse.Namespace) -> None:
    from mdc_workbench.bench.data import bench_data
    rows = bench_data(args.data, image_sizes=tuple(args.image_size), workers=args.workers,
                      batch_size=args.batch_size, batches=args.batches, augment=args.augment, images=args.images)
    if args.json:
        print(json.dumps(rows))
        return
    for r in rows:
        print(f"{r['image_size']:4d} px  augment={r['augment']:4s}  {r['workers']} worker(s): "
              f"{r['images_per_s']:8.1f} images/s  = {r['images_per_s_per_worker']:8.1f} per worker "
              f"({r['images']} images in {r['seconds']:.2f} s)")


def cmd_data_synth(args: argparse.Namespace) -> None:
    from mdc_workbench.data import write_synthetic_dataset
    out = Path(args.out)
    held = [p for p in (out / "manifest.json", *out.glob("*/*.tar")) if p.is_file()]
    if held and not args.overwrite:
        what = "a data set (manifest.json)" if held[0].name == "manifest.json" else f"shards ({held[0]})"
        raise FileExistsError(f"{out} already holds {what}; pass --overwrite to replace it or choose another --out")
    created = not out.exists()
    try:  # a data set a training run reads (it holds a shared lock on its folder) is never replaced under it
        with _exclusive([out, *sorted(p for p in out.glob("*") if p.is_dir())], "--overwrite"):
            manifest = write_synthetic_dataset(out, args.n, seed=args.seed, image_size=args.image_size,
                                               captions=args.captions, shard_size=args.shard_size,
                                               difficulty=args.difficulty)
    except BaseException:
        if created:  # a failed or interrupted command leaves no half-written folder behind
            shutil.rmtree(out, ignore_errors=True)
        raise
    counts = manifest.get("counts", {})
    print(f"wrote {args.out}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


HANDLERS = {"data": cmd_data}


@contextlib.contextmanager
def _exclusive(folders: list[Path], what: str) -> Iterator[None]:
    """An exclusive ``flock`` on each existing folder of `folders` for the block (`what` replaces what they hold);
    :class:`~mdc_core.runlock.RunFolderBusy` when a reader holds one (:meth:`~mdc_core.runlock.RunLock.share`: a
    training run reads its data there)."""
    from mdc_core.runlock import RunFolderBusy
    fds: list[int] = []
    try:
        for folder in folders:
            if not folder.is_dir():
                continue
            fds.append(os.open(folder, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)))
            try:
                fcntl.flock(fds[-1], fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RunFolderBusy(f"{folder} is being read by a training run (it holds a lock on the folder): "
                                    f"{what} would change the data under it; write into another folder, or wait "
                                    "for the run to finish (nothing was written)") from None
        yield
    finally:
        for fd in fds:
            os.close(fd)

