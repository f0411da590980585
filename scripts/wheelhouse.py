"""Download the wheels an offline GPU machine needs to run this project, into one folder (``make wheelhouse``).

GPU images ship their own CUDA build of torch; a machine without network cannot fetch the rest. This walks the
project's requirements (the core and the extras named, default ``notebooks``: what ``make gpu-check`` runs) through
the packages installed in this environment, drops the torch stack and every package the target image already has
(``--have``: one name per line; ``benchmarks/gpu_image_packages.txt`` lists the lent GPU image's), and downloads
each remaining one as a wheel for the target Python and platform, at this environment's version:

    python scripts/wheelhouse.py --python-version 3.12 --out .wheelhouse
    # on the GPU machine, in the repository root (keeps the machine's torch):
    python3 -m pip install --no-index --no-deps --target /tmp/site .wheelhouse/*.whl
    export PYTHONPATH=/tmp/site:$PWD && python3 -m mdc_workbench.runs.gpu_check --out gpu_check_out

``--extras eval`` adds pycocoevalcap (its wheel alone is ~100 MB, for the caption metrics of notebook 05).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

PROJECT = "mdc-workbench"
TORCH_STACK = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*|cuda-.*)$")
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64",
             "manylinux1_x86_64"]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(extras: list[str], python_version: str) -> dict[str, str]:
    """{canonical name: installed version} of every distribution the project needs with `extras`, found through
    this environment's installed metadata; markers are evaluated for the target `python_version`."""
    env = {**default_environment(), "python_version": python_version, "python_full_version": python_version + ".0"}
    found: dict[str, str] = {}
    todo = [(PROJECT, set(extras))]
    while todo:
        name, wanted = todo.pop()
        dist = metadata.distribution(name)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not any(req.marker.evaluate({**env, "extra": e}) for e in wanted or {""}):
                continue
            key = canonical(req.name)
            if key in found:
                continue
            try:
                found[key] = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                print(f"wheelhouse: {req.name} (needed by {name}) is not installed here; skipped", file=sys.stderr)
                continue
            todo.append((req.name, set(req.extras)))
    found.pop(canonical(PROJECT), None)
    return found


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".wheelhouse", help="folder for the wheels (default .wheelhouse, git-ignored)")
    ap.add_argument("--python-version", default="3.12", help="the target machine's Python (default 3.12)")
    ap.add_argument("--extras", default="notebooks", help="project extras to include, comma-separated")
    ap.add_argument("--have", default="benchmarks/gpu_image_packages.txt",
                    help="names the target already has, one per line ('' = none)")
    ap.add_argument("--dry-run", action="store_true", help="list what would be downloaded")
    args = ap.parse_args(argv)
    have = set()
    if args.have:
        have = {canonical(x.split("#")[0].strip()) for x in Path(args.have).read_text().splitlines()
                if x.split("#")[0].strip()}
    need = {k: v for k, v in closure([e for e in args.extras.split(",") if e], args.python_version).items()
            if not TORCH_STACK.match(k) and k not in have}
    print(f"wheelhouse: {len(need)} packages for Python {args.python_version}: "
          + ", ".join(f"{k}=={v}" for k, v in sorted(need.items())))
    if args.dry_run or not need:
        return
    Path(args.out).mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version",
           args.python_version, "--implementation", "cp", "-d", args.out]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    failed = []
    for name, version in sorted(need.items()):
        if subprocess.run([*cmd, f"{name}=={version}"]).returncode != 0:
            failed.append(f"{name}=={version}")
    if failed:
        raise SystemExit(f"wheelhouse: no wheel for {', '.join(failed)} (Python {args.python_version}, x86-64 "
                         "manylinux); install them on the target another way or drop the extra that needs them")
    print(f"wheelhouse: {len(need)} wheels in {args.out}")


if __name__ == "__main__":
    main()
