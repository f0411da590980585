"""``mdc train | demo | presets``: train a captioner, the one-command demo, the registered presets."""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

from mdc_core.config import RunConfig, apply_overrides, list_presets, load_preset
from mdc_core.registry import objective_names, objective_spec
from mdc_workbench.cli.cluster import check_local, cluster_flags, resource_flags
from mdc_workbench.cli.common import check_preset, flags


def add_parsers(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="train a captioner",
                           parents=[flags(data={"required": False,
                                                "help": "data path (shard folder, brace pattern, CSV/TSV or COCO "
                                                "JSON)"}, out="run folder", set=True, quiet=True),
                                    cluster_flags("GPUs per node, one rank each (default 0: CPU ranks, gloo)")])
    train.add_argument("--preset", help=f"one of: {', '.join(list_presets())} (default tiny; with --resume: the "
                       "run's own config.json, to which the other flags apply)")
    train.add_argument("--objective", choices=objective_names(), metavar="OBJECTIVE",
                       help="the training objective (default: the preset's, mdc): " + "; ".join(
                           f"{name} = {_objective_summary(name)}" for name in objective_names()))
    train.add_argument("--steps", type=int, help="optimizer steps")
    train.add_argument("--images", help="image folder of a caption json/CSV (default: beside it, or the COCO "
                       "layout annotations/ + train2017/)")
    train.add_argument("--resume", action="store_true", help="continue the run in --out from its last intact "
                       "checkpoint, with its saved config (no other flag needed; --steps N extends it, --data "
                       "may name its data's new location)")
    train.add_argument("--members", type=int, metavar="K",
                       help="train a seed stack: K seeds (train.seed, train.seed + 1, ...) in one process, one step "
                       "for all; each member is written as its solo run, --out/seed_<seed>/ (mdc_workbench.seed_stack."
                       "train); with --resume, --out is the stack's folder")
    train.add_argument("--tensorboard", action="store_true", help="also write TensorBoard events into the run "
                       "folder: the logged scalars, validation loss, sample captions, the unmasking image, hparams "
                       "(train.tensorboard=true; needs the [tensorboard] extra)")
    train.add_argument("--nodes", type=int, metavar="N", help="--executor slurm: nodes of the job (default 1)")
    train.add_argument("--tasks-per-node", type=int, metavar="T", help="--executor slurm: ranks per node (default: "
                       "--gpus-per-node, at least 1)")

    demo = sub.add_parser("demo", help="the quick one-model demo (make quick-demo): synthesize data, train the tiny "
                          "MDC model, caption test images; the full demo is make demo (mdc runs plans/cpu_demo.yaml)",
                          parents=[flags(out={"required": False, "default": "outputs/demo",
                                              "help": "folder for data, run and report"},
                                         set=True, limit={"default": 256, "help": "test images to caption"},
                                         quiet=True)])
    demo.add_argument("--n", type=int, default=20000, help="training pairs to synthesize")
    demo.add_argument("--steps", type=int, help="training steps (default: the tiny preset's)")

    sub.add_parser("presets", help="list the registered presets, one line each: what sets each apart")


def _objective_summary(name: str) -> str:
    """What objective `name` is, in a few words: its model-card sentence up to the colon (else its label)."""
    spec = objective_spec(name)
    return (spec.description or spec.display(name)).split(":")[0]


def _train_config(args: argparse.Namespace):
    """The preset with the flags applied, or with ``--resume`` and no ``--preset`` the run's own config."""
    overrides = list(args.set)
    if args.data:
        overrides += [f"data.path={json.dumps(args.data)}", 'data.path_as_given=""']
    if args.images:
        overrides.append(f"data.images={json.dumps(args.images)}")
    if args.objective:
        overrides.append(f"objective.name={args.objective}")
    if args.steps is not None:
        overrides.append(f"train.steps={args.steps}")
    if args.tensorboard:
        overrides.append("train.tensorboard=true")
    if args.resume and args.preset is None:
        out = Path(args.out)
        if args.members is not None:  # a seed stack: its first member's config (the members' seeds follow it)
            seeds = sorted(int(p.name.removeprefix("seed_")) for p in out.glob("seed_*")
                           if p.name.removeprefix("seed_").isdigit())
            out = out / f"seed_{seeds[0]}" if seeds else out
        return apply_overrides(RunConfig.load(_saved_config(out)), overrides)
    return load_preset(args.preset or "tiny", overrides)


