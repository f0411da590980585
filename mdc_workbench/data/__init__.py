"""Writing data sets: the embedded synthetic image-caption set, shards from a user's pairs, a COCO export.

The synthetic set (:func:`write_synthetic_dataset`: WebDataset shards as img2dataset writes them + manifest.json;
:func:`make_example`: one example) draws scenes (:mod:`~mdc_workbench.data.scene`) and captions them
(:mod:`~mdc_workbench.data.captions`); :func:`~mdc_workbench.data.shards.write_shards` turns a caption table or an
image folder into shards; :func:`export_coco` writes a split as a COCO caption json. :mod:`mdc_core.data` reads
them all (``mdc data`` is the command line).
"""

from mdc_workbench.data.captions import NEGATIVE_TYPES
from mdc_workbench.data.coco_export import export_coco
from mdc_workbench.data.scene import (
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
from mdc_workbench.data.synth import make_example, read_manifest, write_synthetic_dataset

__all__ = [
    "BACKGROUNDS", "COLOURS", "LABEL_NAMES", "NEGATIVE_TYPES", "POSITIONS", "SHAPES", "SIZES", "SPLITS",
    "export_coco", "heldout_combos", "make_example", "read_manifest", "vocabularies", "write_synthetic_dataset",
]
