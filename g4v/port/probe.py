"""The in-process vLLM engine the port comparison drives: :class:`VLLMProbe`.

vLLM keeps its model in worker processes, and the per-level features and the residual stream never
leave them. The probe starts its *own* ``vllm.LLM`` and reaches into the workers with the functions
of :mod:`g4v.port.worker`; requests then run through vLLM as usual (prefill, greedy decoding,
full-vocabulary logprobs).

Why ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``: the only way into vLLM's worker processes is
``LLM.apply_model(func)``, and vLLM only ships a Python function to its workers (cloudpickle) when
that variable is set, because unpickling runs arbitrary code. This tool starts its *own*
``vllm.LLM`` (engine and workers are its children), sets the variable just before that, and puts the
previous value back on :meth:`VLLMProbe.close`. The app's serving engine never gets it.

Why the probe holds stderr: vLLM's start and stop wrote about 70 lines there before the report
(its INFO and WARNING logs from three processes, Triton's and torch's C++ warnings, tqdm bars).
vLLM's own logger is set to errors only (:data:`QUIET_ENV`, unless the user set it), and while the
probe lives file descriptor 2, which vLLM's engine and worker processes inherit, goes to a
temporary file; vLLM's ERROR lines are written back at the end, one line each.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile

import torch

from g4v.engines.vllm_start import start_error
from g4v.errors import G4VError

_INSECURE = "VLLM_ALLOW_INSECURE_SERIALIZATION"
#: vLLM's logger and torch's C++ side log errors only (a value the user set is kept).
QUIET_ENV = {"VLLM_LOGGING_LEVEL": "ERROR", "TORCH_CPP_LOG_LEVEL": "ERROR"}
#: The longest vLLM error line written back.
MAX_ERROR_LINE = 300


class VLLMProbe:
    """A ``vllm.LLM`` started for this tool, with the worker-side probes of :mod:`g4v.port.worker`.

    Prefix caching is off so that every request's prefill runs through every token (a cached prefix
    would skip the hooks); ``max_logprobs=-1`` lets a request ask for the full-vocabulary logprobs
    the KL needs. Like every vLLM engine it starts child processes with ``spawn``: scripts need the
    ``if __name__ == "__main__":`` guard.
    """

    def __init__(self, model: str, dtype: str = "float32", max_model_len: int = 4096,
                 max_num_batched_tokens: int | None = None, vision_lora: str = "native", serving: dict | None = None):
        """``vision_lora``: the mode of the checkpoint's vision LoRA on this side (a checkpoint that
        has one is served from a view without the adapter files, or a merged copy); ``serving``: the
        LoRA engine arguments vLLM gets (:mod:`g4v.port.lora_audit`; default g4v's recipe)."""
        from g4v.engines import vllm_installed

        if not vllm_installed():
            raise G4VError("the port inspector needs vLLM: run it from the vLLM environment "
                           "(scripts/setup_vllm_cpu_env.sh, then .venv-vllm/bin/python -m g4v port-diff ...)")
        from g4v.engines.vllm_settings import VLLMSettings, engine_arguments
        from g4v.loading import resolve_source

        from g4v.checkpoint.vision_lora import check_mode, find_vision_lora, served_view
        from g4v.port import lora_audit

        source = resolve_source(model)
        self.vision_lora = find_vision_lora(source)
        self.vision_mode = check_mode(vision_lora) if self.vision_lora is not None else "off"
        self.serving = lora_audit.recipe(self.vision_lora, self.vision_mode) if serving is None else dict(serving)
        settings = VLLMSettings(dtype=dtype, max_model_len=max_model_len, enable_lora=False, max_images=1,
                                max_num_batched_tokens=max_num_batched_tokens or max_model_len)
        self.arguments = engine_arguments(source, settings)
        self.arguments.update(enable_prefix_caching=False, max_logprobs=-1,
                              **lora_audit.runnable(self.vision_lora, self.serving))
        self._view = served_view(self.vision_lora, self.vision_mode)
        if self._view is not None:
            self.arguments["model"] = str(self._view.path)
        self._previous = os.environ.get(_INSECURE)
        os.environ[_INSECURE] = "1"  # see the module docstring: apply_model ships functions by pickle
        for name, value in QUIET_ENV.items():
            os.environ.setdefault(name, value)
        self._stderr = _HeldStderr()
        try:
            from vllm import LLM

            self.llm = LLM(**self.arguments)
        except Exception as err:  # vLLM reports load failures in many types; the caller reports it
            lines = self._stderr.lines()
            self._restore_env()
            raise start_error(err, lines) from None

    def apply(self, func, **kwargs):
        """``func(model, **kwargs)`` in vLLM's worker; the first worker's answer."""
        return self.llm.apply_model(functools.partial(func, **kwargs) if kwargs else func)[0]

    def embed_levels(self, pixel_values: torch.Tensor, image_sizes: torch.Tensor) -> dict:
        from g4v.port import worker

        return self.apply(worker.embed_levels, pixel_values=pixel_values.detach().cpu(),
                          image_sizes=image_sizes.detach().cpu())

    def module_facts(self) -> dict:
        from g4v.port import worker

        return self.apply(worker.module_facts)

    def prefill(self, prompt: dict, expected_tokens: int) -> tuple[torch.Tensor | None, dict, list[int]]:
        """One prefill with hooks in the worker: per-token residual norms ``(layers + 1, tokens)``,
        the full-vocabulary logprobs of the next token ``{id: logprob}`` and vLLM's prompt token ids."""
        from vllm import SamplingParams

        from g4v.port import worker

        self.apply(worker.install_trajectory_hooks, expected_tokens=expected_tokens)
        try:
            output = self.llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1, logprobs=-1),
                                       use_tqdm=False)[0]
        finally:
            recorded = self.apply(worker.collect_trajectory)
        logprobs = {int(k): float(v.logprob) for k, v in output.outputs[0].logprobs[0].items()}
        return recorded["norms"], logprobs, list(output.prompt_token_ids)

    def greedy(self, prompt: dict, max_tokens: int, eos_token_id: int | None) -> list[int]:
        from vllm import SamplingParams

        if max_tokens <= 0:
            return []
        output = self.llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=max_tokens),
                                   use_tqdm=False)[0]
        ids = list(output.outputs[0].token_ids)
        return ids[: ids.index(eos_token_id)] if eos_token_id in ids else ids

    def _restore_env(self) -> None:
        view, self._view = getattr(self, "_view", None), None
        if view is not None:
            view.close()
        self._stderr.release()
        if self._previous is None:
            os.environ.pop(_INSECURE, None)
        else:
            os.environ[_INSECURE] = self._previous

    def close(self) -> None:
        """Stop vLLM's engine-core and worker processes."""
        llm, self.llm = getattr(self, "llm", None), None
        try:
            if llm is not None:
                core = getattr(llm, "llm_engine", None)  # vLLM's own engine object (its versions differ)
                shutdown = getattr(core, "shutdown", None) or getattr(getattr(core, "engine_core", None),
                                                                      "shutdown", None)
                if shutdown is not None:
                    shutdown()
                del llm
        finally:
            self._restore_env()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _HeldStderr:
    """File descriptor 2 sent to a temporary file until :meth:`release` (see the module docstring)."""

    def __init__(self):
        sys.stderr.flush()
        self.file = tempfile.TemporaryFile()
        self.saved: int | None = os.dup(2)
        os.dup2(self.file.fileno(), 2)

    def lines(self) -> list[str]:
        """What was written so far (the engine core's traceback, when it failed to start)."""
        sys.stderr.flush()
        self.file.seek(0)
        text = self.file.read().decode(errors="replace")
        self.file.seek(0, os.SEEK_END)
        return text.splitlines()

    def release(self) -> None:
        """Give fd 2 back, and write vLLM's ERROR lines to it, one line each. Safe to call twice."""
        if self.saved is None:
            return
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.saved = None
        self.file.seek(0)
        for line in self.file.read().decode(errors="replace").splitlines():
            if " ERROR " in line:
                print(line.strip()[:MAX_ERROR_LINE], file=sys.stderr)
        self.file.close()