def _saved_config(out: Path) -> Path:
    """The config.json ``--resume`` starts from: the run folder's, or (lost or damaged: cut off, not a config) its
    newest checkpoint's that loads, with a warning; training writes the run folder's back from it."""
    saved = out / "config.json"
    problem = "is missing"
    if saved.is_file():
        try:
            RunConfig.load(saved)
            return saved
        except ValueError as err:  # ConfigError and JSONDecodeError are ValueErrors
            problem = f"is damaged ({str(err).splitlines()[0][:160]})"
    from mdc_core.checkpoint import checkpoint_folders, config_problem
    for ckpt in reversed(checkpoint_folders(out)):
        if not config_problem(ckpt):
            warnings.warn(f"--resume: {saved} {problem}; using the config.json of {ckpt.name} (written with it)",
                          stacklevel=3)
            return ckpt / "config.json"
    if saved.is_file():
        raise ValueError(f"--resume: {saved} {problem}, and no checkpoint of {out} holds a config.json that loads")
    what = "does not exist" if not out.exists() else "holds no run (no config.json, nor a checkpoint with one)"
    raise FileNotFoundError(f"--resume: run folder {out} {what}")


def cmd_train(args: argparse.Namespace) -> None:
    from mdc_core.train import train
    check_local(args, "train", "nodes", "tasks_per_node")
    cfg = _train_config(args)
    if warmup_note(cfg.train.steps, cfg.train.warmup_steps):
        print(warmup_note(cfg.train.steps, cfg.train.warmup_steps))
    if args.members is not None and args.executor == "slurm":
        raise SystemExit("mdc train: --members trains a seed stack in this process; --executor slurm submits one "
                         "run (submit a plan with members: K instead)")
    if args.members is not None:
        _train_stack(cfg, args)
        return
    if args.executor == "slurm":
        _submit_training(cfg, args)
        return
    result = train(cfg, args.out, resume=args.resume, progress=not args.quiet)
    if result.steps == result.start_step:
        print(f"nothing to train: {args.out} has already taken its {result.steps} steps (last logged loss "
              f"{result.final_loss:.4f}; checkpoint {result.checkpoint}); pass --steps N > {result.steps} with "
              "--resume to train it longer")
        return
    resumed = f" (resumed at step {result.start_step})" if result.start_step else ""
    print(f"trained {result.steps} steps{resumed}, final loss {result.final_loss:.4f}; checkpoint {result.checkpoint}")
    if result.skipped:
        print(f"skipped corrupt records: {result.skipped}")
    if result.truncated:
        tcfg = cfg.train
        print(truncation_note(result.truncated, result.steps * tcfg.batch_size * tcfg.grad_accum,
                              cfg.model.context_length))


def _train_stack(cfg: RunConfig, args: argparse.Namespace) -> None:
    """``mdc train --members K``: the seed stack, one line per member."""
    from mdc_workbench.seed_stack.train import train_stack
    results = train_stack(cfg, args.out, members=args.members, resume=args.resume, progress=not args.quiet)
    for r in results:
        if r.steps == r.start_step:
            print(f"{r.run_dir}: nothing to train, it has already taken its {r.steps} steps (last logged loss "
                  f"{r.final_loss:.4f}); pass --steps N > {r.steps} with --resume to train it longer")
        else:
            resumed = f" (resumed at step {r.start_step})" if r.start_step else ""
            print(f"{r.run_dir}: trained {r.steps} steps{resumed}, final loss {r.final_loss:.4f}; checkpoint "
                  f"{r.checkpoint}")


def _submit_training(cfg: RunConfig, args: argparse.Namespace) -> None:
    """``--executor slurm``: one job of nodes x tasks-per-node ranks (mdc_workbench.runs.executor.TrainJob)."""
    from mdc_workbench.runs.executor import JOBS_DIR, Resources, make_executor, submit_training

    resources = Resources().replace(where="mdc train", **resource_flags(args))
    nodes = 1 if args.nodes is None else args.nodes
    tasks = args.tasks_per_node if args.tasks_per_node is not None else max(1, resources.gpus)
    if nodes < 1:
        raise SystemExit(f"mdc train: --nodes must be a positive integer, got {nodes}")
    if tasks < 1 or (resources.gpus and tasks != resources.gpus):
        raise SystemExit(f"mdc train: --tasks-per-node must be positive and equal --gpus-per-node when GPUs are asked "
                         f"for (one rank per GPU), got {tasks} tasks for {resources.gpus} GPUs")
    out = Path(args.out)
    executor = make_executor("slurm", out / JOBS_DIR, resources, name=f"mdc-train-{out.name}", nodes=nodes,
                             tasks_per_node=tasks)
    job = submit_training(cfg.to_dict(), out, executor, resume=args.resume)
    print(f"submitted job {job.job_id}: {nodes} node(s) x {tasks} rank(s), {resources.describe()}; logs: "
          f"{out / JOBS_DIR}/; run folder: {out} (pre-emption checkpoints and requeues it)")


