"""One attribution request, end to end: answer, attribution, deletion test, logit lens, pictures, export.

The CLI (``python -m g4v attribute``) and the app's Attribution tab both call :func:`run_attribution`.
It needs the transformers engine (whose model this process holds and can differentiate) and holds
it with adapters off for the whole request (``engine.adapter_scope(None)``).
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image

from g4v.attribution.deletion import DeletionCurve, deletion_curve
from g4v.attribution.forward import Answer, answer_ids, encode_image, make_answer
from g4v.attribution.gradients import Attribution, attribute
from g4v.attribution.lens import LensView, LogitLens, logit_lens
from g4v.attribution.regions import region_scores
from g4v.attribution.settings import MAX_ANSWER_TOKENS, AttributionSettings
from g4v.conversation import Message
from g4v.engines.capabilities import Instrumentable, require
from g4v.errors import G4VError, quoted
from g4v.images import named_size, open_image
from g4v.loading import model_name
from g4v.model.scoring import greedy_continuation
from g4v.model.exports import ExportStore, default_export_store, draw_in_turn
from g4v.model.levels import describe_levels, find_level
from g4v.model.records import Record, plain
from g4v.tiling import TilingPlan, plan_tiling

SUMMARY_FILE = "summary.json"
TENSORS_FILE = "attribution.safetensors"
FIGURE_FILES = {"tile": "attribution_tiles.png", "base": "attribution_base.png",
                "deletion": "deletion.png", "lens": "lens.png", "lens_levels": "lens_levels.png"}
LENS_LAYERS_SHOWN = 4  # lens panels drawn: evenly spaced residual-stream points, the last included
REGION_PANEL = "both views"  # the tile figure's panel of region scores (g4v.attribution.regions)
#: Where each stage starts on the progress bar (0-1), after the time each took on the demo checkpoints
#: on a CPU, in process and in the app (gradient x input, the lens on; 3-6 s a run): drawing the five
#: pictures takes four fifths of it, so a bar that gave drawing its last third said "about 1 s left"
#: for most of the run.
STAGES = {"answering": 0.0, "encoding the image": 0.04, "attributing": 0.05, "deletion test": 0.06,
          "logit lens": 0.14, "drawing": 0.18, "writing the export": 0.96}
#: Each figure's share of the drawing stage, and what the progress line calls it.
FIGURE_STEPS = {"tile": (0.3, "the tile map"), "base": (0.22, "the base-view map"),
                "deletion": (0.05, "the deletion curve"), "lens": (0.2, "the logit lens"),
                "lens_levels": (0.23, "the levels' logit lens")}


@dataclass
class TopToken(Record):
    """The image token with the highest score: its index and its box on the original image."""

    index: int
    box: list[float]
    score: float


@dataclass
class AttributionReport:
    """One explanation: what was asked, the answer, the attribution, the deletion test, the lens,
    and where the export lies. The tab, the command and the figures read it by attribute;
    :meth:`to_dict` is ``summary.json``."""

    model: str | None  # the model's name (a local folder's name: no server path in an export)
    prompt: str
    image_size: tuple[int, int]  # (width, height) of the picture as opened
    teacher_forced: bool  # the answer was given (``--target``), not the model's own
    answer: Answer
    attribution: Attribution
    deletion: DeletionCurve
    lens: LogitLens | None
    plan: TilingPlan
    top_tile_token: TopToken | None  # by its own combined score
    top_region_token: TopToken | None  # by its region's score (both views on the same pixels)
    figures: dict[str, Image.Image] = field(default_factory=dict)  # keys of FIGURE_FILES
    export_dir: Path | None = None
    files: list[Path] = field(default_factory=list)

    def to_dict(self) -> dict:
        """``summary.json``: what was explained and every number the pictures show; ``files`` names
        the files the export holds (the figures drawn, no others)."""
        answer = self.answer
        return {
            "model": self.model,
            "prompt": self.prompt,
            "image_size": named_size(*self.image_size),
            "num_image_tokens": self.plan.num_image_tokens,
            "answer": {"tokens": answer.texts, "ids": answer.ids, "target": answer.target,
                       "against": answer.alternative_texts,
                       "explained": answer.describe(), "teacher_forced": self.teacher_forced},
            "attribution": self.attribution.to_dict(answer.measure),
            "top_tile_token": plain(self.top_tile_token),
            "top_region_token": plain(self.top_region_token),
            "deletion": self.deletion.to_dict(),
            "lens": plain(self.lens),
            "files": {"summary": SUMMARY_FILE, "tensors": TENSORS_FILE,
                      **{name: FIGURE_FILES[name] for name in self.figures}},
        }


def run_attribution(engine, image, prompt: str, settings: AttributionSettings | None = None,
                    out_dir: str | Path | None = None, exports: ExportStore | None = None,
                    progress=None) -> AttributionReport:
    """Explain one answer token (or the whole answer) to ``prompt`` about ``image``.

    ``progress(fraction, text)`` is called between stages when given. The export goes to ``out_dir``
    (never deleted) or to a new folder of ``exports``. Bad input raises :class:`G4VError`."""
    settings = (settings or AttributionSettings()).checked()
    engine = require(engine, Instrumentable, "attribution")
    tell = progress or (lambda fraction, text: None)
    if image is None:
        raise G4VError("attribution needs an image")
    if not isinstance(prompt, str) or not prompt.strip():
        raise G4VError("the prompt is empty")
    picture = open_image(image)
    config, tokenizer = engine.model.config, engine.tokenizer
    levels = describe_levels(config)
    deletion_level = None if settings.deletion_level in (None, "") else find_level(levels, settings.deletion_level).name
    target_ids = answer_ids(tokenizer, settings.target) if settings.target is not None else None
    inputs = engine.prepare_inputs([Message("user", prompt, [picture])])
    check_answer_fits(engine, inputs, target_ids, settings)
    plan = plan_tiling((picture.height, picture.width), config)

    with engine.adapter_scope(None) as model:
        tell(STAGES["answering"], "answering")
        ids = target_ids or greedy_continuation(model, inputs, tokenizer, settings.max_new_tokens)
        answer = make_answer(tokenizer, inputs["input_ids"], ids or [tokenizer.eos_token_id], settings.token,
                             tuple(settings.against))
        tell(STAGES["encoding the image"], "encoding the image")
        encoded = encode_image(model, inputs)
        if encoded.num_image_tokens != plan.num_image_tokens:
            raise RuntimeError(f"tiling plan has {plan.num_image_tokens} image tokens, the model "
                               f"{encoded.num_image_tokens}")
        tell(STAGES["attributing"], f"attributing ({settings.method})")
        attribution = attribute(model, encoded, answer, levels, settings.method, settings.steps)
        tell(STAGES["deletion test"], "deletion test")
        deletion = deletion_curve(model, encoded, answer, attribution, deletion_level, settings.fractions,
                                  settings.seeds, ranking=settings.deletion_ranking)
        lens = None
        if settings.lens:
            tell(STAGES["logit lens"], "logit lens")
            lens = logit_lens(model, inputs, tokenizer, levels)
    report = AttributionReport(model_name(engine.info.model) or None, prompt, picture.size,
                               settings.target is not None, answer, attribution, deletion, lens, plan,
                               top_token(plan, attribution.combined, "tile"),
                               top_token(plan, region_scores(plan, attribution.combined), "tile"))
    report.figures = draw_figures(picture, report, tell)
    tell(STAGES["writing the export"], "writing the export")
    folder = Path(out_dir) if out_dir is not None else (exports or default_export_store()).new_folder()
    report.export_dir, report.files = folder, write_export(folder, report)
    return report


def check_answer_fits(engine, inputs: dict, target_ids: list[int] | None, settings: AttributionSettings) -> None:
    """Refuse, in one line, an answer to explain (the target, the greedy answer's length, each
    answer to contrast with) longer than :data:`MAX_ANSWER_TOKENS` or past the context window after
    the prompt and its image tokens."""
    lengths = {"the answer to explain": len(target_ids) if target_ids is not None else settings.max_new_tokens}
    for text in settings.against:
        lengths[f"the answer to contrast with {quoted(text)}"] = len(answer_ids(engine.tokenizer, text))
    what, longest = max(lengths.items(), key=lambda item: item[1])
    if longest > MAX_ANSWER_TOKENS:
        raise G4VError(f"{what} is too long: {longest} tokens, the limit is {MAX_ANSWER_TOKENS}")
    prompt_tokens, window = inputs["input_ids"].shape[1], engine.context_window()
    if prompt_tokens + longest > window:
        raise G4VError(f"the prompt ({prompt_tokens} tokens with the image) and {what} ({longest} tokens) "
                       f"do not fit the model's context window of {window} tokens")


def top_token(plan: TilingPlan, scores: torch.Tensor, kind: str) -> TopToken | None:
    """The ``kind`` token with the highest score: its index and its box on the original image."""
    candidates = [t for t in plan.tokens if t.kind == kind and t.box[2] > t.box[0] and t.box[3] > t.box[1]]
    if not candidates:
        return None
    best = max(candidates, key=lambda t: float(scores[t.index]))
    return TopToken(best.index, list(best.box), float(scores[best.index]))


def lens_views_shown(lens: LogitLens) -> list[LensView]:
    """A few evenly spaced residual-stream points (first and last included) for the lens picture."""
    count = len(lens.layers)
    picks = sorted({round(i * (count - 1) / (LENS_LAYERS_SHOWN - 1)) for i in range(LENS_LAYERS_SHOWN)})
    return [lens.layers[i] for i in picks]


def draw_figures(picture, report: AttributionReport, tell=lambda fraction, text: None) -> dict[str, Image.Image]:
    """The export's pictures; ``tell(fraction, text)`` before each (drawing takes seconds: a bar that
    sat at "drawing" for all of them looked stuck)."""
    from viz.attribution import attribution_figure, deletion_figure, lens_figure

    plan, attribution, lens = report.plan, report.attribution, report.lens
    tokens = [(t.kind, t.box) for t in plan.tokens]
    scores = attribution.by_level()
    tile_scores = {**scores, REGION_PANEL: region_scores(plan, attribution.combined).tolist()}
    drawings = {
        "tile": lambda: attribution_figure(picture, tokens, tile_scores, "tile",
                                           f"Attribution per tile token (high-resolution view; '{REGION_PANEL}': "
                                           "with the base view's share of each tile token's region)"),
        "base": lambda: attribution_figure(picture, tokens, scores, "base", "Attribution per base-view token"),
        "deletion": lambda: deletion_figure(report.deletion, measure=report.answer.measure),
    }
    if lens is not None:
        drawings["lens"] = lambda: lens_figure(picture, tokens, lens_views_shown(lens), lens.vocabulary)
        drawings["lens_levels"] = lambda: lens_figure(picture, tokens, lens.levels, lens.vocabulary,
                                                      title="Logit lens on each level's injected features")
    return draw_in_turn(drawings, FIGURE_STEPS, STAGES["drawing"], STAGES["writing the export"], tell)


def write_export(folder: Path, report: AttributionReport) -> list[Path]:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / SUMMARY_FILE]
    written[0].write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    for name, figure in report.figures.items():
        figure.save(folder / FIGURE_FILES[name])
        written.append(folder / FIGURE_FILES[name])
    tensors = {"scores": report.attribution.scores, "combined": report.attribution.combined,
               "deletion.attributed": torch.tensor(report.deletion.attributed),
               "deletion.random": torch.tensor(report.deletion.random)}
    if report.lens is not None:
        tensors["lens.layers.top_ids"] = torch.tensor([v.top_ids for v in report.lens.layers])
        tensors["lens.levels.top_ids"] = torch.tensor([v.top_ids for v in report.lens.levels])
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / TENSORS_FILE),
              metadata={"levels": ",".join(lv.name for lv in report.attribution.levels)})
    written.append(folder / TENSORS_FILE)
    return written
