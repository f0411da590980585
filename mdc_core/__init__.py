"""mdc_core: masked diffusion captioning (Feng, Wei, Owens 2025) as a small, typed workbench."""

__version__ = "0.1.0"
