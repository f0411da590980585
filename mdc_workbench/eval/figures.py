"""Writing the evaluations' figures: one place for the layout, folder, resolution and cleanup of a PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_png(fig: Any, path: str | Path, dpi: int = 120) -> Path:
    """Lay out matplotlib figure `fig`, write it to `path` (parent folders created) and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
