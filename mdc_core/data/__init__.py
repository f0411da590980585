"""Data: the embedded synthetic image-caption data set and the loaders that read it and real data.

Writing: :func:`write_synthetic_dataset` (WebDataset shards as img2dataset writes them + manifest.json),
:func:`make_example` (one example), :func:`export_coco`. Reading: :func:`build_loader` (batches),
:func:`iter_captions` (captions only), :func:`load_image` (one image for the CLI/app).
"""

from mdc_core.data.captions import NEGATIVE_TYPES
from mdc_core.data.coco_export import export_coco
from mdc_core.data.loaders import SKIP_REASONS, build_loader, iter_captions
from mdc_core.data.scene import (
    BACKGROUNDS,
    COLOURS,
    LABEL_NAMES,
    POSITIONS,
    SHAPES,
    SIZES,
    SPLITS,
    heldout_combos,
    vocabularies,
)
from mdc_core.data.sources import resolve_source
from mdc_core.data.synth import make_example, read_manifest, write_synthetic_dataset
from mdc_core.data.transforms import load_image

__all__ = [
    "BACKGROUNDS", "COLOURS", "LABEL_NAMES", "NEGATIVE_TYPES", "POSITIONS", "SHAPES", "SIZES", "SKIP_REASONS",
    "SPLITS", "build_loader", "export_coco", "heldout_combos", "iter_captions", "load_image", "make_example",
    "read_manifest", "resolve_source", "vocabularies", "write_synthetic_dataset",
]
