"""The web UI: one module per tab, Gradio only; the work happens in the g4v package."""
