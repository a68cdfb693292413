"""A run in the page: its button while it works, the line its progress bar is drawn over, the
time left, and what becomes of the results on show when a run starts, is refused, or its inputs
change (kept, marked as the previous run's) and of a refusal's "Error" badges (taken off).

Gradio-only helpers, shared by every tab with a run (Deepstack, Attribution, Circuits, the port
check, Evaluate, Training); the work itself happens in plain functions of the ``g4v`` package.
"""

import contextvars
import threading
import time
from contextlib import contextmanager

import gradio as gr

from webapp.common import QUIET_INPUT


def without_error_badges(event, outputs: list) -> None:
    """After ``event`` is refused, a quick step that takes Gradio's "Error" badge off each of its
    ``outputs`` (what they showed stays): the refusal's toast is message enough."""
    skips = tuple(gr.skip() for _ in outputs)  # one output takes a value, not a one-item list
    event.failure(lambda: skips[0] if len(skips) == 1 else skips, None, outputs, api_visibility="private",
                  queue=False, **QUIET_INPUT)


#: Put above a result's status or report while a new run starts and after it is refused (or its
#: inputs changed): what shows below is still the previous run's, kept rather than emptied.
PREVIOUS_RUN = "*The results below are from the previous run.*"


def previous_run(status: str | None) -> str:
    """The status line with :data:`PREVIOUS_RUN` above it (once), or as it is when no run shows."""
    status = status or ""
    return status if not status.strip() or status.startswith(PREVIOUS_RUN) else f"{PREVIOUS_RUN}\n\n{status}"


def previous_run_mark(status: gr.Markdown) -> dict:
    """The listener settings of a quick step that marks ``status`` (the line above a run's results)
    as the previous run's (:func:`previous_run`), for an event that makes those results old; being
    a step of its own that writes ``status``, it also takes a refusal's "Error" badge off it."""
    return {"fn": previous_run, "inputs": status, "outputs": status, "api_visibility": "private", "queue": False,
            **QUIET_INPUT}


def run_keeping_previous(button: gr.Button, fn, inputs: list, outputs: list, status: gr.Markdown,
                         picture: gr.Image | None = None, **settings):
    """Wire ``button`` to run ``fn`` and return that event. ``status`` is marked as the previous
    run's while the run starts (the mark is registered first: it shows before the run's own first
    update; on a :func:`status_line` the bar hides it until the run ends) and again when the run
    is refused, so a refusal leaves the results on show, marked, rather than emptying them or
    passing them off as its own. A refusal's "Error" badge, drawn on the outputs and on the box the
    bar is drawn over (``show_progress_on``), is taken off them all. With ``picture``, a run whose
    picture changed while it worked ends marked too (:func:`old_with_another_picture`)."""
    mark = previous_run_mark(status)
    button.click(**mark)
    old_after = old_with_another_picture(picture, button, status) if picture is not None else None
    event = button.click(fn, inputs, outputs, **settings)
    event.failure(**mark)  # writing the status line takes its badge off
    bar_boxes = settings.get("show_progress_on") or []
    bar_boxes = list(bar_boxes) if isinstance(bar_boxes, (list, tuple)) else [bar_boxes]
    badged = [box for box in dict.fromkeys([*outputs, *bar_boxes]) if box is not status]
    if badged:
        without_error_badges(event, badged)
    if old_after is not None:
        old_after(event)
    return event


def old_with_another_picture(picture: gr.Image, button: gr.Button, status: gr.Markdown):
    """``status`` is marked as the previous run's when the run that ``button`` starts ends, if
    ``picture`` changed while it worked: whatever the tab does on another picture (marks the results
    on show, or empties them), the run's end writes the results of the picture it started with under
    a picture they were not computed from. Call it before wiring the run, then pass the run's event
    to what it returns.

    The picture the run started with is noted by a quick step of the same click, in a ``gr.State``
    (the check at the end runs on the server; a picture box hands its handlers a file path, a new
    one for each upload). The step is registered before the run: noted after it, in Gradio 6.31 the
    state read when the run ended was still empty."""
    started = gr.State()
    button.click(lambda path: path, picture, started, api_visibility="private", queue=False, **QUIET_INPUT)

    def ended(run) -> None:
        run.success(lambda text, then, now: gr.skip() if now == then else previous_run(text),
                    [status, started, picture], status, api_visibility="private", queue=False, **QUIET_INPUT)

    return ended


def emptied(components: list) -> dict:
    """What each result box shows when it is emptied (no text, no picture, no rows, no files), by box."""
    return {component: [] if isinstance(component, gr.Dataframe)
            else "" if isinstance(component, (gr.Markdown, gr.HTML, gr.Textbox)) else None for component in components}


def empties_on(event, components: list) -> None:
    """``event`` (a new picture, another region) empties ``components``: the results shown were
    computed from what was there before, and would stand unmarked beside the new input."""
    event(lambda: emptied(components), None, components, api_visibility="private", queue=False,
          show_progress="hidden")


#: The least height of the line a long run's progress bar is drawn over (Gradio draws the bar over
#: the box it is shown on: over an empty Markdown it had no height at all, and did not show).
STATUS_HEIGHT = 72
#: The class of a :func:`status_line`: the page's CSS (:data:`webapp.layout.WORKBENCH_CSS`) hides
#: its text while a run's bar is drawn over it, so the bar's words are not drawn over the line's own.
RUN_STATUS = "g4v-run-status"


