"""Train the bundled tiny Granite 4 Vision from scratch on synthetic shapes: ``python -m g4v.demo train``.

``python -m g4v.demo train [--steps N] [--out DIR] [--seed S]`` starts from the same seeded random
initialisation as ``python -m g4v.demo build`` (same config, processor and tokenizer) and trains every
weight on pictures from :mod:`g4v.demo.shapes`, on the CPU, deterministically for a given seed, step
count and thread count. The result is saved in the hub layout (bf16) with a ``g4v_build.json`` that
records the command, seed, data settings, steps, wall time and the weights' SHA-256.

The settings are :class:`g4v.demo.recipe.TrainSettings`, the examples :mod:`g4v.demo.data`, the
extra losses :mod:`g4v.demo.aids`. What makes the tiny model learn within issue 5's 30 CPU minutes
(each point was needed; docs/demo-model.md has what failed without it), besides the examples'
format and the aids:

* **a vision tower that tells shapes apart first** (:func:`warm_up_vision`): cheap steps on base
  views alone, training the tower to name each shape, then the joint training with the tower at
  its own, lower learning rate (``vision_lr``). At the shared learning rate the tiny ViT learns
  colour and place but never tells a star from a circle, and every question that names a shape
  needs that;
* **more three-shape pictures** after the curriculum (``three_shape_share``): binding and counting
  only go wrong with several shapes, and such a picture asks up to 7 questions per vision pass;
* **sharper attention at the start** (``qk_scale``): Granite's ``attention_multiplier`` of 1/64
  keeps a fresh small model's attention almost uniform; the q/k weights are scaled once, at init;
* small canvases (mostly 1 tile + the base view), one canvas kind per batch (little padding), AdamW
  with warm-up and cosine decay, no dropout while training, and a short curriculum that starts with
  more one-shape pictures.
"""

import json
import random
import time
from dataclasses import asdict
from pathlib import Path

import torch

from g4v.demo import shapes as S
from g4v.demo.aids import AttentionPointer, FeatureProbe, object_shape_logits
from g4v.demo.answering import accuracy, batched_answers, items
from g4v.demo.data import conversation_plan, data_settings, encode
from g4v.demo.progress import no_dropout, progress_bar, tick
from g4v.demo.recipe import TrainSettings, lr_at
from g4v.model.levels import describe_levels
from g4v.model.sites import site, site_names
from g4v.training.log_file import LOG_FILE, write_log
from g4v.training.settings import MonitorSettings


def make_pointers(model, settings: TrainSettings) -> list[AttentionPointer]:
    """The attention pointers the settings ask for: none (``pointer_weight`` 0), the pointer for
    every question that names a shape, and optionally a second one for shape questions only."""
    if settings.pointer_weight <= 0:
        return []
    readout = settings.readout_weight > 0
    pointers = [AttentionPointer(model, settings.pointer_layer, readout=readout)]
    if settings.shape_pointer_layer is not None:
        pointers.append(AttentionPointer(model, settings.shape_pointer_layer, head=settings.shape_pointer_head,
                                         readout=readout, kinds=frozenset({"shape"})))
    if settings.count_pointer_layer is not None:
        pointers.append(AttentionPointer(model, settings.count_pointer_layer, head=settings.count_pointer_head,
                                         kinds=frozenset({"count"})))
    return pointers


def update(optimizer, loss: torch.Tensor, step: int, settings, monitor=None) -> None:
    """One AdamW step on ``loss`` at :func:`lr_at`'s rate for ``step`` (times each group's
    ``lr_scale``), gradients clipped to ``settings.grad_clip``; ``monitor`` (a
    :class:`g4v.training.monitor.DeepstackMonitor`) reads the clipped gradients before the step."""
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step, settings) * group.get("lr_scale", 1.0)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for group in optimizer.param_groups for p in group["params"]], settings.grad_clip)
    if monitor is not None:
        monitor.gradients_ready()
    optimizer.step()


