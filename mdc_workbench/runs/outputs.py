"""Where a plan may write (torch-free): the checks :mod:`mdc_workbench.runs.runner` makes before it writes or clears
anything under ``output_root``.

A run folder must be the folder of its run id directly inside the plan's (no link, no ``..``), and is cleared only
when the runner made it (:data:`RUN_MARKS`); a plan folder must be new, empty or the runner's own (:data:`PLAN_MARKS`,
or a run folder with a run mark), with no symbolic link among the entries the runner writes. Anything else is a
one-line ValueError and nothing is written, so an ``output_root`` naming somebody else's folder loses nothing.
"""

from __future__ import annotations

from pathlib import Path

from mdc_core.runlock import LOCK_NAME, refuse_links
from mdc_workbench.runs.plans import Plan, folder_name
from mdc_workbench.runs.powered import POWER_FILE

DONE, FAILED = "DONE", "FAILED"  # a run folder's markers: it finished (JSON: duration), or why it failed
SHARES_DIR = ".threads"  # under the plan folder: each running run's torch-thread share (runner.thread_share)


def check_run_folder(run_dir: Path, plan_dir: Path, *, clearing: bool = False) -> Path:
    """`run_dir` when it is a folder directly inside `plan_dir` (after resolving links and ``..``) with a valid
    name (:func:`~mdc_workbench.runs.plans.folder_name`) and, when `clearing` (under its lock), one the runner made
    (:func:`_made_by_runner`); ValueError else. The runner clears a run folder before executing it, so this is
    checked right before anything is removed."""
    folder_name(run_dir.name, "run id")
    inside = plan_dir.resolve() / run_dir.name
    if run_dir.resolve() != inside or run_dir.is_symlink():
        raise ValueError(f"run folder {run_dir} is not the folder {inside} of its plan (a link or '..' leads "
                         "elsewhere): refusing to clear it")
    if clearing and run_dir.is_dir() and not _made_by_runner(run_dir):
        raise ValueError(f"run folder {run_dir} holds files `mdc runs` did not write ({_listing(run_dir)}) and none "
                         f"of its marks ({', '.join(RUN_MARKS)}): refusing to clear it; move them, or give the plan "
                         "another output_root or name (nothing was written)")
    return run_dir


RUN_MARKS = ("parameters.json", DONE, FAILED)  # the runner writes parameters.json first into a run folder it cleared
PLAN_MARKS = ("declared.json", "summary.json", POWER_FILE)  # and these into its plan folder


def _made_by_runner(run_dir: Path) -> bool:
    """`run_dir` holds a mark of the runner, or nothing but its lock and an empty ``figures/`` (a run stopped between
    clearing it and writing parameters.json)."""
    if any((run_dir / mark).is_file() for mark in RUN_MARKS):
        return True
    rest = [p for p in run_dir.iterdir() if p.name != LOCK_NAME]
    return all(p.name == "figures" and p.is_dir() and not p.is_symlink() and not any(p.iterdir()) for p in rest)


def _listing(folder: Path) -> str:
    names = sorted(p.name for p in folder.iterdir())
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def check_outputs(plan: Plan, *, clearing: bool = False) -> None:
    """Each run folder of `plan` (:func:`check_run_folder`: a RunSpec built by hand has not been through
    load_plan's checks), then its plan folder (:func:`check_plan_folder`)."""
    for spec in plan.runs:
        check_run_folder(plan.out_dir / spec.run_id, plan.out_dir)
    check_plan_folder(plan.out_dir)
    for spec in plan.runs if clearing else ():
        check_run_folder(plan.out_dir / spec.run_id, plan.out_dir, clearing=True)


def check_plan_folder(out: Path) -> Path:
    """`out` (``output_root/name``) when the runner may write there: absent, empty, or a plan folder it wrote (a
    :data:`PLAN_MARKS` file, or a run folder with a :data:`RUN_MARKS` file), and no symbolic link among the entries
    it writes (:func:`~mdc_core.runlock.refuse_links`; the notebooks' ``_`` caches check their own); ValueError else,
    so that an ``output_root`` naming somebody else's folder writes and clears nothing there."""
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"plan output folder {out} is a file (output_root/name); nothing was written")
    if not out.is_dir():
        return out
    refuse_links(out, depth=1, skip=("_",))
    rest = [p for p in out.iterdir() if p.name not in (LOCK_NAME, SHARES_DIR)]
    if not rest or any((out / mark).is_file() for mark in PLAN_MARKS) or \
            any(p.is_dir() and any((p / mark).is_file() for mark in RUN_MARKS) for p in rest):
        return out
    raise ValueError(f"plan output folder {out} (output_root/name) holds files `mdc runs` did not write "
                     f"({_listing(out)}): a plan writes only into a new folder or its own; give it another "
                     "output_root or name (nothing was written)")
