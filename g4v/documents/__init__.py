"""Documents: PDF pages as images, Granite Vision's task presets, and its structured answers
rendered, checked and scored. Plain functions and typed results, no Gradio.

* :mod:`g4v.documents.pdf`: PDF pages rendered with PDFium, every limit a one-line refusal.
* :mod:`g4v.documents.presets`: the documented task prompts (chart to CSV, tables to HTML, ...).
* :mod:`g4v.documents.structured`: an answer parsed, sanitised and validated for display.
* :mod:`g4v.documents.metrics`: TEDS, CSV cell accuracy, key-value exact match (dataset runs).
* :mod:`g4v.documents.examples`: the example report PDF, drawn by our own code.
"""
