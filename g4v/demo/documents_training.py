"""The demo checkpoint's document stages: ``python -m g4v.demo train-documents`` (issue 21).

Continues from the trained checkpoint (``--init``, the first stage's output), or from a checkpoint
this command wrote (a later stage, with other shares and rate), and trains every weight on a mix of
steps, each of one task and one canvas kind (so a batch pads little: a key-value prompt is far
longer than a shape question):

* chart to CSV (:mod:`g4v.demo.charts`, the ``<chart2csv>`` preset);
* key-value extraction on shape pictures (the key-value preset with
  :data:`g4v.demo.documents_data.KVP_SCHEMA`);
* the first stage's shape conversations (:mod:`g4v.demo.data`), so that colour, shape, position and
  count keep their accuracy while the new tasks are learnt.

One training aid, the first stage's attention pointers without their readouts (no fresh heads to
pull the weights the first stage settled: the pointer loss only trains the attention that is
already there, see :class:`g4v.demo.aids.AttentionPointer`). On chart and key-value steps, the
first pointer's head looks, from every position that predicts a token of one CSV row or one
shape's JSON object, at that bar or shape: the answer goes through the objects one by one, and
this is the lookup that says which one comes next. On shape steps the three pointers keep the
first stage's lookups. A lower learning rate than the first stage's, and the vision tower lower
still, so that what the first stage learnt is kept. Deterministic for a given seed, step count and
thread count; ``g4v_build.json`` records the command, settings, data, the first stage's own
provenance (``init``), the validation curve and the weights' SHA-256.
"""

import json
import random
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

import torch

from g4v.demo import documents_data as D
from g4v.demo import shapes as S
from g4v.demo.charts import train_chart
from g4v.demo.data import conversation_plan, encode
from g4v.demo.data import data_settings as shapes_data_settings
from g4v.demo.loop import make_pointers, parameter_groups, update, validation_accuracy
from g4v.demo.progress import no_dropout, progress_bar
from g4v.demo.recipe import DocumentsSettings, TrainSettings
from g4v.errors import G4VError, quoted
from g4v.paths import REPO_ROOT

TASKS = ("shapes", "chart", "kvp")


def step_task(settings: DocumentsSettings, rng: random.Random) -> str:
    """The task of one step, drawn by the settings' shares."""
    shapes = max(0.0, 1.0 - settings.chart_share - settings.kvp_share)
    return rng.choices(TASKS, weights=[shapes, settings.chart_share, settings.kvp_share])[0]


def step_batch(settings: DocumentsSettings, rng: random.Random, task: str, index: int) -> tuple[list, list, list, int]:
    """One step's pictures and conversations (one task, one canvas kind), from example ``index`` on;
    returns (pictures or document items, turns, the shape conversations' plans, next index)."""
    canvas = S.canvas_kind(rng)
    three = settings.three_shape_share or None
    pictures, turns, plans = [], [], []
    for k in range(index, index + settings.batch_size):
        if task == "chart":
            item = D.chart_item(train_chart(settings.seed, k, canvas=canvas))
            pictures.append(item)
            turns.append([(item.qa.question, item.qa.answer)])
        elif task == "kvp":
            item = D.kvp_item(S.picture(f"docs:{settings.seed}:{k}", canvas=canvas, max_shapes_p=three))
            pictures.append(item)
            turns.append([(item.qa.question, item.qa.answer)])
        else:
            picture = S.picture(f"docs-shapes:{settings.seed}:{k}", canvas=canvas, max_shapes_p=three)
            plan = conversation_plan(picture, rng, settings.max_turns, settings.shape_share)
            pictures.append(picture)
            turns.append([(qa.question, qa.answer) for qa, _ in plan])
            plans.append(plan)
    return pictures, turns, plans, index + settings.batch_size


def load_init(settings: DocumentsSettings):
    """The checkpoint this stage starts from (float32, dropout off) and its processor."""
    from transformers import AutoProcessor, Granite4VisionForConditionalGeneration

    init = _resolve(settings.init)
    processor = AutoProcessor.from_pretrained(init)
    model = Granite4VisionForConditionalGeneration.from_pretrained(init, dtype=torch.float32)
    return model, processor


def check_settings(settings: DocumentsSettings) -> None:
    """Refuse, in one line and before anything loads, task shares that are no shares and an
    ``init`` that is not a trained checkpoint (it needs the provenance it is recorded with)."""
    shares = (settings.chart_share, settings.kvp_share)
    if not all(0.0 <= share <= 1.0 for share in shares) or sum(shares) > 1.0:
        raise G4VError(f"--chart-share and --kvp-share must lie in 0-1 and add up to at most 1, got {shares}")
    if not (_resolve(settings.init) / "g4v_build.json").is_file():
        raise G4VError(f"--init {quoted(settings.init, 80)} is not a trained demo checkpoint (no g4v_build.json)")


def _resolve(path: str) -> Path:
    """A relative ``init`` is read from the repository root (the default names the bundled folder)."""
    folder = Path(path)
    return folder if folder.is_absolute() or folder.exists() else REPO_ROOT / folder


def validation_scores(model, processor, n: int) -> dict[str, float]:
    """Greedy validation accuracy on the shape questions and the document scores (model left training)."""
    from g4v.demo.documents_eval import batched, score
    from g4v.engines.hf import TransformersEngine

    shapes = validation_accuracy(model, processor, n)
    items = D.validation_items(n)
    model.eval()
    try:
        documents = score(items, batched(TransformersEngine.around(model, processor), items, batch_size=32))
    finally:
        model.train()
    return {**shapes, **{name: getattr(documents, name) for name in ("chart_exact", "chart_cells", "kvp_valid",
                                                                     "kvp_fields")}}