def status_line(value: str | None = None, *, elem_id: str) -> gr.Markdown:
    """A line a long run's bar is drawn over (``show_progress_on``): the hint, then the run's status
    or previous-run mark, out of sight while the bar shows. Not for a report, kept readable under it."""
    return gr.Markdown(value, min_height=STATUS_HEIGHT, elem_id=elem_id, elem_classes=[RUN_STATUS])


def busy_while_running(button: gr.Button, busy: str):
    """Show ``busy`` on ``button``, disabled, while its run works: call it before wiring the run (its
    step is registered first, so it shows at once), then pass the run's event to what it returns,
    which gives the button back (its own label, enabled) when the run ends, refused or not."""
    idle = button.value
    button.click(lambda: gr.Button(value=busy, interactive=False), None, button, api_visibility="private",
                 queue=False, **QUIET_INPUT)

    def done(event) -> None:  # not .then: Gradio 6.31 runs no .then step after a refused run
        for ended in (event.success, event.failure):
            ended(lambda: gr.Button(value=idle, interactive=True), None, button, api_visibility="private",
                  queue=False, **QUIET_INPUT)

    return done


def seconds_to_go(done: float, total: float, elapsed: float) -> float | None:
    """The seconds the rest would take at the pace so far; None before the first step ends and
    after the last."""
    return elapsed / done * (total - done) if 0 < done < total else None


def time_left(done: float, total: float, elapsed: float) -> str:
    """``"about 40 s left"`` at the pace so far, for a progress line; empty before the first step
    ends and after the last (Gradio's own bar shows only the time elapsed)."""
    left = seconds_to_go(done, total, elapsed)
    return "" if left is None else seconds_left(left)


#: The time left of a stage that has lasted longer than the pace so far gave it, by more than
#: OVERDUE_AFTER seconds ("about 1 s left" until then: a short run's estimates are rough, and one of
#: under a second said this almost as soon as its stage began).
OVERDUE, OVERDUE_AFTER = "taking longer than estimated", 3.0


@contextmanager
def live_progress(progress, every: float = 1.0, clock=time.monotonic):
    """``with live_progress(progress) as tell:`` gives ``tell(fraction, text)``, the library's
    progress callback, for Gradio's ``progress``: the bar at ``fraction`` (0-1) with ``text`` and the
    time left at the pace since the block began. The line is sent again every ``every`` seconds
    until the block ends, its time left counted down (:data:`OVERDUE` once well spent): a stage that
    lasts (vLLM starting, the deletion test) showed one frozen estimate all along ("about 60 s
    left" from 16 s to 32 s).

    Not :class:`Pace`: a run's stages are told as they start, at fractions of unequal size, so the
    last stage's size says nothing of the next. The resending thread runs in a copy of the
    handler's context, where Gradio keeps the event the bar belongs to; it is stopped and joined
    when the block ends, refused or not."""
    started, lock, stop = clock(), threading.Lock(), threading.Event()
    told = None  # (fraction, text, when, seconds left then or None) of the last tell

    def send() -> None:
        with lock:
            if told is None:
                return
            fraction, text, when, left = told
            if left is not None:
                left -= clock() - when
                text = f"{text}, {seconds_left(max(left, 1)) if left > -OVERDUE_AFTER else OVERDUE}"
            progress(fraction, desc=text)

    def tell(fraction: float, text: str) -> None:
        nonlocal told
        with lock:
            now = clock()
            told = (fraction, text, now, seconds_to_go(fraction, 1.0, now - started))
        send()

    def resend() -> None:
        while not stop.wait(every):
            send()

    ticker = threading.Thread(target=contextvars.copy_context().run, args=(resend,), daemon=True)
    ticker.start()
    try:
        yield tell
    finally:
        stop.set()
        ticker.join()


def seconds_left(seconds: float) -> str:
    return f"about {seconds:.0f} s left" if seconds < 90 else f"about {seconds / 60:.0f} min left"


class Pace:
    """The time left of a run polled while it works (``left(done, total)`` every second or so),
    from the steps finished since the first count, which comes after any start-up (an arm's model
    loading is not the pace of its rows), and counted down between steps.

    At a plain ``elapsed / done`` pace a run whose rows finish in batches (4 at once) showed a time
    that rose while a batch was in flight ("17 s" at 4 of 12 became "48 s", still at 4 of 12). Here
    the time left at the last step counts down, and rises only once the batch in flight is overdue:
    it never falls below the time left if that batch finished now (the step as large as the last)."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.first = self.last = None  # (time, done) at the first count and at the last change
        self.step = 1.0  # how many finished at the last change

    def left(self, done: float, total: float) -> str:
        now = self.clock()
        if self.first is None:
            self.first = self.last = (now, done)
        elif done != self.last[1]:
            self.step, self.last = max(done - self.last[1], 1e-9), (now, done)
        (start, done_first), (then, _) = self.first, self.last
        if not done_first < done < total:
            return ""
        pace = (then - start) / (done - done_first)
        counted_down = pace * (total - done) - (now - then)
        if_done_now = (now - start) / (done - done_first + self.step) * max(total - done - self.step, 0.0)
        return seconds_left(max(counted_down, if_done_now))
