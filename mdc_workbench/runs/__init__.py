"""Batch runs and their verdicts: plans of notebooks executed by papermill (``mdc runs PLAN.yaml``), the runner,
the progress a notebook reports to it, the plan's summary with the evidence and the paper's claims judged under
pre-declared definitions, the central claim's results file, and ``make gpu-check``."""
