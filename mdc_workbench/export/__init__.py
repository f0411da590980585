"""Models leaving the workbench: a trained run's encoder as a timm or Hugging Face-style folder with its model card
(``mdc export``), and the small captioner shipped with the repository (:mod:`~mdc_workbench.export.shipped`).

**Downstream code** takes a trained encoder with ``encoder, preprocess = load_encoder(path)`` (``from
mdc_workbench.export import load_encoder``; :mod:`~mdc_workbench.export.encoder_io`), and the whole captioner with
Hugging Face's own call, ``MDCCaptioner.from_pretrained(path)`` (:mod:`~mdc_workbench.export.hub`). Both resolve on
first use, so importing this package imports no torch.
"""

# the public names, each resolved on first use from its module (PEP 562), so that the import stays light
_LAZY = {"load_encoder": "encoder_io", "MDCCaptioner": "hub"}
__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'mdc_workbench.export' has no attribute {name!r}")


def __dir__() -> list[str]:  # the lazy names too (dir() would otherwise show only what was imported)
    return sorted({*globals(), *__all__})
