"""The document tasks of ``python -m g4v.demo eval`` (issue 21), scored with the documents metrics.

* chart to CSV: **exact** (the answer's rows, as :func:`g4v.documents.tables.parse_csv` reads
  them, equal the chart's) and **cells** (:func:`g4v.documents.metrics.csv_cell_accuracy`);
* key-value extraction: **valid** (the answer is JSON that breaks nothing in
  :data:`g4v.demo.documents_data.KVP_SCHEMA`, read by :func:`g4v.documents.structured.read_answer`)
  and **fields** (:func:`g4v.documents.metrics.key_value_match`, exact match per field).

Answers come from an engine (transformers or vLLM), one request per question or in batches
(:func:`g4v.demo.answering.engine_batched_answers`); an engine whose model runs in this process
also answers with injection levels ablated.
"""

from dataclasses import asdict, dataclass

from g4v.conversation import SamplingSettings
from g4v.demo.answering import ablation_scales, answers, engine_batched_answers, level_names, levels_scaled, phase
from g4v.demo.documents_data import KVP_SCHEMA, DocumentItem, pairs

#: Enough new tokens for the longest right answer (4 CSV rows; 3 shapes of key-value JSON), with room.
MAX_NEW_TOKENS = {"chart": 64, "kvp": 200}
#: The score names, in the order tables show them.
SCORES = ("chart_exact", "chart_cells", "kvp_valid", "kvp_fields")


@dataclass
class DocumentScores:
    """Shares (0-1) over the charts and the key-value questions asked; NaN where none was asked."""

    chart_exact: float
    chart_cells: float
    kvp_valid: float
    kvp_fields: float
    charts: int
    kvp: int

    def to_dict(self) -> dict:
        return asdict(self)


def chart_scores(reply: str, truth_csv: str) -> tuple[bool, float]:
    """(exactly right, share of cells right) of one chart answer."""
    from g4v.documents import metrics, tables

    try:
        exact = tables.parse_csv(reply).rows == tables.parse_csv(truth_csv).rows
    except tables.TableError:
        exact = False
    return exact, metrics.csv_cell_accuracy(reply, truth_csv)


def kvp_scores(reply: str, truth: dict) -> tuple[bool, float]:
    """(valid JSON against the schema, share of fields right) of one key-value answer."""
    from g4v.documents import metrics
    from g4v.documents.structured import read_answer

    return read_answer("json", reply, KVP_SCHEMA).ok, metrics.key_value_match(reply, truth).accuracy


def score(items: list[DocumentItem], replies: list[str]) -> DocumentScores:
    """Every item's answer scored; the means per task."""
    charts = [chart_scores(reply, item.qa.answer) for item, reply in zip(items, replies) if item.qa.kind == "chart"]
    kvps = [kvp_scores(reply, item.truth) for item, reply in zip(items, replies) if item.qa.kind == "kvp"]

    def mean(values) -> float:
        values = list(values)
        return sum(values) / len(values) if values else float("nan")

    return DocumentScores(chart_exact=mean(e for e, _ in charts), chart_cells=mean(c for _, c in charts),
                          kvp_valid=mean(v for v, _ in kvps), kvp_fields=mean(f for _, f in kvps),
                          charts=len(charts), kvp=len(kvps))


def by_task(items: list[DocumentItem]) -> dict[str, list[int]]:
    """The items' indices per task (each task is decoded with its own token limit)."""
    groups: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        groups.setdefault(item.qa.kind, []).append(index)
    return groups


def batched(engine, items: list[DocumentItem], batch_size: int = 16, bar=None) -> list[str]:
    """Greedy answers through the engine's batches, per task (each with its own token limit)."""
    replies = [""] * len(items)
    for kind, indices in by_task(items).items():
        chosen = pairs([items[i] for i in indices])
        replies_of_kind = engine_batched_answers(engine, chosen, batch_size, MAX_NEW_TOKENS[kind], bar)
        for index, reply in zip(indices, replies_of_kind):
            replies[index] = reply
    return replies


