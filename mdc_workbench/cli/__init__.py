"""The `mdc` command line: one module per verb group; `mdc = mdc_workbench.cli:main`."""

from mdc_workbench.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