def parameter_groups(named: list, settings: TrainSettings) -> list[dict]:
    """AdamW groups: weight decay on matrices only; with ``vision_lr``, the vision tower apart (its
    ``lr_scale`` is vision_lr / lr, applied on top of the schedule)."""
    def is_matrix(name, param):
        return param.ndim >= 2 and "embed" not in name

    if settings.vision_lr is None:
        return [{"params": [p for n, p in named if is_matrix(n, p)], "weight_decay": settings.weight_decay},
                {"params": [p for n, p in named if not is_matrix(n, p)], "weight_decay": 0.0}]
    groups = []
    for vision, scale in ((False, 1.0), (True, settings.vision_lr / settings.lr)):
        part = [(n, p) for n, p in named if ("vision_tower" in n) == vision]
        groups += [{"params": [p for n, p in part if is_matrix(n, p)], "weight_decay": settings.weight_decay,
                    "lr_scale": scale},
                   {"params": [p for n, p in part if not is_matrix(n, p)], "weight_decay": 0.0, "lr_scale": scale}]
    return groups


def warm_up_vision(model, processor, settings: TrainSettings, progress: bool = True) -> list[float]:
    """Vision-only warm-up: train the vision tower alone to name each shape of a picture's base view
    (:func:`g4v.demo.aids.object_shape_logits`). Why: in the joint training the tiny ViT learns
    colour and place but hardly tells a star from a circle, and every question that names a shape
    needs that. On base views only a step is cheap, and at a ViT-friendly learning rate the tower
    learns to name the shapes (docs/demo-model.md has the cost and the accuracy). Returns the
    per-step accuracies (on new pictures each step)."""
    head = torch.nn.Linear(model.config.vision_config.hidden_size, len(S.SHAPES)).to(settings.device)
    params = list(model.model.vision_tower.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=settings.vision_warmup_lr, betas=(0.9, 0.98))
    rng = random.Random(f"vision:{settings.seed}")
    bar = progress_bar(settings.vision_warmup_steps, "vision warm-up") if progress else None
    accuracies = []
    for step in range(settings.vision_warmup_steps):
        canvas = S.canvas_kind(rng)
        pictures = [S.picture(f"vision:{settings.seed}:{step}:{k}", canvas=canvas) for k in range(settings.batch_size)]
        pixel_values = processor.image_processor([p.image for p in pictures], return_tensors="pt")["pixel_values"]
        logits, labels = object_shape_logits(model, head, pictures, pixel_values.to(settings.device))
        loss = torch.nn.functional.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        accuracies.append((logits.argmax(-1) == labels).float().mean().item())
        tick(bar, step, every=25, name="shape_acc", values=accuracies, window=50, digits=2)
    if bar is not None:
        bar.close()
    return accuracies


def validation_accuracy(model, processor, n: int) -> dict[str, float]:
    """Greedy first-turn accuracy per question type on ``n`` validation pictures (model left in train mode)."""
    pairs = items(S.validation_set(n))
    model.eval()
    try:
        return accuracy(pairs, batched_answers(model, processor, pairs, batch_size=32))
    finally:
        model.train()