def ablated(engine, items: list[DocumentItem], scales: dict[str, float], bar=None) -> list[str]:
    """Batched answers with the given levels scaled (0 = ablated), as the shapes' ablations."""
    with levels_scaled(engine, scales):
        return batched(engine, items, bar=bar)


def engine_answers(engine, items: list[DocumentItem], workers: int = 1, bar=None) -> list[str]:
    """One engine request per question, greedy, each task with its own token limit
    (:func:`g4v.demo.answering.answers`; a vLLM engine takes several at once)."""
    replies = [""] * len(items)
    for kind, indices in by_task(items).items():
        settings = SamplingSettings(max_new_tokens=MAX_NEW_TOKENS[kind], temperature=0)
        for index, reply in zip(indices, answers(engine, pairs([items[i] for i in indices]), workers, settings, bar)):
            replies[index] = reply
    return replies


def format_rows(rows: dict[str, DocumentScores]) -> str:
    """A text table: one row per run, one column per score."""
    width = max(len(name) for name in rows) + 2
    lines = [" " * width + "".join(f"{name:>13}" for name in SCORES)]
    for name, scores in rows.items():
        lines.append(f"{name:<{width}}" + "".join(f"{100 * getattr(scores, s):>12.1f}%" for s in SCORES))
    return "\n".join(lines)


def evaluate_documents(engine, n: int, name: str, ablation_n: int = 0, ablations: bool = True, bar=None) -> dict:
    """The document rows of ``eval``, the first named ``name`` (the backend): through the engine,
    one request per question; where the engine's model runs here (:class:`~g4v.engines.capabilities.Instrumentable`)
    also batched, with all 8 levels ablated and with each single level ablated (on the first
    ``ablation_n`` charts and pictures). Returns {"rows": {name: DocumentScores}, "replies": [...], ...};
    ``bar`` counts the questions."""
    from g4v.demo.documents_data import held_out_items
    from g4v.engines.capabilities import Instrumentable

    items = held_out_items(n)
    phase(bar, f"documents, {name} engine")
    replies = engine_answers(engine, items, workers=engine.concurrent_streams, bar=bar)
    rows = {name: score(items, replies)}
    results = {"n": n, "replies": replies}
    if engine.supports(Instrumentable):
        model = engine.capable(Instrumentable).model
        phase(bar, f"documents, {name} batched")
        same = batched(engine, items, bar=bar)
        rows[f"{name} batched"] = score(items, same)
        results["batched_agrees_with_engine"] = sum(a == b for a, b in zip(same, replies)) / max(1, len(items))
        if ablations:
            phase(bar, "documents, all 8 levels ablated")
            rows["all 8 ablated"] = score(items, ablated(engine, items, ablation_scales(model, None), bar))
            k = min(n, ablation_n or n)
            few = items[:k] + items[n : n + k]  # the first k charts, then the first k key-value pictures
            for level in level_names(model):
                phase(bar, f"documents, {level} ablated")
                rows[f"{level} ablated"] = score(few, ablated(engine, few, {level: 0.0}, bar))
            results["single_level_ablation_items"] = len(few)
    rows["chance (a training example's answer)"] = score(items, blind_answers(n))
    results["rows"] = rows
    return results


def blind_answers(n: int) -> list[str]:
    """Chance, measured: for each held-out chart and picture, the right answer of a training chart
    and picture instead (well formed, with the training distribution's bars and shapes, blind to
    the picture asked about); ordered as :func:`g4v.demo.documents_data.held_out_items`."""
    from g4v.demo.charts import train_chart
    from g4v.demo.documents_data import kvp_answer
    from g4v.demo.shapes import picture

    return [train_chart(0, i).csv for i in range(n)] + [kvp_answer(picture(f"docs:0:{i}")) for i in range(n)]


def report(results: dict) -> str:
    """The document rows as printed by ``eval``."""
    lines = [f"document tasks: {results['n']} held-out charts, {results['n']} key-value pictures",
             format_rows(results["rows"])]
    if "batched_agrees_with_engine" in results:
        lines.append(f"batched answers equal to the engine's: {100 * results['batched_agrees_with_engine']:.1f}%")
    return "\n".join(lines)