def train_documents_model(settings: DocumentsSettings, progress: bool = True, log_every: int = 25):
    """Train one document stage; returns (model, processor, stats)."""
    torch.set_num_threads(settings.threads)
    torch.use_deterministic_algorithms(True, warn_only=settings.device != "cpu")
    model, processor = load_init(settings)
    torch.manual_seed(settings.seed)
    model.to(settings.device)
    model.train()
    no_dropout(model)
    optimizer = torch.optim.AdamW(parameter_groups(list(model.named_parameters()), settings), lr=settings.lr,
                                  betas=(0.9, 0.98), eps=1e-8)
    rng = random.Random(f"documents:{settings.seed}")
    pointers = first_stage_pointers(model, _resolve(settings.init)) if settings.pointer_weight > 0 else []
    bar = progress_bar(settings.steps, "train-documents") if progress else None
    started, index = time.time(), 0
    history: dict[str, list[float]] = {task: [] for task in TASKS + ("pointer",)}
    curve, tasks_seen = [], {task: 0 for task in TASKS}
    try:
        for step in range(settings.steps):
            task = step_task(settings, rng)
            pictures, turns, plans, index = step_batch(settings, rng, task, index)
            tasks_seen[task] += 1
            batch = {k: v.to(settings.device) for k, v in encode(processor, pictures, turns).items()}
            loss = model(**batch).loss
            history[task].append(loss.item())
            if pointers:
                pointing = pointer_loss(pointers, task, batch, pictures, plans, processor.tokenizer)
                history["pointer"].append(pointing.item())
                loss = loss + settings.pointer_weight * pointing
            update(optimizer, loss, step, settings)
            if bar is not None:
                bar.update(1)
                bar.set_postfix({t: f"{_recent(v):.3f}" for t, v in history.items() if v}, refresh=False)
            if log_every and (step + 1) % log_every == 0:
                print(f"step {step + 1}/{settings.steps} " + " ".join(f"{t} {_recent(v):.4f}" for t, v in history.items()
                                                                     if v)
                      + f" elapsed {time.time() - started:.0f}s", flush=True)
            if settings.eval_every and ((step + 1) % settings.eval_every == 0 or step + 1 == settings.steps):
                curve.append({"step": step + 1, **validation_scores(model, processor, settings.eval_n)})
                print(f"step {step + 1} validation " + " ".join(f"{k} {100 * v:.0f}%" for k, v in curve[-1].items()
                                                                 if k != "step"), flush=True)
    finally:
        for pointer in pointers:
            pointer.remove()
    if bar is not None:
        bar.close()
    model.eval()
    model.to("cpu")
    stats = {"wall_time_s": round(time.time() - started, 1), "steps_per_task": tasks_seen,
             "final_loss": {t: round(_recent(v), 4) for t, v in history.items() if v}, "examples_seen": index}
    if curve:
        stats["validation_curve"] = curve
    return model, processor, stats


def first_stage_pointers(model, init: Path) -> list:
    """The first stage's attention pointers, at the layers and heads its recipe (stored beside
    ``init``) put them, without readouts: no fresh heads to pull the settled weights. ``init`` may
    itself be a documents stage (:func:`stages` finds the first)."""
    stored = stages(json.loads((init / "g4v_build.json").read_text()))[-1]["settings"]
    known = {field.name for field in fields(TrainSettings)}
    recipe = TrainSettings(**{name: value for name, value in stored.items() if name in known})
    return make_pointers(model, replace(recipe, readout_weight=0.0))


def stages(provenance: dict) -> list[dict]:
    """A checkpoint's training stages, its own first: each stage's provenance nests the one it
    started from under ``init``, down to the first stage (trained from scratch: no ``init``)."""
    chain = [provenance]
    while isinstance(chain[-1].get("init"), dict):
        chain.append(chain[-1]["init"])
    return chain


def pointer_loss(pointers: list, task: str, batch: dict, pictures: list, plans: list, tokenizer) -> torch.Tensor:
    """Shape steps: the sum of the first stage's pointer losses. Document steps: the first
    pointer's, from each CSV row or JSON object to its bar or shape."""
    if task == "shapes":
        return sum(pointer.losses(batch, pictures, plans)["pointer"] for pointer in pointers)
    return pointers[0].segment_losses(batch, pictures, tokenizer)["pointer"]


def _recent(values: list[float], window: int = 20) -> float:
    recent = values[-window:]
    return sum(recent) / max(1, len(recent))


def train_documents(out: Path, settings: DocumentsSettings, command: str, progress: bool = True) -> str:
    """Train one document stage and save it with its provenance in ``out``; returns the weights' SHA-256."""
    from g4v.demo.build import build_processor, save_checkpoint
    from g4v.demo.loop import drop_subconfig_dtypes

    check_settings(settings)
    init = json.loads((_resolve(settings.init) / "g4v_build.json").read_text())  # before ``out`` may replace it
    model, _, stats = train_documents_model(settings, progress=progress)
    provenance = {
        "builder": command,
        "weights": "the checkpoint in 'init', trained further on charts to CSV, key-value extraction and shapes",
        "seed": settings.seed,
        "settings": asdict(settings),
        "data": {"shapes": shapes_data_settings(), **D.data_settings()},
        "torch": torch.__version__,
        **stats,
        "init": init,
        "total_wall_time_s": round(stats["wall_time_s"] + sum(stage["wall_time_s"] for stage in stages(init)), 1),
    }
    # A fresh processor: padded calls leave padding switched on in the fast tokenizer's backend.
    sha = save_checkpoint(model, build_processor(), Path(out), provenance)
    drop_subconfig_dtypes(Path(out) / "config.json")
    return sha
