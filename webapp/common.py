"""What every tab shares: the image upload, the error decorator, the sampling inputs, the limits.

Gradio-only helpers; the work itself happens in plain functions of the ``g4v`` package.
"""

import dataclasses
import functools
import inspect
import logging
import math
import os
import re
import time

import gradio as gr

from g4v.conversation import MAX_NEW_TOKENS, MAX_SEED, SamplingSettings
from g4v.errors import G4VError, parse_whole, quoted

log = logging.getLogger("g4v.webapp")

#: Every model-bound event shares this concurrency group, across tabs, so that at most
#: ``--concurrency`` of them run on the model at once and the rest wait in the bounded queue.
MODEL_QUEUE = "model"
#: Chat answers on an engine that answers several at once (``engine.concurrent_streams``): a group
#: of their own, as many at once as the engine takes.
CHAT_QUEUE = "chat"
#: Dataset runs (Evaluate's Run and its token-budget sweep, which can take hours) queue in a group
#: of their own, so one visitor's run never holds the other tabs' model-bound events: those still
#: take turns on the model with it, as the engine lends itself one pass (one batch) at a time.
EVALUATE_QUEUE = "evaluate"


#: The library's refusals name the CLI's flags; the app names its own controls instead.
APP_WORDING = [(re.compile(r"name it with --columns (\w+)=COLUMN"), r"type its name in the box '\1 column' (Column mapping)")]


def toast_text(message: str) -> str:
    """A message as a toast shows it: in the app's wording, and with no tag in it. Gradio renders a
    toast's text as (sanitised) HTML, and messages quote what visitors uploaded (column and file
    names: ``<img src=...>`` would be fetched). The same text is what an API client gets, so it is
    not entity-escaped (that client would read ``x0 &lt; x1``): a ``<`` that could open a tag gets
    an invisible word joiner after it, which HTML reads as text; every other character is as written."""
    for pattern, wording in APP_WORDING:
        message = pattern.sub(wording, message)
    return TAG_START.sub("<\u2060", message)


#: ``<`` where HTML would start a tag, a comment or a declaration (a letter, ``/``, ``!`` or ``?`` after it).
TAG_START = re.compile(r"<(?=[A-Za-z/!?])")
#: Every ASCII punctuation character: Markdown may read each as markup, and a backslash before it
#: makes it a plain character (CommonMark's backslash escapes); ``<`` and ``&`` included, so no HTML.
MARKDOWN_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")


def escape_markdown(text) -> str:
    """``text`` (from a file, a dataset, a model or an adapter) as Markdown that shows it as written:
    never markup, never HTML (a tag, a link, an image, emphasis). The one escape for every Markdown
    output of the app: a gr.Markdown line, a chat message. :func:`unescape_markdown` undoes it."""
    return MARKDOWN_PUNCTUATION.sub(r"\\\1", str(text))


def unescape_markdown(markdown: str) -> str:
    """The text :func:`escape_markdown` made ``markdown`` from."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown)


def markdown_code(text, in_table: bool = False) -> str:
    """``text`` (a token, an answer, a name) as inline Markdown code: inside a code span Markdown and
    HTML are text. A backtick (it would end the span) becomes ``'``, a line break a space, and in a
    table cell ``|`` is escaped (it would end the cell)."""
    text = " ".join(str(text).replace("`", "'").splitlines()) or " "
    return "`" + (text.replace("|", "\\|") if in_table else text) + "`"


def shows_errors(fn):
    """Let ``fn`` (a function or a generator function) raise :class:`G4VError` and the user see one
    line: it becomes ``gr.Error`` (see :func:`toast_text`). Anything else is a bug: its traceback
    goes to the server log and the user gets a line without library internals or server paths."""

    def translate(err: BaseException) -> gr.Error:
        if isinstance(err, G4VError):  # a refusal, not a failure: no traceback in the server log
            return gr.Error(toast_text(str(err)), print_exception=False)
        log.exception("unexpected error in %s", fn.__name__)
        return gr.Error(f"the workbench failed unexpectedly ({type(err).__name__}); the details are in the server log")

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def stream(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except (gr.Error, GeneratorExit):
                raise
            except Exception as err:
                raise translate(err) from None
        return stream

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except Exception as err:
            raise translate(err) from None
    return call


#: What a visitor whose request arrives before the model is in memory is told (app.py serves the
#: page first, then loads: g4v.engines.deferred).
STILL_LOADING = "The model is still loading; your request starts as soon as it is ready."


def model_task(engine, gpu_task):
    """``gpu_task`` (the decorator every model-bound handler gets: ``spaces.GPU`` on ZeroGPU) that
    also tells a visitor, in one toast, when their request waits for the model's first load, so a
    request sent in the first seconds is not met by a silent spinner. Any other engine: ``gpu_task``."""
    if engine.is_loaded:  # loaded before the page was built
        return gpu_task

    def note() -> None:
        if not engine.is_loaded and engine.error is None:  # a failed load is its own one-line error
            gr.Info(STILL_LOADING)

    def decorate(fn):
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def stream(*args, **kwargs):
                note()
                yield from fn(*args, **kwargs)
            return gpu_task(stream)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            note()
            return fn(*args, **kwargs)
        return gpu_task(call)
    return decorate


class OutputBoxes:
    """Base of a dataclass holding an event's output components: :meth:`components` lists them in
    field order, which is the event's outputs list (and its API endpoint's results, by position),
    and the handler returns ``{box: value}`` (a box left out keeps what it shows), so no tuple has
    to be kept in step with that list by hand."""

    def components(self) -> list:
        """The boxes in field order: the event's outputs."""
        return [getattr(self, box.name) for box in dataclasses.fields(self)]


