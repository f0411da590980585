"""Draw docs/import_graph.png: the two packages and the app, and which part imports which.

    python docs/draw_imports.py [--out docs/import_graph.png]

The graph is read from the source with ``ast`` by ``tests/test_architecture.py`` (every ``import``, also inside
functions); this script groups its modules into parts (the core ``mdc_core`` as one; the workbench's subpackages;
the app) and draws one arrow per pair of parts, labelled with the number of module-level edges. The
same test fails if an arrow ever points up (from the core to the workbench or the app) or closes a cycle.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.test_architecture import import_graph  # noqa: E402

# part -> (x, y) of its box centre; the core at the bottom, the command line at the top
LAYOUT = {
    "mdc_app": (1.3, 9.0),
    "mdc_workbench.cli": (3.77, 9.0),
    "mdc_workbench.notebooks": (6.23, 9.0),
    "mdc_workbench.seed_stack": (8.7, 9.0),
    "mdc_workbench.runs": (1.3, 7.4),
    "mdc_workbench.viz": (3.77, 7.4),
    "mdc_workbench.export": (6.23, 7.4),
    "mdc_workbench.bench": (8.7, 7.4),
    "mdc_workbench.masked_conditional": (3.2, 5.8),
    "mdc_workbench.eval": (6.8, 5.8),
    "mdc_workbench.data": (5.0, 4.3),
    "mdc_core": (5.0, 2.0),
}
HALF_W, HALF_H = 1.1, 0.35  # half the size of a part's box
CORE, WORKBENCH, APP = "#d9ead3", "#dbe5f1", "#fde9d9"


def part(module: str) -> str:
    """The part a module belongs to (the longest key of LAYOUT it starts with; mdc_workbench's own top level and
    ``__main__`` count as its command line)."""
    if module in ("mdc_workbench", "mdc_workbench.__main__"):
        return "mdc_workbench.cli"
    return max((p for p in LAYOUT if module == p or module.startswith(p + ".")), key=len)


def edges(graph: dict[str, set[str]]) -> Counter:
    return Counter((part(a), part(b)) for a, deps in graph.items() for b in deps if part(a) != part(b))


def draw(out: Path) -> None:
    counts = edges(import_graph())
    fig, ax = plt.subplots(figsize=(10, 7.2))
    ax.set_xlim(0, 10)
    ax.set_ylim(0.6, 10)
    ax.axis("off")
    ax.add_patch(FancyBboxPatch((0.1, 3.6), 9.8, 6.2, boxstyle="round,pad=0.05", fc="none", ec="#4a6fa5", ls="--"))
    ax.text(9.85, 9.75, "mdc_workbench (+ the app)", ha="right", va="top", fontsize=9, color="#4a6fa5")
    ax.add_patch(FancyBboxPatch((0.4, 0.9), 9.2, 2.4, boxstyle="round,pad=0.05", fc="none", ec="#38761d", ls="--"))
    ax.text(9.55, 1.0, "mdc_core: imports neither", ha="right", va="bottom", fontsize=9, color="#38761d")
    for name, (x, y) in LAYOUT.items():
        face = CORE if name.startswith("mdc_core") else APP if name == "mdc_app" else WORKBENCH
        ax.add_patch(FancyBboxPatch((x - HALF_W, y - HALF_H), 2 * HALF_W, 2 * HALF_H, boxstyle="round,pad=0.03",
                                    fc=face, ec="#555"))
        ax.text(x, y, name.replace("mdc_workbench.", "workbench.").replace("mdc_app", "app (mdc_app)"),
                ha="center", va="center", fontsize=9)
    for (a, b), n in sorted(counts.items()):
        (xa, ya), (xb, yb) = LAYOUT[a], LAYOUT[b]
        up = yb > ya
        if ya == yb:  # one row: from the side of one box to the side of the other
            side = HALF_W if xb > xa else -HALF_W
            start, end = (xa + side, ya), (xb - side, yb)
        else:
            start, end = (xa, ya - HALF_H if yb < ya else ya), (xb, yb + HALF_H if yb < ya else yb)
        arrow = FancyArrowPatch(start, end,
                                arrowstyle="-|>", mutation_scale=12, color="#c00000" if up else "#666",
                                lw=0.8 + 0.25 * min(n, 8), connectionstyle="arc3,rad=0.08", alpha=0.8)
        ax.add_patch(arrow)
        ax.text(xa + 0.3 * (xb - xa) + 0.12, ya + 0.3 * (yb - ya), str(n), fontsize=8, color="#333",
                bbox=dict(fc="white", ec="none", pad=0.5))
    ax.set_title("Import graph by part: arrows point from importer to imported (number: module edges); "
                 "none points up", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}: {len(counts)} arrows, {sum(counts.values())} module edges between parts")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "import_graph.png")
    draw(parser.parse_args().out)