def train_model(settings: TrainSettings, progress: bool = True, log_every: int = 25, trail: list | None = None):
    """Train from the seeded random initialisation; returns (model, processor, stats). ``trail``
    gets one log entry per step the training monitor measured (:mod:`g4v.training`: the 8 levels,
    read on the step's own forward and backward, which it leaves unchanged), with the step's loss."""
    from g4v.training.monitor import DeepstackMonitor

    from g4v.demo.build import build_processor

    torch.set_num_threads(settings.threads)
    torch.use_deterministic_algorithms(True, warn_only=settings.device != "cpu")
    processor = build_processor()
    model = initial_model(settings, processor)
    torch.manual_seed(settings.seed)
    model.to(settings.device)
    model.train()
    no_dropout(model)
    probe = FeatureProbe(model, place=settings.aux_place).to(settings.device) if settings.aux_weight > 0 else None
    pointers = make_pointers(model, settings)
    warmup_started, warmup_accuracy = time.time(), []
    if settings.vision_warmup_steps:
        warmup_accuracy = warm_up_vision(model, processor, settings, progress=progress)
    warmup_time = time.time() - warmup_started
    named = list(model.named_parameters()) + (list(probe.named_parameters()) if probe else [])
    for number, pointer in enumerate(pointers):
        if pointer.readout is not None:
            named += list(pointer.readout.named_parameters(prefix=f"readout{number}"))
    optimizer = torch.optim.AdamW(parameter_groups(named, settings), lr=settings.lr, betas=(0.9, 0.98), eps=1e-8)
    rng = random.Random(f"turns:{settings.seed}")
    bar = progress_bar(settings.steps, "train") if progress else None
    started = time.time()
    history, curve, index = {"loss": [], "aux": [], "pointer": [], "readout": []}, [], 0
    record = (lambda r: trail.append({"step": r.step, "loss": history["loss"][-1], **r.to_logs()})) if trail is not None \
        else None
    monitor = DeepstackMonitor(model, on_record=record)
    for step in range(settings.steps):
        pictures, index = step_pictures(settings, rng, step, index)
        plans = [conversation_plan(p, rng, settings.max_turns, settings.shape_share) for p in pictures]
        turns = [[(qa.question, qa.answer) for qa, _ in plan] for plan in plans]
        batch = {k: v.to(settings.device) for k, v in encode(processor, pictures, turns).items()}
        with monitor.step(step + 1):
            loss = joint_loss(model, batch, pictures, plans, probe, pointers, settings, history)
            update(optimizer, loss, step, settings, monitor)
        if bar is not None:
            bar.update(1)
            if step % 5 == 0:
                bar.set_postfix({name: f"{sum(values[-20:]) / len(values[-20:]):.3f}"
                                 for name, values in history.items() if name in ("loss", "aux") and values})
        if log_every and (step + 1) % log_every == 0:
            print(f"step {step + 1}/{settings.steps} " + _log_line(history, probe, log_every)
                  + f" elapsed {time.time() - started:.0f}s", flush=True)
        if settings.eval_every and ((step + 1) % settings.eval_every == 0 or step + 1 == settings.steps):
            curve.append({"step": step + 1, **validation_accuracy(model, processor, settings.eval_n)})
            print(f"step {step + 1} validation " + " ".join(f"{k} {100 * v:.0f}%" for k, v in curve[-1].items()
                                                             if k != "step"), flush=True)
    if bar is not None:
        bar.close()
    monitor.close()
    for aid in ([probe] if probe is not None else []) + pointers:
        aid.remove()
    model.eval()
    model.to("cpu")
    losses, aux_losses = history["loss"], history["aux"]
    stats = {
        "wall_time_s": round(time.time() - started + warmup_time, 1),
        "final_loss": round(sum(losses[-20:]) / max(1, len(losses[-20:])), 4),
        "final_aux_loss": round(sum(aux_losses[-20:]) / max(1, len(aux_losses[-20:])), 4),
        "pictures_seen": index,
    }
    if curve:
        stats["validation_curve"] = curve
    if warmup_accuracy:
        last = warmup_accuracy[-50:]
        stats["vision_warmup"] = {"wall_time_s": round(warmup_time, 1),
                                  "final_shape_accuracy": round(sum(last) / len(last), 4)}
    return model, processor, stats


def initial_model(settings: TrainSettings, processor):
    """The model training starts from: the seeded random init of ``python -m g4v.demo build`` (or
    the ``init`` checkpoint), its q/k weights scaled by ``qk_scale``."""
    from g4v.demo.build import build_random_model

    if settings.init:
        from transformers import Granite4VisionForConditionalGeneration

        model = Granite4VisionForConditionalGeneration.from_pretrained(settings.init, dtype=torch.float32)
    else:
        model = build_random_model(processor)  # the same init as the random bundled checkpoint
    if settings.qk_scale != 1.0:
        with torch.no_grad():
            for name in site_names(model, "layers.{i}.self_attn"):
                site(model, name).q_proj.weight.mul_(settings.qk_scale)
                site(model, name).k_proj.weight.mul_(settings.qk_scale)
    return model


