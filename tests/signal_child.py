"""``python tests/signal_child.py PAUSE MDC_ARGS...``: run ``mdc MDC_ARGS`` and hold it at a named moment, so that a
test can send it a signal there without racing the start-up (the machine may be loaded; no sleep decides anything).

At the moment it prints ``PAUSED`` on stdout and then waits: ``import-cli`` (``python -m mdc_workbench`` is importing
``mdc_workbench.cli``), ``import-torch`` (torch's import is about to begin),
``after-prepare`` (the run folder is locked, checked and its data fingerprint written; the trainer is not built yet)
and ``final-checkpoint`` (the last checkpoint is about to be written; it waits for a line on stdin, so that the test
can first see the signal's message, then lets it go on). Only the moment is arranged; the signal handling is the
real ``mdc``'s.
"""

from __future__ import annotations

import importlib.abc
import runpy
import sys
import time


def _pause() -> None:
    print("PAUSED", flush=True)
    end = time.monotonic() + 300
    while time.monotonic() < end:  # a signal handler runs between these sleeps
        time.sleep(0.01)
    raise SystemExit("signal_child: no signal came within 300 s")


class _Hold(importlib.abc.MetaPathFinder):
    def __init__(self, module: str):
        self.module = module

    def find_spec(self, name, path=None, target=None):
        if name == self.module:
            _pause()
        return None


def main(moment: str, argv: list[str]) -> int:
    if moment == "import-cli":  # exactly `python -m mdc_workbench ARGS`, held while it imports mdc_workbench.cli
        sys.meta_path.insert(0, _Hold("mdc_workbench.cli.main"))
        sys.argv = ["mdc", *argv]
        runpy.run_module("mdc_workbench", run_name="__main__", alter_sys=True)
    if moment == "import-torch":
        sys.meta_path.insert(0, _Hold("torch"))
    elif moment == "after-prepare":
        from mdc_core import run_folder as resume

        prepare = resume.prepare_run

        def prepare_then_pause(*args, **kwargs):
            result = prepare(*args, **kwargs)
            _pause()
            return result
        resume.prepare_run = prepare_then_pause
    elif moment == "final-checkpoint":
        from mdc_core import checkpoint

        save = checkpoint.save_checkpoint

        def pause_before_the_last(run_dir, step, cfg, *args, **kwargs):
            if step == cfg.train.steps:
                print("PAUSED", flush=True)
                sys.stdin.readline()  # the test writes a line once it has seen the signal's message
            return save(run_dir, step, cfg, *args, **kwargs)
        checkpoint.save_checkpoint = pause_before_the_last
    else:
        raise SystemExit(f"signal_child: unknown moment {moment!r}")
    from mdc_workbench.cli import main as mdc
    return mdc(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
