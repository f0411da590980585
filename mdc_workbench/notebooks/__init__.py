"""What the numbered notebooks call: the shared helpers (:mod:`~mdc_workbench.notebooks.notebook`, its views), the
lesson's figures, the probe tables and learning-rate sweep the notebooks run, the exercises and their checks, and
the tool that keeps the notebook files stable in JupyterLab (:mod:`~mdc_workbench.notebooks.cell_ids`). Batch runs
of the notebooks are :mod:`mdc_workbench.runs`; trajectory drawings :mod:`mdc_workbench.viz`."""
