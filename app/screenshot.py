"""Headless-Chromium screenshot of the app after one full unmasking (the README picture).

``python -m mdc_app.screenshot [--run RUN] [--out docs/app_screenshot.png]`` launches the app on a free loopback
port in this process, lets Debian's ``chromium`` (``apt-get install -y chromium``) load the page, whose load event
shows a scene and unmasks its caption to the last step, saves the screenshot, shrinks it to a small PNG and
stops the app. Chromium runs with networking extras off, so nothing but 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from PIL import Image

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                  "--disable-extensions", "--force-device-scale-factor=1", "--mute-audio")


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome executable, or None."""
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_up(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the app did not answer at {url} within {timeout_s:.0f} s") from None
            time.sleep(0.5)


def capture(url: str, out: str | Path, *, width: int = 1200, height: int = 1600, budget_ms: int = 30000,
            timeout_s: float = 180.0) -> Path:
    """Screenshot `url` with headless Chromium into `out` (PNG, width x height CSS pixels)."""
    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError("no Chromium found; install it with: apt-get install -y chromium")
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mdc-chromium-") as profile:
        cmd = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
               f"--virtual-time-budget={budget_ms}", f"--screenshot={out}", url]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return out


def crop_blank_bottom(img: Image.Image, margin: int = 24, gap: int = 60) -> Image.Image:
    """Cut the empty page below the content: rows after the last block of content that is followed by a gap of
    more than `gap` blank rows (gradio's small footer line is dropped with it), keeping `margin` px."""
    import numpy as np
    ink = (np.asarray(img.convert("L")) < 243).any(axis=1)  # (H,) rows with anything but white
    rows = np.flatnonzero(ink)
    if rows.size == 0:
        return img
    breaks = np.flatnonzero(np.diff(rows) > gap)  # content blocks separated by tall blank bands
    blocks = np.split(rows, breaks + 1)
    if len(blocks) > 1 and blocks[-1][-1] - blocks[-1][0] < 40:  # a short last block: the footer
        blocks = blocks[:-1]
    return img.crop((0, 0, img.width, min(int(blocks[-1][-1]) + margin, img.height)))


def shrink(path: str | Path, width: int = 900, colours: int = 128) -> Path:
    """Crop the blank bottom, downscale to `width` px and quantize to `colours` colours, in place."""
    img = crop_blank_bottom(Image.open(path).convert("RGB"))
    if img.width > width:
        img = img.resize((width, round(img.height * width / img.width)), Image.Resampling.LANCZOS)
    img.quantize(colours, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)
    return Path(path)


def screenshot(out: str | Path, *, run: str | Path | None = None, root: str | Path | None = None,
               width: int = 1200, height: int = 1600, budget_ms: int = 30000, small: int | None = None) -> Path:
    """Launch the app on a free loopback port, screenshot it after the first full unmasking, stop it."""
    from .launch import serve
    port = _free_port()
    demo = serve(run, root=root, port=port, block=False)
    try:
        url = f"http://127.0.0.1:{port}/"
        _wait_until_up(url)
        path = capture(url, out, width=width, height=height, budget_ms=budget_ms)
    finally:
        demo.close()
    return shrink(path, small) if small else path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m mdc_app.screenshot", description=__doc__.splitlines()[0])
    p.add_argument("--run", default=None,
                   help="run folder (default: what `make app` opens, mdc_app.launch.default_run)")
    p.add_argument("--out", default="docs/app_screenshot.png", help="PNG to write")
    p.add_argument("--width", type=int, default=1200)
    p.add_argument("--height", type=int, default=1600)
    p.add_argument("--budget-ms", type=int, default=30000, help="Chromium's virtual time budget")
    p.add_argument("--small", type=int, default=900, help="shrink to this width (0 = keep full size)")
    args = p.parse_args(argv)
    path = screenshot(args.out, run=args.run, width=args.width, height=args.height, budget_ms=args.budget_ms,
                      small=args.small or None)
    print(f"wrote {path} ({path.stat().st_size // 1024} KB)")


if __name__ == "__main__":
    main()
