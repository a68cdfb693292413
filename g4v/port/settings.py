"""What a port comparison is asked: :class:`PortDiffSettings`, the one place for its defaults.

``python -m g4v port-diff`` derives its comparison flags from the fields
(:mod:`g4v.settings.flags`); the vLLM port tab starts its dropdowns at them and hands the
object to :func:`g4v.port.in_vllm_env.run_port_diff_in_vllm_env`, which turns it back into that
command line. A default changed here changes the command, the tab and the command line the tab runs.
"""

from dataclasses import dataclass, field

from g4v.checkpoint.vision_lora import DEFAULT_MODE, MODES
from g4v.conversation import check_continuation_length
from g4v.errors import NumberError, quoted, read_decimal
from g4v.port import COMPARED_TOKENS


def tolerance(text: str) -> float:
    """A tolerance as typed: a finite number >= 0 (``ValueError`` names the problem in one line)."""
    try:
        value = read_decimal(text)
    except NumberError:
        raise NumberError(f"expected a finite number >= 0 written with the digits 0-9, got {quoted(text)}") from None
    if value < 0:
        raise NumberError(f"expected a finite number >= 0, got {quoted(text)}")
    return value


@dataclass(frozen=True)
class PortDiffSettings:
    """How long the compared continuations are, the per-level tolerance (None: the dtype's
    default, :func:`g4v.port.compare.default_tolerance`) and how each side runs a checkpoint's
    vision LoRA. ``vllm_serving`` is vLLM's LoRA arguments as JSON text, as typed (None: g4v's
    recipe for ``vllm_vision_lora``); :func:`g4v.port.lora_audit.parse_serving` reads and checks it."""

    max_new_tokens: int = field(default=COMPARED_TOKENS, metadata={
        "check": check_continuation_length, "help": "greedy tokens compared"})
    atol: float | None = field(default=None, metadata={
        "parse": tolerance, "help": "per-level absolute tolerance (default: torch.testing's for the dtype, 1e-5)"})
    rtol: float | None = field(default=None, metadata={
        "parse": tolerance,
        "help": "per-level relative tolerance, times max(|ref|, token RMS) (default 1e-4 in float32)"})
    vision_lora: str = field(default=DEFAULT_MODE, metadata={
        "choices": MODES, "help": "transformers' mode for a checkpoint's vision LoRA (native, merged, off)"})
    vllm_vision_lora: str = field(default=DEFAULT_MODE, metadata={
        "choices": MODES, "help": "vLLM's mode: native serves the base with the LoRA per image request, "
                                  "merged a merged copy, off the base alone"})
    vllm_serving: str | None = field(default=None, metadata={
        "metavar": "JSON",
        "help": ("vLLM's LoRA arguments as you serve the checkpoint, audited and used, e.g. "
                 '\'{"enable_lora": true, "max_lora_rank": 256, "default_mm_loras": {"image": "DIR"}}\' '
                 "(keys: enable_lora, max_lora_rank, max_loras, default_mm_loras, hf_overrides; "
                 "default: g4v's recipe for --vllm-vision-lora)")})
