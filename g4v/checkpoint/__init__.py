"""What a checkpoint folder holds beside its base weights, known before any engine loads it.

* :mod:`g4v.checkpoint.vision_lora`: the vision LoRA in the model's own folder (the real model's
  layout), found, described and applied in one of three modes; below :mod:`g4v.loading` and every
  engine, which all need it.
"""
