"""Metric windows, gates, report pages, Markdown summaries and W&B logging; never imports torch."""
