"""The numbered notebooks as static pages a student can read without running anything: each notebook executed with
its own defaults (papermill, kernel ``mdc``), timed, and converted to HTML (nbconvert) in ``docs/notebooks_html/``.

    python docs/notebooks_html.py                     # execute all (00-06) with their defaults, then convert
    python docs/notebooks_html.py --only 02 05        # some of them
    python docs/notebooks_html.py --convert-only      # convert what is executed already (papermill_runs/notebooks/)

``make notebooks-html`` runs the first. Executed copies go to ``papermill_runs/notebooks/<name>.ipynb`` (ignored by
git) with ``timings.json`` (wall seconds of each execution, the kernel's start included, and the load average
before and after: a load above the core count means the machine was shared). The defaults share ``make demo``'s
data and model cache, so a notebook run after ``make demo`` (or after the notebooks before it) reuses their models
and takes less time than on a fresh clone; the notebooks say "reusing ..." when they do. The pages carry their
figures as PNG and no widget state (the trajectory explorer of 05 needs a kernel; its figures are shown).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def notebooks(only: list[str]) -> list[Path]:
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    chosen = [p for p in paths if not only or any(p.name.startswith(o) for o in only)]
    if not chosen:
        sys.exit(f"no notebook matches {only}; there are {', '.join(p.stem for p in paths)}")
    return chosen


def execute(path: Path, executed_dir: Path) -> dict:
    """Run one notebook with its defaults; returns its timing record."""
    import papermill

    from mdc_core.workbench.plans import ensure_kernel

    target = executed_dir / path.name
    before = os.getloadavg()
    start = time.perf_counter()
    papermill.execute_notebook(str(path), str(target), kernel_name=ensure_kernel(), cwd=str(ROOT),
                               progress_bar=True, execution_timeout=1800)
    seconds = time.perf_counter() - start
    record = {"seconds": round(seconds, 1), "load_before": [round(x, 2) for x in before],
              "load_after": [round(x, 2) for x in os.getloadavg()], "cores": os.cpu_count(),
              "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    print(f"{path.stem}: {seconds / 60:.1f} min (load {before[0]:.1f} -> {record['load_after'][0]:.1f})")
    return record


def convert(executed: Path, out_dir: Path) -> Path:
    """One executed notebook as an HTML page, without widget state (it would only add size: no kernel serves it)."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(executed), as_version=4)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            out.get("data", {}).pop("application/vnd.jupyter.widget-view+json", None)
    exporter = HTMLExporter(template_name="lab")
    exporter.exclude_input_prompt = False
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": executed.stem}})
    page = out_dir / f"{executed.stem}.html"
    page.write_text(body, encoding="utf-8")
    return page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=[], help="notebook number prefixes, e.g. 02 05")
    parser.add_argument("--convert-only", action="store_true", help="convert the executed copies; run nothing")
    parser.add_argument("--executed", default=str(ROOT / "papermill_runs" / "notebooks"),
                        help="folder of the executed copies (and timings.json)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "notebooks_html"), help="folder of the HTML pages")
    args = parser.parse_args(argv)
    executed_dir, out_dir = Path(args.executed), Path(args.out)
    executed_dir.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    timings_path = executed_dir / "timings.json"
    timings = json.loads(timings_path.read_text()) if timings_path.is_file() else {}
    for path in notebooks(args.only):
        if not args.convert_only:
            timings[path.stem] = execute(path, executed_dir)
            timings_path.write_text(json.dumps(timings, indent=1) + "\n")
        executed = executed_dir / path.name
        if not executed.is_file():
            sys.exit(f"{executed} is missing: run without --convert-only first")
        page = convert(executed, out_dir)
        print(f"{page.relative_to(ROOT) if page.is_relative_to(ROOT) else page}: {page.stat().st_size / 1e6:.1f} MB")
    total = sum(p.stat().st_size for p in out_dir.glob("*.html"))
    print(f"{out_dir}: {total / 1e6:.1f} MB of HTML")
    return 0


if __name__ == "__main__":
    sys.exit(main())
