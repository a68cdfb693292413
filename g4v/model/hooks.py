"""The one place hooks are added to a model's modules and removed again.

A hook left behind changes every later request that runs the same model (an ablation that
outlives its request, a probe that keeps tensors alive), so every hook g4v adds, in transformers,
in vLLM's workers or while training the demo, goes through a :class:`Hooks`: used as a ``with``
block it removes them all when the block ends, whatever happens inside it; an owner that keeps its
hooks across calls (a training aid, a probe in a vLLM worker) calls :meth:`Hooks.remove`.

Which module a hook goes on is named, not walked to: :func:`g4v.model.sites.site` finds a capture
point (``site(model, "layers.3.self_attn")``). Only torch's own module API is used here, so vLLM's
workers can import this module too.
"""


class Hooks:
    """A set of hooks on ``torch.nn.Module`` objects, removed together."""

    def __init__(self):
        self._handles = []

    def before(self, module, hook, with_kwargs: bool = False) -> None:
        """``hook(module, args[, kwargs])`` before ``module.forward`` (a forward pre-hook)."""
        self._handles.append(module.register_forward_pre_hook(hook, with_kwargs=with_kwargs))

    def after(self, module, hook) -> None:
        """``hook(module, args, output)`` after ``module.forward`` (a forward hook)."""
        self._handles.append(module.register_forward_hook(hook))

    def remove(self) -> None:
        """Remove every hook added so far (safe to call twice)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __enter__(self) -> "Hooks":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()
