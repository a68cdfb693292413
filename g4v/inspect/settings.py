"""What a deepstack inspection is asked: :class:`InspectSettings`, the one place for its defaults.

``python -m g4v inspect`` derives its ``--ablate``, ``--scale``, ``--full`` and ``--max-new-tokens``
flags from the fields (:mod:`g4v.settings.flags`), the Deepstack tab starts its widgets at
them, and :func:`g4v.inspect.run.run_inspection`'s defaults are theirs: a default changed here
changes all three. No torch here, so the command's flags cost no import.
"""

from dataclasses import dataclass, field

from g4v.conversation import check_continuation_length
from g4v.model.levels import parse_scale_specs


@dataclass(frozen=True)
class InspectSettings:
    """Which levels a second run zeroes or scales, whether the export keeps full tensors, and how
    long the greedy continuations before and after are. ``scale`` holds ``LEVEL=F`` specs as typed
    (the command's values, the tab's comma-separated box); :meth:`scales` reads them."""

    ablate: list[str] = field(default_factory=list, metadata={
        "nargs": "+", "metavar": "LEVEL",
        "help": "zero these levels (name such as deepstack0 or spatial_TL, or index 0-7)"})
    scale: list[str] = field(default_factory=list, metadata={
        "nargs": "+", "metavar": "LEVEL=F", "help": "multiply a level's features by F"})
    full: bool = field(default=False, metadata={"flag": "--full", "help": "keep full tensors in capture.safetensors"})
    max_new_tokens: int = field(default=16, metadata={
        "check": check_continuation_length, "help": "greedy continuation length (0: none)"})

    def scales(self) -> dict[str, float]:
        """``{level: factor}`` from :attr:`scale` (level names are checked against the model later);
        a spec that is not ``LEVEL=F`` is one line."""
        return parse_scale_specs(self.scale)
