"""``python -m g4v.demo eval``: what the trained demo checkpoint sees, measured on held-out pictures.

* accuracy per question type (colour, shape, position, count) on ``--n`` held-out pictures
  (:func:`g4v.demo.shapes.eval_set`, seeds never used in training), four questions per picture,
  greedy decoding, exact match, through one engine: the transformers engine (``--backend hf``) or
  the vLLM engine (``--backend vllm``, run from the vLLM environment);
* where the engine's model runs in this process (the transformers engine: it is
  :class:`~g4v.engines.capabilities.Instrumentable`), the same through its batches, with all 8 injection levels ablated, and with each single level ablated. Ablating a
  level zeroes the features Granite 4 Vision adds into the language model at that level (the image
  placeholder embeddings are already zero, so with all 8 ablated the model sees no picture at all).
  It uses :func:`g4v.model.capture.instrument` (a forward pre-hook on the language model that
  scales the ``deepstack_features`` it is handed), so the model code is untouched;
* the demo adapter, registered with the engine as a user's adapter is: adherence (colour answers
  given in French) and accuracy with it asked for, and "adapter off => base answers unchanged"
  (the same engine with the adapter loaded but not asked for, answer for answer).
* the document tasks (issue 21, ``--doc-n`` charts and key-value pictures): chart exact match and
  cell accuracy, key-value JSON validity and field accuracy, through the same engine, and (an
  instrumentable engine) batched, with all 8 levels ablated and with each single level ablated
  (:mod:`g4v.demo.documents_eval`).
"""

import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from g4v.checkpoint.vision_lora import DEFAULT_MODE, MODES
from g4v.demo import shapes as S
from g4v.demo.answering import (ablated_answers, ablation_scales, accuracy, answers, engine_batched_answers, items,
                                level_names, phase)
from g4v.demo.progress import progress_bar
from g4v.paths import FRENCH_ADAPTER_DIR, REPO_ROOT, TRAINED_MODEL_DIR, names_folder


@dataclass(frozen=True)
class DemoEvalSettings:
    """What ``python -m g4v.demo eval`` measures: every default written once, the command's flags
    derived from these fields (:mod:`g4v.settings.flags`)."""

    model: Path = field(default=TRAINED_MODEL_DIR, metadata={"help": "checkpoint folder"})
    adapter: str | None = field(default=None, metadata={
        "help": f"adapter folder ('' to skip; default: {FRENCH_ADAPTER_DIR.relative_to(REPO_ROOT)} with the "
                "checkpoint it was trained on, else none)"})
    n: int = field(default=300, metadata={"help": "held-out pictures"})
    backend: str = field(default="hf", metadata={"choices": ("hf", "vllm"), "help": "the engine asked"})
    vision_lora: str = field(default=DEFAULT_MODE, metadata={
        "choices": MODES, "help": "a layout checkpoint's vision LoRA: native (image requests), merged or off"})
    ablation_n: int = field(default=100, metadata={"help": "pictures for the single-level ablations"})
    ablations: bool = field(default=True, metadata={"flag": "--no-ablations", "help": "no level ablations (an engine whose model runs here)"})
    adapter_only: bool = field(default=False, metadata={"flag": "--adapter-only", "help": "only the adapter checks"})
    threads: int | None = field(default=None, metadata={"help": "torch threads (default: torch's)"})
    doc_n: int | None = field(default=None, metadata={
        "help": "held-out charts and key-value pictures for the document tasks (default: --n for a checkpoint "
                "trained on them by train-documents, else 0, which skips them)"})
    json_out: Path | None = field(default=None, metadata={"flag": "--json", "metavar": "PATH", "help": "also write the results here"})
    no_progress: bool = field(default=False, metadata={"flag": "--no-progress", "help": "no progress bar"})


#: The name the demo adapter is registered under.
DEMO_ADAPTER = "demo"


def evaluate_adapter(engine, pairs, adapter_dir: Path, bar=None) -> dict:
    """Answers without the adapter, then with it registered (asked for, and not asked for), all
    through the engine's batches, so "adapter off => base answers unchanged" compares like with like."""
    phase(bar, "adapter")
    base_replies = engine_batched_answers(engine, pairs, bar=bar)
    engine.register_adapter(DEMO_ADAPTER, str(adapter_dir))
    on = engine_batched_answers(engine, pairs, bar=bar, adapter=DEMO_ADAPTER)
    off = engine_batched_answers(engine, pairs, bar=bar)
    french = set(S.FRENCH.values())
    colour = [(qa, reply) for (_, qa), reply in zip(pairs, on) if qa.kind == "colour"]
    return {
        "adherence": sum(reply in french for _, reply in colour) / max(1, len(colour)),
        "accuracy_with_adapter": accuracy(pairs, on, target=S.french_answer),
        "off_equals_base": sum(a == b for a, b in zip(off, base_replies)) / max(1, len(off)),
        "examples": [(qa.question, reply) for (_, qa), reply in list(zip(pairs, on))[:8]],
    }


def format_table(rows: dict[str, dict[str, float]]) -> str:
    kinds = [*S.QUESTION_TYPES, "all"]
    width = max(len(name) for name in rows) + 2
    lines = [" " * width + "".join(f"{k:>10}" for k in kinds)]
    for name, table in rows.items():
        lines.append(f"{name:<{width}}" + "".join(f"{100 * table.get(k, float('nan')):>9.1f}%" for k in kinds))
    return "\n".join(lines)


