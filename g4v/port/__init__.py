"""The vLLM port inspector: vLLM's ``granite4_vision`` compared with transformers, level by level.

Token-level parity (``tests/vllm/test_parity.py``) says *whether* vLLM's port and the transformers
reference agree. This package says *where* and *by how much*:

1. **Per-level features.** vLLM's ``embed_multimodal`` returns, per image, all 8 levels packed on
   the last dimension. It is run inside vLLM's worker on the *same pixel values* transformers
   uses, split per level, and compared with what transformers injects at the same LLM layer
   (:func:`g4v.model.capture.capture_forward`): max absolute and relative difference per level,
   and a per-token difference that the tiling token map turns into a heatmap over the picture.
2. **Inside the language model.** Hooks installed in vLLM's worker record the residual norm at
   every decoder layer during a real prefill; compared with the transformers capture's trajectory.
   Then the next-token distributions (KL, top-5 overlap; vLLM's full-vocabulary logprobs) and the
   greedy continuations (first divergence).
3. **Config audit.** Every config field that shapes the projectors or the injection, as the raw
   ``config.json`` says, as transformers loaded it, and as vLLM actually built its modules.

Both sides must run in the same environment (the vLLM CPU venv: ``.venv-vllm``), so they use the
same image processor; the pixel values are handed to vLLM explicitly anyway.

The modules, in the order a run uses them:

* :mod:`g4v.port.settings`: what a comparison is asked (:class:`~g4v.port.settings.PortDiffSettings`,
  the one place for its defaults: ``port-diff``'s flags, the tab's dropdowns).
* :mod:`g4v.port.run`: one comparison end to end (:func:`~g4v.port.run.run_port_diff`), its
  result and its picture; the CLI (``python -m g4v port-diff``) calls it.
* :mod:`g4v.port.probe`: :class:`~g4v.port.probe.VLLMProbe`, the ``vllm.LLM`` the comparison
  starts for itself, with a way into vLLM's workers.
* :mod:`g4v.port.worker`: the functions that run *inside* vLLM's workers (``apply_model``).
* :mod:`g4v.port.compare`: per-level features, residual trajectories and the next token,
  transformers against vLLM, with the tolerance rule.
* :mod:`g4v.port.audit`: the config audit.
* :mod:`g4v.port.table`: the per-level table as the CLI and the tab print it (one formatter).
* :mod:`g4v.port.in_vllm_env`: runs ``port-diff`` in the vLLM environment from one without vLLM
  (the app's Port tab).

Nothing is imported here, so that vLLM's workers can import :mod:`g4v.port.worker` cheaply.
"""

#: Greedy tokens compared between transformers and vLLM, unless told (``port-diff``, the vLLM port tab).
COMPARED_TOKENS = 16
