"""The checks of an hf arm's own settings as typed in an arm (``hf:dtype=bfloat16``,
``hf:quant=int8,quant-vision=no``, ``hf:keep=50,policy=norm``): each refusal one line that names the
arm as typed. Used by :meth:`g4v.evaluate.arms.ArmSpec.parse`."""

from g4v.errors import WHOLE_TEXT, G4VError, quoted, read_whole


def checked_precision(text: str, backend: str, values: dict) -> dict:
    """An arm's ``dtype=``/``quant=``/``quant-vision=`` values checked (one line each)."""
    from g4v.model.precision import check_precision

    def check():
        precision = check_precision(values.get("dtype"), values.get("quant"), values.get("quant_vision"))
        return {"dtype": precision.dtype, "quant": precision.quant,
                "quant_vision": None if precision.quant is None else precision.quant_vision}

    return _on_hf(text, backend, "dtype=, quant= and quant-vision= are for hf arms (transformers here)", check)


def checked_budget(text: str, backend: str, keep: str | None, policy: str | None) -> dict:
    """``keep=`` and ``policy=`` checked: an hf arm's token budget (the default policy is norm)."""
    from g4v.model.token_budget import TokenBudget

    def check():
        if keep is None:
            raise G4VError("policy= needs keep=K (the percent of image tokens kept)")
        budget = TokenBudget(read_whole(keep) if WHOLE_TEXT.fullmatch(keep.strip()) else keep, policy or "norm")
        return {"keep": budget.keep, "policy": budget.policy}

    return _on_hf(text, backend, "a token budget (keep=, policy=) runs on hf arms only", check)


def _on_hf(text: str, backend: str, only_hf: str, check) -> dict:
    """``check()``'s checked values for an hf arm; its refusal (or ``only_hf`` on another backend)
    as one line naming the arm as typed."""
    if backend != "hf":
        raise G4VError(f"arm {quoted(text)}: {only_hf}")
    try:
        return check()
    except G4VError as err:
        raise G4VError(f"arm {quoted(text)}: {err}") from None