def main(settings: DemoEvalSettings) -> int:
    import torch

    if settings.threads:
        torch.set_num_threads(settings.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if settings.adapter is None:  # the French adapter with the checkpoint it was trained on
        settings = replace(settings, adapter=default_adapter(settings.model))
    pictures = S.eval_set(settings.n)
    pairs = items(pictures)
    rows: dict[str, dict[str, float]] = {}
    results: dict = {"model": str(settings.model), "n_pictures": settings.n, "backend": settings.backend,
                     "vision_lora": settings.vision_lora,
                     "chance": S.CHANCE}
    started = time.time()
    bar = None if settings.no_progress else progress_bar(None, "eval", unit=" questions")
    try:
        _evaluate(settings, pictures, pairs, rows, results, bar)
    finally:
        if bar is not None:
            bar.close()
    return _report(settings, results, rows, pairs, started)


def _evaluate(settings: DemoEvalSettings, pictures, pairs, rows, results, bar) -> None:
    """Fill ``rows`` and ``results`` with the runs ``main`` asked for, through the one engine
    ``--backend`` names; ``bar`` (None: none) counts the questions asked."""
    from g4v.engines import create_engine
    from g4v.engines.capabilities import Instrumentable

    name = settings.backend
    # The demo's transformers figures are float32 on the CPU; vLLM keeps its own defaults.
    loading = {"device": "cpu", "dtype": "float32"} if name == "hf" else {}
    engine = create_engine(name, str(settings.model), vision_lora=settings.vision_lora, **loading)
    try:
        if not settings.adapter_only:
            phase(bar, f"{name} engine")
            replies = answers(engine, pairs, workers=engine.concurrent_streams, bar=bar)
            rows[name] = accuracy(pairs, replies)
            results["replies"] = replies
            if engine.supports(Instrumentable):
                phase(bar, f"{name} batched")
                batched = engine_batched_answers(engine, pairs, bar=bar)  # a layout checkpoint's vision LoRA as one by one
                rows[f"{name} batched"] = accuracy(pairs, batched)
                results["batched_agrees_with_engine"] = sum(a == b for a, b in zip(batched, replies)) / len(pairs)
                if settings.ablations:
                    _ablations(settings, engine, pictures, pairs, rows, results, bar)
            results["documents"] = _documents(settings, engine, bar)
        if settings.adapter and Path(settings.adapter).is_dir():
            results["adapter"] = {"path": str(settings.adapter),
                                  **evaluate_adapter(engine, pairs, Path(settings.adapter), bar)}
    finally:
        engine.close()


def _ablations(settings: DemoEvalSettings, engine, pictures, pairs, rows, results, bar) -> None:
    """The rows with all 8 levels ablated, then each single level (on ``--ablation-n`` pictures)."""
    model = engine.model  # an Instrumentable engine's (its levels' names)
    phase(bar, "all 8 levels ablated")
    rows["all 8 ablated"] = accuracy(pairs, ablated_answers(engine, pairs, ablation_scales(model, None), bar))
    ab_pairs = items(pictures[: settings.ablation_n or settings.n])
    for level in level_names(model):
        phase(bar, f"{level} ablated")
        rows[f"{level} ablated"] = accuracy(ab_pairs, ablated_answers(engine, ab_pairs, {level: 0.0}, bar))
    results["single_level_ablation_pictures"] = len(ab_pairs) // 4


def default_adapter(model: Path) -> str:
    """The French adapter for the checkpoint it was trained on; none ('') for any other model."""
    return str(FRENCH_ADAPTER_DIR) if names_folder(model, TRAINED_MODEL_DIR) else ""


def trained_on_documents(model: Path) -> bool:
    """Whether ``model``'s provenance says ``train-documents`` made it (its data lists the charts)."""
    try:
        return "chart" in json.loads((Path(model) / "g4v_build.json").read_text()).get("data", {})
    except (OSError, ValueError, AttributeError):
        return False


def _documents(settings, engine, bar=None) -> dict | None:
    """The document tasks' rows (None with ``--doc-n 0``, the default for a model not trained on them)."""
    from g4v.demo.documents_eval import evaluate_documents

    doc_n = settings.doc_n if settings.doc_n is not None else (settings.n if trained_on_documents(settings.model) else 0)
    if not doc_n:
        return None
    return evaluate_documents(engine, doc_n, settings.backend, ablation_n=settings.ablation_n,
                              ablations=settings.ablations, bar=bar)


def _report(settings, results, rows, pairs, started) -> int:
    results["accuracy"] = rows
    results["wall_time_s"] = round(time.time() - started, 1)
    print(f"held-out pictures: {settings.n} ({len(pairs)} questions), backend {settings.backend}, model {settings.model}")
    if rows:
        print(format_table(rows))
    if "batched_agrees_with_engine" in results:
        print(f"batched answers equal to the engine's: {100 * results['batched_agrees_with_engine']:.1f}%"
              + (f"; single-level ablations on the first {results['single_level_ablation_pictures']} pictures"
                 if "single_level_ablation_pictures" in results else ""))
    print("chance: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in S.CHANCE.items()))
    if "adapter" in results:
        a = results["adapter"]
        print(f"adapter {settings.adapter}: adherence (colour answers in French) {100 * a['adherence']:.1f}%, "
              f"answers with adapter correct {100 * a['accuracy_with_adapter']['all']:.1f}%, "
              f"adapter off == base answers {100 * a['off_equals_base']:.1f}%")
        print("  e.g. " + "; ".join(f"{q} -> {r}" for q, r in a["examples"][:4]))
    if results.get("documents"):
        from g4v.demo.documents_eval import report

        print(report(results["documents"]))
        results["documents"]["rows"] = {k: v.to_dict() for k, v in results["documents"]["rows"].items()}
    print(f"wall time {results['wall_time_s']} s")
    if settings.json_out:
        Path(settings.json_out).write_text(json.dumps(results, indent=1) + "\n")
    return 0
