"""g4v: a workbench for IBM's Granite 4 Vision.

Engines, model loading, tiling, inspection and LoRA tools. No Gradio here: the web app lives in
``app.py`` and the pictures in ``viz``, so this package runs headless and in tests.
"""

__version__ = "0.1.0"
