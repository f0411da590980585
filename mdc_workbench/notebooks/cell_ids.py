"""Notebook files that JupyterLab leaves unchanged on open: nbformat 4.5, a stable id on every cell, the kernel's
``language_info``, and the bytes Jupyter's own writer produces.

JupyterLab 4 upgrades a notebook without cell ids (nbformat 4.4) to 4.5 when it opens it and invents random ids,
and it writes the kernel's full ``language_info`` into the metadata when the kernel starts; either marks the
notebook changed at once, and a save rewrites the tracked file. :func:`normalize` writes what a save would write,
once: nbformat 4.5, every cell with an id (existing valid, unique ids are kept; a missing or duplicate one gets
``<position>-<hash of the source>``, so running it again changes nothing), a complete ``language_info`` (an
incomplete one is filled in with ipykernel's, whose ``version`` is this interpreter's: on another Python version
JupyterLab still updates that one field), in ``nbformat.write``'s layout.

    python -m mdc_workbench.notebooks.cell_ids notebooks/*.ipynb        # rewrite; prints the files it changed
    python -m mdc_workbench.notebooks.cell_ids --check notebooks/*.ipynb  # exit 1 naming the files it would change
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path

VALID_ID = re.compile(r"^[a-zA-Z0-9-_]{1,64}$")  # nbformat 4.5's cell id pattern


def normalized_text(text: str) -> str:
    """The notebook JSON `text` as :func:`normalize` writes it (nbformat 4.5, ids, nbformat's layout)."""
    import nbformat

    nb = nbformat.reads(text, as_version=4)
    nb.nbformat, nb.nbformat_minor = 4, max(5, int(nb.get("nbformat_minor", 0)))
    seen: set[str] = set()
    for position, cell in enumerate(nb.cells):
        cell_id = cell.get("id")
        if not (isinstance(cell_id, str) and VALID_ID.match(cell_id)) or cell_id in seen:
            digest = hashlib.sha1(cell.source.encode()).hexdigest()[:8]
            cell_id = f"{position:02d}-{digest}"
            while cell_id in seen:  # two cells with one position and source cannot happen; a reused old id can
                cell_id = f"{cell_id}x"
            cell["id"] = cell_id
        seen.add(cell_id)
    kernel = kernel_language_info()
    if set(nb.metadata.get("language_info", {})) < set(kernel):  # incomplete: what the kernel will write
        nb.metadata["language_info"] = kernel
    nbformat.validate(nb)
    return nbformat.writes(nb) + "\n"  # what nbformat.write (JupyterLab's save) puts on disk


def kernel_language_info() -> dict:
    """The ``language_info`` a Python kernel of this interpreter reports (ipykernel's)."""
    try:
        from ipykernel.ipkernel import IPythonKernel

        return dict(IPythonKernel.language_info)
    except ImportError:
        return {"name": "python", "version": sys.version.split()[0], "mimetype": "text/x-python",
                "codemirror_mode": {"name": "ipython", "version": sys.version_info[0]},
                "pygments_lexer": f"ipython{sys.version_info[0]}", "nbconvert_exporter": "python",
                "file_extension": ".py"}


def normalize(path: str | Path) -> bool:
    """Rewrite the notebook at `path` normalized; whether it changed."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    new = normalized_text(text)
    if new == text:
        return False
    path.write_text(new, encoding="utf-8")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mdc_workbench.notebooks.cell_ids",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="+", help="notebook files")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would change")
    args = parser.parse_args(argv)
    changed = []
    for name in args.notebooks:
        text = Path(name).read_text(encoding="utf-8")
        if normalized_text(text) != text:
            changed.append(name)
            if not args.check:
                normalize(name)
    for name in changed:
        print(("would change " if args.check else "normalized ") + name)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