class ImageFile(gr.Image):
    """An image upload that hands its handler the uploaded file's path without opening it.

    ``gr.Image`` decodes (and converts) the picture while preprocessing, before any handler runs:
    a file that is not an image then fails with Gradio's multi-line error, and a huge picture is
    decoded before ``g4v.images.open_image`` can refuse it from its header. Here every check
    happens in ``open_image``. Gradio has already moved the upload into its cache and checked the
    path is one it received, so the path is safe to open. A template component: the browser shows
    it as a plain ``gr.Image``.
    """

    is_template = True

    def preprocess(self, payload):
        if payload is None:
            return None
        if payload.path is None:
            raise gr.Error("send the image as an uploaded file")
        return str(payload.path)


def image_input(**kwargs) -> ImageFile:
    """An upload-only image input whose handler gets the file's path, unopened (see ImageFile).
    ImageFile keeps gr.Image's own constructor: Gradio sends the browser the parameters of the
    class's ``__init__``, so an ``__init__`` of its own would hide them."""
    return ImageFile(type="filepath", image_mode=None, sources=["upload"], **kwargs)


#: What a seed box shows for :attr:`SamplingSettings.seed`'s None (a fresh seed each run).
RANDOM_SEED = -1


def seed_box_value(seed: int | None = SamplingSettings.seed) -> int:
    """A seed as a ``gr.Number`` shows it (None: :data:`RANDOM_SEED`)."""
    return RANDOM_SEED if seed is None else seed


def sampling_settings(max_new_tokens, temperature=SamplingSettings.temperature, top_p=SamplingSettings.top_p,
                      seed=RANDOM_SEED, limit: int = MAX_NEW_TOKENS) -> SamplingSettings:
    """Checked settings from the UI's sliders, or from API values that no slider bounded (NaN,
    fractions, strings): one :class:`G4VError` naming the first bad value. A seed of None, "" or
    :data:`RANDOM_SEED` is a fresh one."""
    whole_or_real = _real(seed) or (isinstance(seed, int) and not isinstance(seed, bool))  # 10**330 too
    if seed not in (None, "", RANDOM_SEED) and whole_or_real and not 0 <= seed <= MAX_SEED:
        # the box's label offers -1 too, so its refusal does (a 1e32 float included: no digits invented)
        raise G4VError(f"seed must be {RANDOM_SEED} (a fresh one each time) or a whole number from 0 to {MAX_SEED}, "
                       f"got {quoted(seed)}")
    seed = None if seed in (None, "", RANDOM_SEED) else _whole(seed, "seed")
    return SamplingSettings(
        max_new_tokens=_whole(max_new_tokens, "max_new_tokens"),
        temperature=_number(temperature, "temperature"),
        top_p=_number(top_p, "top_p"),
        seed=seed,
    ).validated(limit)


def _real(value) -> bool:
    """Whether ``value`` is a finite number (not a bool); a JSON integer too large for a float
    (10**330) is not."""
    try:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:
        return False


def _number(value, name: str) -> float:
    if not _real(value):
        raise G4VError(f"{name} must be a finite number, got {quoted(value)}")
    return float(value)


