"""What the Evaluate tab's Run and its token-budget sweep share: the run their inputs ask for,
checked, and the worker thread a run works in while the handler shows its progress and Stop
reaches it (the tab's :class:`~webapp.evaluate.EvalWorkspace` holds the stop switches)."""

import threading
from dataclasses import fields

from g4v.evaluate import Columns, EvalConfig, open_dataset
from g4v.evaluate.equivalence import DISCORDANCE, MARGIN
from webapp.common import Pace, sampling_settings
from webapp.evaluate_choices import ArmChoice, pick_arms
from webapp.evaluate_equivalence import DISCORDANCE_NAME, MARGIN_NAME, checked_share
from webapp.evaluate_tables import ROWS_NAME, SEED_NAME, whole_or_none
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
                      limit=whole_or_none(limit, ROWS_NAME, smallest=1, means_none=0),
                      seed=whole_or_none(seed, SEED_NAME, smallest=0, means_none=-1), max_new_tokens=tokens,
                      blank_probe=bool(blank_probe), levels=bool(levels), margin=checked_share(margin, MARGIN_NAME),
                      discordance=checked_share(discordance, DISCORDANCE_NAME))


def in_worker(workspace, request, progress, unit: str, job):
    """``job(report, cancel)`` in a worker thread while the handler shows its progress (``report(done,
    total)`` in ``unit``); Stop sets ``cancel``. Returns the job's result, or raises its error."""
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
            done, total = counts
            if total:
                left = pace.left(done, total)
                progress((done, total), desc=f"{unit}, {left}" if left else unit, unit=unit)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["result"]
    finally:
        switch.set()  # a closed connection or a failure stops the worker too
        worker.join()
        workspace.forget(session, switch)
