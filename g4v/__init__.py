"""g4v: a workbench for IBM's Granite 4 Vision.

Engines, model loading, tiling, inspection and LoRA tools. No Gradio here: the web app lives in
``app.py`` and the pictures in ``viz``, so this package runs headless and in tests.
"""

__version__ = "0.1.0"

import logging

#: Lines that installing torchao (requirements.txt: the int8 precision arms) would add to every
#: model load: transformers imports torchao's safetensors support as soon as its generation or
#: modelling code is imported, torchao then warns once per CUDA kernel library a CPU build of torch
#: cannot load, and torch warns that torchao registers its enums twice. None of them is about the user's model. Filtered here, at
#: the package's first import, because any g4v module may be what imports transformers first.
_NOISE = {"torchao": "Failed to load ", "torch.utils._pytree": "is an Enum subclass and is now natively supported"}


class _DropNoise(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


for _name, _text in _NOISE.items():
    logging.getLogger(_name).addFilter(_DropNoise(_text))