def optional_whole(value, name: str) -> int | None:
    """A whole number from a box or an API call (an int, a whole float, or its text), or None for an
    empty box: one :class:`G4VError` naming ``name`` for anything else."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        return parse_whole(name, value)  # the digits 0-9 only: "²" passes str.isdigit, "٣" int()
    return _whole(value, name)


#: The largest whole number a float (a JSON number, a box's value) holds exactly.
EXACT_FLOAT_WHOLE = 2**53


def _whole(value, name: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value  # exact, however large: the range checks of SamplingSettings refuse the rest
    number = _number(value, name)
    if not number.is_integer():
        raise G4VError(f"{name} must be a whole number, got {quoted(value)}")
    if abs(number) > EXACT_FLOAT_WHOLE:  # 1e32 is no whole number anyone typed: int() would invent its digits
        raise G4VError(f"{name} must be a whole number of at most {EXACT_FLOAT_WHOLE:,}, got {quoted(value)}")
    return int(number)


#: For a quick event whose output is an input box (a picture copied or rendered into it): Gradio
#: marks the outputs of a failed event with an "Error" badge that stays over the box, hiding the
#: next picture uploaded there; the refusal's toast is message enough.
QUIET_INPUT = {"show_progress": "hidden"}


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


def run_keeping_previous(button: gr.Button, fn, inputs: list, outputs: list, status: gr.Markdown, **settings):
    """Wire ``button`` to run ``fn`` and return that event. ``status`` is marked as the previous
    run's while the run starts (the mark is registered first: it shows before the run's own first
    update; on a :func:`status_line` the bar hides it until the run ends) and again when the run
    is refused, so a refusal leaves the results on show, marked, rather than emptying them or
    passing them off as its own. A refusal's "Error" badge, drawn on the outputs and on the box the
    bar is drawn over (``show_progress_on``), is taken off them all."""
    mark = previous_run_mark(status)
    button.click(**mark)
    event = button.click(fn, inputs, outputs, **settings)
    event.failure(**mark)  # writing the status line takes its badge off
    bar_boxes = settings.get("show_progress_on") or []
    bar_boxes = list(bar_boxes) if isinstance(bar_boxes, (list, tuple)) else [bar_boxes]
    badged = [box for box in dict.fromkeys([*outputs, *bar_boxes]) if box is not status]
    if badged:
        without_error_badges(event, badged)
    return event


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


def refuse_non_pictures(image: gr.Image) -> None:
    """A file ``image`` cannot show (not a picture, truncated, too many pixels) is taken out of the
    box as soon as it is uploaded, with one toast saying why, so no broken picture waits there for
    a Run to refuse it (the Tiling tab's own upload step does this for its box)."""

    @shows_errors
    def check(path):
        if path:
            from g4v.images import open_image

            open_image(path)
        return gr.skip()

    image.upload(check, image, image, api_visibility="private", **QUIET_INPUT).failure(
        lambda: None, None, image, api_visibility="private", queue=False, **QUIET_INPUT)


def last_chat_image_button(elem_id: str) -> gr.Button:
    """The "Use the last chat image" button of every picture tab: small, as a helper beside the
    picture, not the tab's action (wired by :func:`use_last_chat_image`)."""
    return gr.Button("Use the last chat image", size="sm", elem_id=elem_id)


def use_last_chat_image(button: gr.Button, last_chat_image: gr.State, image: gr.Image):
    """Wire a "Use the last chat image" button: it copies the newest chat image into ``image``.
    Returns the event, so a tab can chain its own step after it (``.success``: not after a refusal).

    A refusal is a toast, nothing else: no traceback in the server log, and no progress shown on
    ``image`` (see :data:`QUIET_INPUT`)."""

    @shows_errors
    def pick(path):
        if not path or not os.path.isfile(path):
            raise G4VError("no chat image yet: send a picture in the Chat tab first")
        return path

    return button.click(pick, last_chat_image, image, api_visibility="private", **QUIET_INPUT)


def time_left(done: float, total: float, elapsed: float) -> str:
    """``"about 40 s left"`` at the pace so far, for a progress line; empty before the first step
    ends and after the last (Gradio's own bar shows only the time elapsed)."""
    if not 0 < done < total:
        return ""
    return seconds_left(elapsed / done * (total - done))


def progress_line(progress):
    """``tell(fraction, text)``, the library's progress callback, for Gradio's ``progress``: the bar
    at ``fraction`` (0-1) with ``text`` and the time left at the pace since this call."""
    started = time.monotonic()

    def tell(fraction: float, text: str) -> None:
        left = time_left(fraction, 1.0, time.monotonic() - started)
        progress(fraction, desc=f"{text}, {left}" if left else text)

    return tell


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


def engine_line(engine, inspector: bool = False) -> str:
    """One line for Chat and each inspector: which model runs, and the vision LoRA's mode (in
    native mode Chat runs the vision model on image prompts and the base language model on
    text-only ones; an inspector always has an image)."""
    from g4v.checkpoint.vision_lora import describe
    from g4v.loading import model_name

    head = f"Model: {markdown_code(model_name(engine.info.model))} ({engine.info.backend})"
    lora, mode = engine.vision_lora, engine.vision_mode
    if lora is None:
        return head + ", no vision LoRA (its weights are the vision model)"
    runs = {"native": "the vision model" if inspector else
                      "the vision model on image prompts, the base language model on text-only ones",
            "merged": "the vision model (LoRA merged at load)", "off": "the base language model (vision LoRA off)"}[mode]
    return f"{head} · runs {runs} · {describe(mode, lora)}"
