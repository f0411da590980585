"""``python -m mdc_workbench`` and the ``mdc`` script: SIGINT and SIGTERM exit at once with one line until
:func:`mdc_workbench.cli.main` takes them over, so a Ctrl-C while the command line's modules import is no traceback."""

import os
import signal
import sys


def _exit_now(signum: int, frame: object) -> None:
    sys.stderr.write("mdc: interrupted" + ("" if signum == signal.SIGINT else f" by {signal.Signals(signum).name}")
                     + "\n")
    os._exit(128 + signum)


def run() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):  # whatever the inherited disposition (see mdc_workbench.cli.main)
        signal.signal(sig, _exit_now)
    from mdc_workbench.cli import main
    sys.exit(main())


if __name__ == "__main__":
    run()
