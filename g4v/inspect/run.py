"""One deepstack inspection request, end to end: capture, optional ablation, pictures, export.

The CLI (``python -m g4v inspect``) and the app's Deepstack tab both call :func:`run_inspection`.
It runs on the transformers engine (the one whose model can be instrumented) and holds the engine
with adapters disabled for the whole request (``engine.adapter_scope(None)``), so a chat answer
running at the same time never sees the inspector's hooks and the inspector sees the base model.
Exports go to the caller's folder or to an :class:`~g4v.model.exports.ExportStore`.
"""

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from g4v.conversation import Message, check_continuation_length
from g4v.engines import transformers_engine
from g4v.errors import G4VError, check_value
from g4v.images import named_size, open_image
from g4v.loading import model_name
from g4v.inspect.ablation import CONTINUATION_TOKENS, AblationResult, RunOutcome, compare_scaled, run_outcome
from g4v.inspect.settings import InspectSettings
from g4v.model.capture import Capture, capture_forward
from g4v.model.exports import ExportStore, default_export_store
from g4v.model.levels import Level, describe_levels, level_scales, unit_scale_levels
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


@dataclass
class InspectionResult:
    levels: list[Level]
    capture: Capture  # the unmodified run
    outcome: RunOutcome  # its next-token distribution and greedy continuation
    ablation: AblationResult | None  # the run with levels zeroed or scaled, when any were asked for
    plan: TilingPlan
    figures: dict[str, Image.Image]  # keys of FIGURE_FILES
    summary: dict  # what summary.json holds
    export_dir: Path  # summary.json, the PNGs, capture.safetensors
    export_zip: Path | None  # those files zipped, inside export_dir (make_zip=True)


def run_inspection(engine, image, prompt: str, ablate=(), scale: dict | None = None, full: bool = InspectSettings.full,
                   max_new_tokens: int = CONTINUATION_TOKENS, out_dir: str | Path | None = None,
                   make_zip: bool = True, exports: ExportStore | None = None) -> InspectionResult:
    """Inspect what the 8 injections carry for ``image`` (a PIL image or path) and ``prompt``.

    ``ablate``: levels (names or indices) to zero; ``scale``: ``{level: factor}``. Either one adds a
    second run and its comparison (KL of the next-token distribution, top 5, greedy continuation);
    a factor of 1 changes nothing, so it adds no run (the summary lists it in ``unchanged_levels``).
    ``full`` keeps the full tensors in ``capture.safetensors``. The export goes to ``out_dir`` (the
    caller's folder, never deleted) or else to a new folder of ``exports`` (the process's
    :func:`default_export_store` when None). Bad input raises :class:`G4VError`.
    """
    engine = transformers_engine(engine, "the deepstack inspector")
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
        capture, logits = capture_forward(model, inputs, full=full, levels=levels, logits_to_keep=1)
        outcome = run_outcome(model, inputs, tokenizer, logits, max_new_tokens)
        ablation = None
        if scales:
            ablation = compare_scaled(model, inputs, tokenizer, outcome, scales, max_new_tokens,
                                      full=full, levels=levels)
    if plan.num_image_tokens != capture.num_image_tokens:
        raise RuntimeError(f"tiling plan has {plan.num_image_tokens} image tokens, the model saw "
                           f"{capture.num_image_tokens}")

    summary = build_summary(engine, prompt, picture, plan, capture, outcome, ablation, full, unchanged)
    figures = draw_figures(picture, plan, summary, capture)
    export_dir = Path(out_dir) if out_dir is not None else (exports or default_export_store()).new_folder()
    write_export(export_dir, summary, figures, capture, ablation)
    export_zip = zip_export(export_dir) if make_zip else None
    return InspectionResult(levels, capture, outcome, ablation, plan, figures, summary, export_dir, export_zip)


def build_summary(engine, prompt: str, picture: Image.Image, plan: TilingPlan, capture: Capture,
                  outcome: RunOutcome, ablation: AblationResult | None, full: bool,
                  unchanged_levels: list[str] = ()) -> dict:
    info = getattr(engine, "info", None)
    return {
        "model": model_name(getattr(info, "model", None)) or None,  # no server path in an export
        "prompt": prompt,
        "image_size": named_size(picture.width, picture.height),
        "tiling": {"grid": list(plan.grid), "best_resolution": list(plan.best_resolution),
                   "base_tokens": plan.base_tokens, "tile_tokens": plan.tile_tokens,
                   "newline_tokens": plan.newline_tokens},
        "num_image_tokens": capture.num_image_tokens,
        "num_text_tokens": capture.num_text_tokens,
        "full": full,
        "levels": [cap.to_dict() for cap in capture.levels],
        "trajectory": capture.trajectory.to_dict(),
        "next_token_top5": [vars(t) for t in outcome.top5],
        "continuation": outcome.continuation,
        "ablation": ablation.to_dict() if ablation else None,
        "unchanged_levels": list(unchanged_levels),  # asked to be scaled by 1: no run was needed
        "files": {"summary": SUMMARY_FILE, "capture": CAPTURE_FILE, **FIGURE_FILES},
    }


def draw_figures(picture: Image.Image, plan: TilingPlan, summary: dict, capture: Capture) -> dict[str, Image.Image]:
    from viz.deepstack import heatmaps_figure, norms_figure, trajectory_figure

    tokens = [(token.kind, token.box) for token in plan.tokens]
    norms = {cap.level.name: cap.injected_norm.tolist() for cap in capture.levels}
    modified = summary["ablation"]
    return {
        "norms": norms_figure(summary["levels"]),
        "trajectory": trajectory_figure(summary["trajectory"],
                                        modified=_trajectory_of(modified) if modified else None),
        "heatmaps_tile": heatmaps_figure(picture, tokens, norms, view="tile",
                                         title="Injected norm per tile token (high-resolution view)"),
        "heatmaps_base": heatmaps_figure(picture, tokens, norms, view="base",
                                         title="Injected norm per base-view token (whole image at one tile)"),
    }


def _trajectory_of(ablation_summary: dict) -> dict:
    return ablation_summary["trajectory_after"]


def write_export(folder: Path, summary: dict, figures: dict[str, Image.Image], capture: Capture,
                 ablation: AblationResult | None) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    for name, picture in figures.items():
        picture.save(folder / FIGURE_FILES[name])
    tensors = capture.tensors()
    if ablation is not None:
        tensors.update({f"ablated.{name}": t for name, t in ablation.capture.tensors().items()})
    save_file(tensors, str(folder / CAPTURE_FILE), metadata={"format": "pt"})


def zip_export(folder: Path) -> Path:
    """The export's files zipped into ``folder/<folder name>.zip``: inside the folder, so whoever
    deletes the folder deletes the zip too."""
    archive = folder / f"{folder.name}.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        for name in EXPORT_FILES:
            bundle.write(folder / name, arcname=name)
    return archive
