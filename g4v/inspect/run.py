"""One deepstack inspection request, end to end: capture, optional ablation, pictures, export.

The CLI (``python -m g4v inspect``) and the app's Deepstack tab both call :func:`run_inspection`.
It runs on the transformers engine (the one whose model can be instrumented) and holds the engine
with adapters disabled for the whole request (``engine.adapter_scope(None)``), so a chat answer
running at the same time never sees the inspector's hooks and the inspector sees the base model.
Exports go to the caller's folder or to an :class:`~g4v.model.exports.ExportStore`.
"""

import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from g4v.conversation import Message, check_continuation_length
from g4v.engines.capabilities import Instrumentable, require
from g4v.errors import G4VError, check_value
from g4v.images import named_size, open_image
from g4v.loading import model_name
from g4v.inspect.ablation import CONTINUATION_TOKENS, AblationResult, RunOutcome, compare_scaled, run_outcome
from g4v.inspect.settings import InspectSettings
from g4v.model.capture import Capture, capture_forward
from g4v.model.exports import ExportStore, default_export_store, draw_in_turn
from g4v.model.levels import Level, describe_levels, level_scales, unit_scale_levels
from g4v.model.records import plain
from g4v.tiling import TilingPlan, plan_tiling

CAPTURE_FILE = "capture.safetensors"
SUMMARY_FILE = "summary.json"
FIGURE_FILES = {  # figure name -> file written in the export
    "norms": "norms.png",
    "trajectory": "trajectory.png",
    "heatmaps_tile": "heatmaps_tiles.png",
    "heatmaps_base": "heatmaps_base.png",
}
EXPORT_FILES = (SUMMARY_FILE, *FIGURE_FILES.values(), CAPTURE_FILE)  # what an export holds (and its zip)
#: Where each stage starts on the progress bar (0-1), after the time each took on the demo checkpoint
#: on a CPU with one level zeroed: the four pictures took four fifths of it.
STAGES = {"capturing": 0.0, "answering": 0.04, "changed levels": 0.09, "drawing": 0.17, "writing the export": 0.96}
#: Each figure's share of the drawing stage (its time there), and what the progress line calls it.
FIGURE_STEPS = {"norms": (0.14, "the norms per level"), "trajectory": (0.18, "the residual norm through the layers"),
                "heatmaps_tile": (0.34, "the tile heatmaps"), "heatmaps_base": (0.34, "the base-view heatmaps")}


@dataclass
class InspectionResult:
    """One inspection: what was asked, what the model did, and where its export lies. The tab, the
    command and the figures read it by attribute; :meth:`to_dict` is ``summary.json``."""

    model: str | None  # the model's name (a local folder's name: no server path in an export)
    prompt: str
    image_size: tuple[int, int]  # (width, height) of the picture as opened
    plan: TilingPlan
    full: bool  # the export keeps the full tensors
    levels: list[Level]
    capture: Capture  # the unmodified run
    outcome: RunOutcome  # its next-token distribution and greedy continuation
    ablation: AblationResult | None  # the run with levels zeroed or scaled, when any were asked for
    unchanged_levels: list[str]  # asked to be scaled by 1: no second run was needed for them
    figures: dict[str, Image.Image] = field(default_factory=dict)  # keys of FIGURE_FILES
    export_dir: Path | None = None  # summary.json, the PNGs, capture.safetensors
    export_zip: Path | None = None  # those files zipped, inside export_dir (make_zip=True)

    def to_dict(self) -> dict:
        """``summary.json``: the request, the tiling, every number the pictures show."""
        plan, capture = self.plan, self.capture
        return {
            "model": self.model,
            "prompt": self.prompt,
            "image_size": named_size(*self.image_size),
            "tiling": {"grid": list(plan.grid), "best_resolution": list(plan.best_resolution),
                       "base_tokens": plan.base_tokens, "tile_tokens": plan.tile_tokens,
                       "newline_tokens": plan.newline_tokens},
            "num_image_tokens": capture.num_image_tokens,
            "num_text_tokens": capture.num_text_tokens,
            "full": self.full,
            "levels": plain(capture.levels),
            "trajectory": capture.trajectory.to_dict(),
            "next_token_top5": plain(self.outcome.top5),
            "continuation": self.outcome.continuation,
            "ablation": plain(self.ablation),
            "unchanged_levels": list(self.unchanged_levels),
            "files": {"summary": SUMMARY_FILE, "capture": CAPTURE_FILE, **FIGURE_FILES},
        }


