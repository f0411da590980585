"""Models leaving the workbench: a trained run's encoder as a timm or Hugging Face-style folder with its model card
(``mdc export``), and the small captioner shipped with the repository (:mod:`~mdc_workbench.export.shipped`)."""
