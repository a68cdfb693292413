"""What the Evaluate tab's Run and its token-budget sweep share: the run their inputs ask for,
checked, and the worker thread a run works in while the handler shows its progress and Stop
reaches it (the tab's :class:`~webapp.evaluate.EvalWorkspace` holds the stop switches)."""

import threading
from dataclasses import fields

from g4v.evaluate import Columns, EvalConfig, open_dataset
from g4v.evaluate.equivalence import DISCORDANCE, MARGIN
from g4v.evaluate.run import check_margin
from webapp.common import sampling_settings
from webapp.evaluate_choices import ArmChoice, pick_arms
from webapp.evaluate_equivalence import DISCORDANCE_NAME, MARGIN_NAME, checked_share
from webapp.evaluate_tables import ALL_ROWS, DATASET_ORDER, ROWS_NAME, SEED_NAME, whole_or_none
from webapp.runs import Pace
from webapp.sessions import session_key

#: Seconds between progress updates while a run works.
POLL_SECONDS = 1.0
COLUMN_ROLES = tuple(f.name for f in fields(Columns))


def eval_config(workspace, choices: list[ArmChoice], visitor, arm_a, arm_b, dataset, files, columns,
                limit, seed, max_new_tokens, blank_probe, levels, margin=MARGIN, discordance=DISCORDANCE) -> EvalConfig:
    """The run the tab's inputs ask for, every input checked (a bad dataset before any model loads);
    arm B "same as A" is arm A again (a noise-floor run)."""
    a, b = pick_arms(arm_a, arm_b, choices)
    tokens = sampling_settings(max_new_tokens).max_new_tokens
    mapping = Columns(**{role: (str(value).strip() or None) if value is not None else None
                         for role, value in zip(COLUMN_ROLES, columns)})
    source = workspace.source(dataset, files, visitor)
    open_dataset(str(source), mapping, workspace.allowed_dirs(visitor))  # a bad dataset stops here, before any model
    # each number named as the visitor sees its box (EvalConfig.check names the command's flags)
    return EvalConfig(a=a, b=b, data=str(source), columns=mapping,
                      limit=whole_or_none(limit, ROWS_NAME, smallest=1, means_none=0, none_reads=ALL_ROWS),
                      seed=whole_or_none(seed, SEED_NAME, smallest=0, means_none=-1, none_reads=DATASET_ORDER),
                      max_new_tokens=tokens,
                      blank_probe=bool(blank_probe), levels=bool(levels), margin=checked_share(margin, MARGIN_NAME, check_margin),
                      discordance=checked_share(discordance, DISCORDANCE_NAME))


def client_gone() -> bool:
    """Whether the visitor of the event running in this thread has gone: closed the page, or closed
    the API client's event stream. Gradio (6.31) then marks the event's job as no longer alive
    (``Queue.clean_events``), but raises nothing into a handler that does not yield: one that waits
    on a worker asks here. The event is found as ``gr.Progress`` finds it (Gradio's ``LocalContext``).
    False outside a queued event."""
    from gradio.context import LocalContext

    blocks, event_id = LocalContext.blocks.get(None), LocalContext.event_id.get(None)
    queue = getattr(blocks, "_queue", None)
    event = queue.event_ids_to_events.get(event_id) if queue is not None and event_id else None
    return event is not None and not event.alive


def in_worker(workspace, request, progress, unit: str, job):
    """``job(report, cancel)`` in a worker thread while the handler shows its progress (``report(done,
    total)`` in ``unit``); Stop sets ``cancel``, and so does the visitor's going away
    (:func:`client_gone`, read at each poll): the job stops after the batch in hand, so no run outlives
    its visitor. Returns the job's result, or raises its error."""
    session = session_key(request) or "api"
    switch = workspace.stop_switch(session)
    counts, outcome = [0, 0], {}

    def work():
        try:
            outcome["result"] = job(lambda done, total: counts.__setitem__(slice(None), [done, total]), switch)
        except BaseException as err:  # re-raised in the handler's thread
            outcome["error"] = err

    worker = threading.Thread(target=work, daemon=True, name="g4v-evaluate")
    try:
        worker.start()
        progress(0.0, desc="opening the arms (loading a model or starting a server can take a minute)")
        pace = Pace()  # from the first count: opening the arms is not the samples' pace
        while worker.is_alive():
            worker.join(POLL_SECONDS)
            if client_gone():
                switch.set()
            done, total = counts
            if total:
                left = pace.left(done, total)
                progress((done, total), desc=f"{unit}, {left}" if left else unit, unit=unit)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["result"]
    finally:
        switch.set()  # a failure in this thread (or a generator closed by Gradio) stops the worker too
        worker.join()
        workspace.forget(session, switch)