def run_inspection(engine, image, prompt: str, ablate=(), scale: dict | None = None, full: bool = InspectSettings.full,
                   max_new_tokens: int = CONTINUATION_TOKENS, out_dir: str | Path | None = None,
                   make_zip: bool = True, exports: ExportStore | None = None, progress=None) -> InspectionResult:
    """Inspect what the 8 injections carry for ``image`` (a PIL image or path) and ``prompt``.

    ``ablate``: levels (names or indices) to zero; ``scale``: ``{level: factor}``. Either one adds a
    second run and its comparison (KL of the next-token distribution, top 5, greedy continuation);
    a factor of 1 changes nothing, so it adds no run (the summary lists it in ``unchanged_levels``).
    ``full`` keeps the full tensors in ``capture.safetensors``. The export goes to ``out_dir`` (the
    caller's folder, never deleted) or else to a new folder of ``exports`` (the process's
    :func:`default_export_store` when None). ``progress(fraction, text)`` is called as each stage
    (:data:`STAGES`) starts, when given. Bad input raises :class:`G4VError`.
    """
    tell = progress or (lambda fraction, text: None)
    engine = require(engine, Instrumentable, "the deepstack inspector")
    config, tokenizer = engine.model.config, engine.tokenizer
    levels = describe_levels(config)
    scales = level_scales(levels, ablate, scale)  # checks level names and factors before any compute
    unchanged = unit_scale_levels(levels, ablate, scale)
    if image is None:
        raise G4VError("the deepstack inspector needs an image")
    picture = open_image(image)
    check_value("max_new_tokens", max_new_tokens, check_continuation_length)
    inputs = engine.prepare_inputs([Message("user", prompt, [picture])], max_new_tokens)
    plan = plan_tiling((picture.height, picture.width), config)

    with engine.adapter_scope(None) as model:  # one request at a time, adapters off
        tell(STAGES["capturing"], "capturing the 8 levels")
        capture, logits = capture_forward(model, inputs, full=full, levels=levels, logits_to_keep=1)
        tell(STAGES["answering"], "the next token and the greedy continuation")
        outcome = run_outcome(model, inputs, tokenizer, logits, max_new_tokens)
        ablation = None
        if scales:
            tell(STAGES["changed levels"], "the run with levels zeroed or scaled")
            ablation = compare_scaled(model, inputs, tokenizer, outcome, scales, max_new_tokens,
                                      full=full, levels=levels)
    if plan.num_image_tokens != capture.num_image_tokens:
        raise RuntimeError(f"tiling plan has {plan.num_image_tokens} image tokens, the model saw "
                           f"{capture.num_image_tokens}")

    result = InspectionResult(model_name(engine.info.model) or None, prompt, picture.size, plan, full,
                              levels, capture, outcome, ablation, unchanged)
    result.figures = draw_figures(picture, result, tell)
    tell(STAGES["writing the export"], "writing the export")
    result.export_dir = Path(out_dir) if out_dir is not None else (exports or default_export_store()).new_folder()
    write_export(result)
    result.export_zip = zip_export(result.export_dir) if make_zip else None
    return result


def draw_figures(picture: Image.Image, result: InspectionResult,
                 tell=lambda fraction, text: None) -> dict[str, Image.Image]:
    """The export's pictures, by :data:`FIGURE_FILES` key; ``tell(fraction, text)`` before each
    (they take most of a run on a small model: one "drawing" stage looked stuck)."""
    from viz.deepstack import heatmaps_figure, norms_figure, trajectory_figure

    tokens = [(token.kind, token.box) for token in result.plan.tokens]
    levels = result.capture.levels
    norms = {cap.level.name: cap.injected_norm.tolist() for cap in levels}
    modified = result.ablation.capture.trajectory if result.ablation else None
    drawings = {
        "norms": lambda: norms_figure(levels),
        "trajectory": lambda: trajectory_figure(result.capture.trajectory, modified=modified),
        "heatmaps_tile": lambda: heatmaps_figure(picture, tokens, norms, view="tile",
                                                 title="Injected norm per tile token (high-resolution view)"),
        "heatmaps_base": lambda: heatmaps_figure(picture, tokens, norms, view="base",
                                                 title="Injected norm per base-view token (whole image at one tile)"),
    }
    return draw_in_turn(drawings, FIGURE_STEPS, STAGES["drawing"], STAGES["writing the export"], tell)


def write_export(result: InspectionResult) -> None:
    from safetensors.torch import save_file

    folder = result.export_dir
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SUMMARY_FILE).write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    for name, picture in result.figures.items():
        picture.save(folder / FIGURE_FILES[name])
    tensors = result.capture.tensors()
    if result.ablation is not None:
        tensors.update({f"ablated.{name}": t for name, t in result.ablation.capture.tensors().items()})
    save_file(tensors, str(folder / CAPTURE_FILE), metadata={"format": "pt"})


def zip_export(folder: Path) -> Path:
    """The export's files zipped into ``folder/<folder name>.zip``: inside the folder, so whoever
    deletes the folder deletes the zip too."""
    archive = folder / f"{folder.name}.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        for name in EXPORT_FILES:
            bundle.write(folder / name, arcname=name)
    return archive
