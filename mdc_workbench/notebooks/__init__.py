"""Notebook and batch-run support: notebook helpers, plans of notebooks run by papermill, their summaries."""
