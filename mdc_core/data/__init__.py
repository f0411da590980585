"""Data: the loaders that read image-caption pairs (WebDataset shards, CSV/TSV caption tables, COCO json).

:func:`build_loader` (batches), :func:`iter_captions` (captions only), :func:`resolve_source` (what a data path
names), :func:`load_image` (one image for the CLI/app). Writing data sets (the embedded synthetic one, shards from
a caption table, a COCO export) is the workbench's (``mdc data``).
"""

from mdc_core.data.loaders import SKIP_REASONS, build_loader, iter_captions
from mdc_core.data.sources import resolve_source
from mdc_core.data.transforms import load_image

__all__ = ["SKIP_REASONS", "build_loader", "iter_captions", "load_image", "resolve_source"]
