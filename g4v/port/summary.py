"""A port comparison's result, typed: :class:`PortDiffSummary`, whose parts are computed (and
declared) where they are compared (:mod:`g4v.port.compare`, :mod:`g4v.port.audit`,
:mod:`g4v.port.lora_audit`).

``port-diff --json`` prints :meth:`PortDiffSummary.to_dict`; the app's Port tab runs ``port-diff``
in the vLLM environment's own process and reads that JSON back with
:meth:`~g4v.model.records.Record.from_dict`. The report (``g4v.commands.port_diff``), the table
(:mod:`g4v.port.table`), the tab and the picture (``viz.port``) read it by attribute. A field
declared with :func:`~g4v.model.records.optional` is a key only some summaries carry: a run whose
checkpoint did not load has no dtype and no token counts, but a load error.
"""

from dataclasses import dataclass, field

from g4v.model.records import Record, optional
from g4v.port.audit import ConfigAudit
from g4v.port.compare import LevelDiff, NextTokenDiff, Tolerance, TrajectoryDiff
from g4v.port.lora_audit import VisionLoraSummary


@dataclass(kw_only=True)
class PortDiffSummary(Record):
    """One comparison of vLLM's port with transformers: what ``port-diff --json`` prints."""

    model: str  # as given (a server path; the tab shows a folder's name)
    prompt: str
    image_size: dict[str, int]  # g4v.images.named_size
    dtype: str | None = optional()  # this one and the token counts: only when the checkpoint loaded
    tolerance: Tolerance | None = None
    num_image_tokens: int | None = optional()
    num_text_tokens: int | None = optional()
    vllm_error: str | None = None  # why vLLM did not start (the audit is still there)
    load_error: str | None = optional()  # why transformers could not load the checkpoint
    vision_lora: VisionLoraSummary | None = optional()
    levels: list[LevelDiff] = field(default_factory=list)
    trajectory: TrajectoryDiff | None = None
    next_token: NextTokenDiff | None = None
    config_audit: ConfigAudit | None = None
    ok: bool = False
    message: str = ""
