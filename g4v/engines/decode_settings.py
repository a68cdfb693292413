"""How the transformers engine decodes chats: the one place these settings and their defaults live.

The app's and every command's flags derive from :class:`DecodeSettings`
(``g4v.settings.flags``); no torch here, so ``--help`` builds without it.
"""

from dataclasses import dataclass, field

from g4v.errors import check_fields, whole_number

#: ``auto``: on where it pays (see each field); ``on`` / ``off``: as said.
SWITCH = ("auto", "on", "off")


def _check_switch(value) -> None:
    if value not in SWITCH:
        raise ValueError(f"must be one of {', '.join(SWITCH)}, got {value!r}")


@dataclass(frozen=True)
class DecodeSettings:
    """The transformers engine's chat decoding (:mod:`g4v.engines.decode_loop`)."""

    decode_loop: bool = field(default=True, metadata={
        "help": "answer chats in one continuous batch, several visitors at once, with a KV cache of fixed "
                "slots; --no-decode-loop answers one request at a time through transformers' generate "
                "(the reference path)"})
    max_batch: int = field(default=8, metadata={
        "check": whole_number(1, 64), "metavar": "N",
        "help": "chats decoded together at most; more wait for a free slot"})
    compile_decode: str = field(default="auto", metadata={
        "check": _check_switch, "choices": SWITCH,
        "help": "compile the decode step (torch.compile, CUDA graphs on a GPU); auto: on a GPU only (on a "
                "CPU the first request's compile costs more than it saves on the bundled checkpoints)"})
    vision_copy: str = field(default="auto", metadata={
        "check": _check_switch, "choices": SWITCH,
        "help": "with a checkpoint's vision LoRA in native mode, keep a copy of the language model with "
                "the LoRA merged for image requests (no LoRA layers on the hot path; costs the LoRA'd "
                "weights once more); auto: when that fits in free memory"})

    def __post_init__(self):
        check_fields(self)

    def compiles(self, device) -> bool:
        """Whether the decode step is compiled on ``device`` (a ``torch.device``)."""
        return self.compile_decode == "on" or (self.compile_decode == "auto" and device.type == "cuda")