def warmup_note(steps: int, warmup_steps: int) -> str:
    """A warning when the learning rate never reaches its peak (`steps` < `warmup_steps`), else "". The last step's
    multiplier is ``steps / warmup_steps`` (:func:`mdc_core.train.lr_lambda` at step ``steps - 1``)."""
    if steps >= warmup_steps:
        return ""
    return (f"note: --steps {steps} < train.warmup_steps {warmup_steps}: the learning rate never leaves its warm-up "
            f"(it peaks at {steps / warmup_steps:.0%} of train.lr); lower it with --set train.warmup_steps=N")


def truncation_note(truncated: int, seen: int, context: int) -> str:
    """The truncation count with its total and what to do about it (`seen`: captions the whole run trained on, as
    the count is the whole run's, also after a resume)."""
    share = f" of about {seen} ({truncated / seen:.0%})" if seen > 0 else ""
    return (f"captions truncated to the context of {context} tokens: {truncated}{share}; synthesise shorter captions "
            f"(mdc data synth --captions short) or raise --set model.context_length=N")


def cmd_demo(args: argparse.Namespace) -> None:
    from mdc_core.factory import load_model
    from mdc_core.train import train
    from mdc_workbench.data import read_manifest, write_synthetic_dataset
    from mdc_workbench.eval.report import caption_report
    out = Path(args.out)
    data_dir = out / "data"
    try:
        manifest = read_manifest(data_dir)
        print(f"reusing data set {data_dir} ({manifest.get('counts')})")
    except (FileNotFoundError, ValueError):
        write_synthetic_dataset(data_dir, args.n, seed=0, progress=not args.quiet)
    overrides = [f"data.path={json.dumps(str(data_dir))}", *args.set]
    if args.steps is not None:
        overrides.append(f"train.steps={args.steps}")
    cfg = load_preset("tiny", overrides)
    run_dir = out / "run"
    from mdc_core.checkpoint import latest_checkpoint
    done = latest_checkpoint(run_dir)
    if done is not None and json.loads((done / "meta.json").read_text())["step"] >= cfg.train.steps:
        print(f"reusing trained run {run_dir}")
    else:
        if warmup_note(cfg.train.steps, cfg.train.warmup_steps):
            print(warmup_note(cfg.train.steps, cfg.train.warmup_steps))
        start = time.perf_counter()
        result = train(cfg, run_dir, resume=done is not None, progress=not args.quiet)
        print(f"trained in {time.perf_counter() - start:.0f} s")
        if result.truncated:
            t = cfg.train
            print(truncation_note(result.truncated, result.steps * t.batch_size * t.grad_accum,
                                  cfg.model.context_length))
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


def cmd_presets(args: argparse.Namespace) -> None:
    for name in list_presets():
        print(preset_line(name))


def preset_line(name: str) -> str:
    """One line of ``mdc presets``: every setting in which the presets differ (the encoder's own keywords, e.g. its
    patch size and early-convolution stem, the training length and schedule, the data in memory or streamed, the
    caption length sampled), so that no two lines read alike."""
    cfg = load_preset(name)
    m, t = cfg.model, cfg.train
    kwargs = json.dumps(m.encoder_kwargs, separators=(", ", ": ")) if m.encoder_kwargs else "(timm's defaults)"
    return (f"{name:10s} encoder {m.encoder} {kwargs}, {m.image_size} px | decoder {m.text_layers}x{m.text_width} "
            f"({m.text_heads} heads), ctx {m.context_length} | {t.steps} steps of batch {t.batch_size}, lr {t.lr} "
            f"(warm-up {t.warmup_steps}, cosine to {t.min_lr_ratio} x lr), wd {t.weight_decay}, checkpoint every "
            f"{t.ckpt_every} | data {'in memory' if cfg.data.in_memory else 'streamed'} | "
            f"sampler N'={cfg.sampler.length}")


HANDLERS = {"train": cmd_train, "demo": cmd_demo, "presets": cmd_presets}
CHECKS = {"train": check_preset}  # run before the heavy imports (mdc_workbench.cli.main)
