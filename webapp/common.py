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
APP_WORDING = [(re.compile(r"name it with --columns (\w+)=COLUMN"), r"type its name in the box '\1 column' (Column mapping)"),
               (re.compile(r"use --layers all "), "empty the box 'Window' and type all in 'Layers' ")]


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
