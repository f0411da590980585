"""Drawing a sampler's trajectory, shared by the app and the notebooks: the canvas replayed after any step, token
chips and the confidence heatmap (:mod:`~mdc_workbench.viz.trajectory_view`), attention overlays and GIFs
(:mod:`~mdc_workbench.viz.animation`). Plain data in, HTML or figures out; nothing here runs a model."""