def step_pictures(settings: TrainSettings, rng: random.Random, step: int, index: int) -> tuple[list, int]:
    """One step's training pictures (one canvas kind), from picture ``index`` on, and the next
    index. The curriculum forces one-shape pictures early, three-shape ones after."""
    ramp = settings.curriculum_fraction * settings.steps
    single_p = settings.single_shape_start * max(0.0, 1 - step / ramp) if ramp > 0 else 0.0
    three_p = settings.three_shape_share if settings.three_shape_share > 0 and not single_p else None
    canvas = S.canvas_kind(rng)
    pictures = []
    for _ in range(settings.batch_size):
        pictures.append(S.train_picture(settings.seed, index, single_shape_p=single_p or None, canvas=canvas,
                                        max_shapes_p=three_p))
        index += 1
    return pictures, index


def joint_loss(model, batch: dict, pictures: list, plans: list, probe, pointers: list, settings: TrainSettings,
               history: dict[str, list[float]]) -> torch.Tensor:
    """The answers' loss plus the weighted aids' losses; each part's value is appended to ``history``."""
    loss = model(**batch).loss
    history["loss"].append(loss.item())
    if probe is not None:
        aux = probe.loss(pictures, batch["image_sizes"])
        history["aux"].append(aux.item())
        loss = loss + settings.aux_weight * aux
    if pointers:
        pointing = [pointer.losses(batch, pictures, plans) for pointer in pointers]
        pointer_loss = sum(p["pointer"] for p in pointing)
        history["pointer"].append(pointer_loss.item())
        loss = loss + settings.pointer_weight * pointer_loss
        if pointers[0].readout is not None:
            readout_loss = sum(p["readout"] for p in pointing if "readout" in p)
            history["readout"].append(readout_loss.item())
            loss = loss + settings.readout_weight * readout_loss
    return loss


def _log_line(history: dict[str, list[float]], probe, last: int) -> str:
    """Mean losses over the ``last`` steps, and the probe's accuracy on the last batch."""
    text = f"loss {sum(history['loss'][-last:]) / last:.4f}"
    for name in ("aux", "pointer", "readout"):
        if history[name]:
            text += f" {name} {sum(history[name][-last:]) / last:.4f}"
    if probe is not None:
        text += " probe " + " ".join(f"{k} {100 * v:.0f}%" for k, v in probe.accuracy.items())
    return text


def train(out: Path, settings: TrainSettings, command: str, progress: bool = True) -> str:
    """Train (:func:`train_model`) and save the checkpoint with its provenance in ``out``; returns
    the weights' SHA-256."""
    from g4v.demo.build import build_processor, save_checkpoint

    init = None
    if settings.init:  # read before training: ``out`` may replace it
        init = json.loads((Path(settings.init) / "g4v_build.json").read_text())
    trail: list[dict] = []
    model, processor, stats = train_model(settings, progress=progress, trail=trail)
    provenance = {
        "builder": command,
        "weights": "trained on synthetic shapes (g4v.demo.shapes), from the seeded random init of `python -m g4v.demo build`",
        "seed": settings.seed,
        "settings": asdict(settings),
        "data": data_settings(),
        "torch": torch.__version__,
        **stats,
    }
    if init is not None:
        provenance["init"] = init  # the earlier stage's own provenance (command, settings, sha256)
        provenance["weights"] = "trained on synthetic shapes (g4v.demo.shapes), continuing from the checkpoint in 'init'"
        provenance["total_wall_time_s"] = round(stats["wall_time_s"] + init.get("total_wall_time_s", init.get("wall_time_s", 0)), 1)
    # A fresh processor: any padded call (training batches, validation) leaves padding switched on
    # in the fast tokenizer's backend, and save_pretrained would write that into tokenizer.json.
    sha = save_checkpoint(model, build_processor(), Path(out), provenance)
    drop_subconfig_dtypes(Path(out) / "config.json")
    write_log(Path(out) / LOG_FILE, model.config.model_type, [level.name for level in describe_levels(model.config)],
              MonitorSettings(), trail, command=command, weights_sha256=sha, wall_time_s=stats["wall_time_s"])
    return sha


def drop_subconfig_dtypes(path: Path) -> None:
    """A model loaded with ``from_pretrained`` (``--init``) writes ``"dtype": "float32"`` into each
    sub-config; the random build writes none. Drop them so config.json stays byte-identical."""
    config = json.loads(path.read_text())
    for key in ("text_config", "vision_config", "qformer_config"):
        if isinstance(config.get(key), dict):
            config[key].pop("dtype", None)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
