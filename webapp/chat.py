"""The Chat tab: a streamed, multi-turn, multi-image chat with the loaded engine.

It is built from a ``gr.Chatbot`` and a ``gr.MultimodalTextbox`` rather than ``gr.ChatInterface``:
ChatInterface (Gradio 6.31) clears and disables its textbox before the answer starts and leaves it
disabled when the answer fails. Here a message is checked first and only then taken out of the box,
so a refusal leaves the box usable with the text and pictures still in it; a request that fails
later puts the message back. Nothing a user sent is lost. An attachment that is not a readable
picture is taken out of the box at once, with a toast and a line under the box that stays until
the message is sent (a toast is easy to miss, and the text would go without the picture).

Long conversations stay answerable: the oldest turns are dropped, with a note, when the pictures
exceed :data:`~g4v.conversation.MAX_IMAGES_PER_CONVERSATION` or the prompt no longer fits the
model's context window; a history picture that Gradio's cache has since deleted is left out. How
the history is read, fitted and written, with memory bounded: :mod:`webapp.chat_history`.

The same function answers the ``/chat`` API endpoint (``message, max_new_tokens, temperature,
top_p, seed``), with the conversation kept per client session, one message at a time.
"""

import threading
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import gradio as gr

from g4v.conversation import MAX_NEW_TOKENS, Message, SamplingSettings, validate_conversation
from g4v.errors import G4VError, PromptTooLong
from g4v.evaluate.data import PictureFit
from webapp.chat_history import (History, answer_entry, drop_oldest_turn, newest_image, opened, read_history,
                                 read_message, user_entry, within_image_limit)
from webapp.common import (CHAT_QUEUE, MODEL_QUEUE, RANDOM_SEED, OutputBoxes, sampling_settings, seed_box_value,
                           shows_errors)
from webapp.documents import chat_documents, chat_examples, left_out_line
from webapp.mcp import from_mcp
from webapp.runs import without_error_badges
from webapp.sessions import session_key


def start_answer(engine, messages: list[Message], settings: SamplingSettings,
                 cancel: threading.Event) -> tuple[Iterator[str], int]:
    """``engine.stream`` on the longest tail of the conversation that fits the context window.

    Engines check the prompt's length before the first piece streams and raise
    :class:`PromptTooLong`; each time, the oldest turn goes. Returns ``(stream, turns dropped)``.
    """
    dropped = 0
    while True:
        try:
            stream = engine.stream(messages, settings, cancel=cancel)
            first = next(stream, None)  # some engines (vLLM) report the length with the first piece
            return _chain(first, stream), dropped
        except PromptTooLong:
            if len(messages) <= 1:
                raise G4VError("the message alone is too long for the model's context window: shorten it, "
                               "send fewer pictures or ask for fewer new tokens") from None
            messages, dropped = drop_oldest_turn(messages), dropped + 1


def _chain(first, stream):
    """``first`` then the rest of ``stream``; closing this closes ``stream`` (which stops generation)."""
    if first is not None:
        yield first
    yield from stream


def conversation_notes(history: History, dropped_turns: int) -> list[str]:
    notes = []
    if history.missing_images:
        notes.append(f"{history.missing_images} earlier picture(s) are no longer available and were left out")
    if dropped_turns:
        notes.append(f"the {dropped_turns} oldest turn(s) were left out to fit the model's limits; "
                     "press Clear to start a new conversation")
    return notes


def answer(engine, message: Message, history: list, settings: SamplingSettings, cancel: threading.Event,
           fit: PictureFit | None = None):
    """Stream the answer to ``message`` after ``history``: yields the text so far. Only the history
    pictures of the turns kept are decoded (reduced by ``fit``). Notes about left out turns and
    pictures are shown as warnings."""
    past = read_history(history)
    messages = past.messages + [message]
    validate_conversation(messages)
    messages, dropped_for_images = within_image_limit(messages)
    messages = opened(messages, fit)
    stream, dropped_for_length = start_answer(engine, messages, settings, cancel)
    for note in conversation_notes(past, dropped_for_images + dropped_for_length):
        gr.Warning(note)
    yield from at_most_every(_texts_so_far(stream), STREAM_INTERVAL_S)


#: How often an answer's text is sent to the page while it streams, at most: every update costs
#: the server a pass through Gradio's queue (a thread hop, a diff, a message), which a decoding
#: model pays for on every token; 20 updates a second still reads as smooth.
STREAM_INTERVAL_S = 0.05


def _texts_so_far(stream: Generator[str, None, None]) -> Generator[str, None, None]:
    """The text so far after each piece; closing this closes ``stream`` (which stops generation)."""
    text = ""
    try:
        for piece in stream:
            text += piece
            yield text
    finally:
        stream.close()


def at_most_every(texts: Generator[str, None, None], seconds: float) -> Generator[str, None, None]:
    """``texts`` (each the whole text so far) passed on at most once every ``seconds``: the first at
    once, then the newest one whenever ``seconds`` have passed, and always the last. Closing this
    closes ``texts`` (the stop button stops generation)."""
    last_sent, pending = None, None
    try:
        for text in texts:
            now = time.monotonic()
            if last_sent is None or now - last_sent >= seconds:
                last_sent, pending = now, None
                yield text
            else:
                pending = text
        if pending is not None:
            yield pending
    finally:
        texts.close()


# ── the tab ─────────────────────────────────────────────────────────────────────────────────────

#: Said under the chat: a small model easily answers a new picture's question about an earlier one.
CONTEXT_NOTE = ("Each message is answered with the whole conversation in view, earlier pictures included "
                "(\"Open in Chat\" in Evaluate adds to it too): to ask about a picture on its own, press Clear first.")


@dataclass
class Taking(OutputBoxes):
    """What checking a message writes: the box (emptied, disabled) and the checked message kept."""

    box: gr.MultimodalTextbox
    sending: gr.State  # the message as sent, put back in the box if the answer fails
    checked: gr.State  # the same message as read: text and opened pictures
    before: gr.State  # the history before it
    settings: gr.State  # the sampling settings as checked


@dataclass
class Answering(OutputBoxes):
    """What an answer writes as it streams."""

    chatbot: gr.Chatbot
    last_image: gr.State  # the newest chat picture, for the other tabs
    box: gr.MultimodalTextbox  # enabled again at the end, or given the message back
    newest_answer: gr.State  # the answer as the model wrote it, for the structured panel


class OneMessageAtATime:
    """The ``/chat`` sessions answering now. Each call reads the session's conversation (a
    ``gr.State``) as it starts and writes it as it ends: a second message sent while the first
    streams would miss the first turn and write over it, so it is refused in one line. Held in the
    server's process: on ZeroGPU a gpu_task runs in a worker process, unseen by the next call."""

    def __init__(self):
        self._lock, self._answering = threading.Lock(), set()

    @contextmanager
    def answering(self, session: str | None):
        """Hold ``session`` while its answer streams, released however it ends (done, failed, or
        closed by a cancelling client); None (no session, or an MCP call) holds nothing."""
        with self._lock:
            if session in self._answering:
                raise G4VError("this session is still answering its previous message: send the next one "
                               "when that answer ends (a new client is a new conversation)")
            if session is not None:
                self._answering.add(session)
        try:
            yield
        finally:
            with self._lock:
                self._answering.discard(session)


@dataclass
class ApiBoxes(OutputBoxes):
    """The ``/chat`` endpoint's results."""

    answer: gr.Textbox
    history: gr.State  # the session's conversation


def chat_tab(engine, last_chat_image: gr.State, examples: list[list], concurrency: int = 1,
             gpu_task=lambda fn: fn, config=None) -> gr.MultimodalTextbox:
    """Render the Chat tab into the current ``gr.Blocks``; returns its message box, which other
    tabs fill (the Evaluate tab's "Open in Chat"). ``config``: the model's transformers config
    (None where unknown, a server's), which the pictures are fitted to as they are decoded."""

    # Answers run together where the engine answers several chats at once (the transformers engine's
    # decode loop batches them; vLLM and a server schedule them), in a group of their own, so an
    # inspector's run waits for one decode step, not for whole answers; else one at a time, in
    # turn with every other model-bound event.
    streams = engine.concurrent_streams if engine is not None else 1  # None: a page built without a model
    fit = PictureFit.for_configs([config]) if config is not None else PictureFit()
    queue = ({"concurrency_id": CHAT_QUEUE, "concurrency_limit": streams} if streams > 1 else
             {"concurrency_id": MODEL_QUEUE, "concurrency_limit": concurrency})

    @shows_errors
    def accept(message, history, max_new_tokens=SamplingSettings.max_new_tokens,
               temperature=SamplingSettings.temperature, top_p=SamplingSettings.top_p, seed=RANDOM_SEED):
        """Check the message (its pictures opened once, here) and the sampling settings; only then
        clear the box (disabled while the answer streams). Both checks run here, outside the model's
        queue, so a refusal shows at once even while other visitors' answers hold the model."""
        settings = sampling_settings(max_new_tokens, temperature, top_p, seed)
        user = read_message(message, engine.context_window(), fit)
        return {taking.box: gr.MultimodalTextbox(value=None, interactive=False), taking.sending: message,
                taking.checked: user, taking.before: history, taking.settings: settings}

    @gpu_task
    @shows_errors
    def respond(message, user, history, settings):
        """Stream the answer into the chat (``user`` and ``settings`` as :func:`accept` checked them);
        the box comes back enabled at the end. If the answer fails, the message goes back into the box
        and the history is as it was, then the error shows: the updates are sent before the error, so
        no later event has to run for them."""
        shown = [*history, user_entry(message)]
        image = newest_image(message, history)
        text = ""
        try:
            for text in answer(engine, user, history, settings, threading.Event(), fit):
                yield {answering.chatbot: [*shown, answer_entry(text)], answering.last_image: image,
                       answering.newest_answer: text}
        except Exception:
            yield {answering.chatbot: history, answering.box: gr.MultimodalTextbox(value=message, interactive=True)}
            raise
        yield {answering.chatbot: [*shown, answer_entry(text)], answering.last_image: image,
               answering.box: gr.MultimodalTextbox(interactive=True), answering.newest_answer: text}

    @gpu_task
    @shows_errors
    def stream_api_answer(message, user, history, settings):
        """:func:`api_chat`'s answer, streamed (``user`` and ``settings`` as it checked them)."""
        text = ""
        for text in answer(engine, user, history, settings, threading.Event(), fit):
            yield {api.answer: text}
        yield {api.answer: text, api.history: [*history, user_entry(message), answer_entry(text)]}

    api_sessions = OneMessageAtATime()

    @shows_errors
    def api_chat(message, history, max_new_tokens, temperature, top_p, seed, request: gr.Request):
        """Ask the model a question, with up to 4 pictures; streams the answer. Through the API a
        session keeps the conversation (older turns are dropped when it outgrows the context) and takes
        one message at a time; through MCP each call is a conversation of its own (one shared session).

        Args:
            message: the question: {"text": the prompt, "files": pictures (URLs, or data: URLs for uploads)}.
            max_new_tokens: most tokens the answer may have, a whole number from 1 to 1024.
            temperature: 0 for greedy decoding (the same answer every time), or from 0.01 to 2.
            top_p: nucleus sampling's probability mass, from 0.05 to 1.
            seed: the sampling seed, a whole number; -1 for a fresh random one.

        Returns:
            the model's answer, as text
        """
        mcp = from_mcp(request)  # an MCP call: a conversation of its own, beside the shared session's others
        settings = sampling_settings(max_new_tokens, temperature, top_p, seed)
        user = read_message(message, engine.context_window(), fit)
        with api_sessions.answering(None if mcp else session_key(request)):
            yield from stream_api_answer(message, user, [] if mcp else history, settings)

    chatbot = gr.Chatbot(label="Chat", height=460, elem_id="chatbot")
    # A PDF attached here goes to the "From a PDF" picker below (chat_documents), for its pages.
    box = gr.MultimodalTextbox(file_types=["image", ".pdf"], file_count="multiple", sources=["upload"],
                               placeholder="Ask about an image or a PDF...", show_label=False, elem_id="chat-box")
    left_out = gr.Markdown(visible=False, elem_id="chat-left-out")  # what the box took out, in sight until sent
    gr.Markdown(CONTEXT_NOTE, elem_id="chat-context-note")
    with gr.Row():
        stop = gr.Button("Stop", size="sm", elem_id="chat-stop")
        clear = gr.Button("Clear", size="sm", elem_id="chat-clear")
    # The newest answer the model wrote in this session: the structured panel reads it (written here,
    # by the server; a client's chat history never chooses what the panel checks).
    newest_answer = gr.State(None)
    follow_answers, task, schema = chat_documents(box, newest_answer, left_out)  # PDF pages, task presets, the structured panel
    with gr.Accordion("Sampling", open=False):
        max_new_tokens = gr.Slider(1, MAX_NEW_TOKENS, value=SamplingSettings.max_new_tokens, step=1, label="Max new tokens")
        temperature = gr.Slider(0.0, 2.0, value=SamplingSettings.temperature, step=0.05, label="Temperature (0 = greedy)")
        top_p = gr.Slider(0.05, 1.0, value=SamplingSettings.top_p, step=0.05, label="Top-p")
        seed = gr.Number(value=seed_box_value(), label=f"Seed ({RANDOM_SEED} = random)")  # checked by sampling_settings
    chat_examples(examples, box, task, schema)  # a document example also picks its task preset
    sending = gr.State(None)  # the message being answered, put back in the box if the answer fails
    checked = gr.State(None)  # the same message as accept() read it: text and opened pictures
    checked_settings = gr.State(None)  # the sampling settings as accept() checked them
    before = gr.State([])  # the history before it
    api_history = gr.State([])  # the /chat endpoint's conversation, per client session

    taking = Taking(box=box, sending=sending, checked=checked, before=before, settings=checked_settings)
    answering = Answering(chatbot=chatbot, last_image=last_chat_image, box=box, newest_answer=newest_answer)

    # A refusal shows as a toast only: Gradio's error panel would cover the chat and the box
    # (show_progress="hidden"), and the check writes nothing but the box, so only the box is its output.
    accepted = box.submit(accept, [box, chatbot, max_new_tokens, temperature, top_p, seed], taking.components(),
                          api_visibility="private", show_progress="hidden")
    shown = accepted.success(lambda message, history: {chatbot: [*history, user_entry(message)], left_out: left_out_line()},
                             [sending, before], [chatbot, left_out], api_visibility="private", queue=False,
                             show_progress="hidden")
    answered = shown.success(
        respond, [sending, checked, before, checked_settings], answering.components(),
        api_visibility="private", show_progress="minimal", **queue)
    follow_answers(answered, started=shown)
    without_error_badges(answered, [chatbot])  # a refused answer is its toast; the message is back in the box
    stop.click(lambda: gr.MultimodalTextbox(interactive=True), None, box, cancels=[answered], api_visibility="private")
    follow_answers(clear.click(lambda: {chatbot: [], box: gr.MultimodalTextbox(interactive=True), newest_answer: None},
                               None, [chatbot, box, newest_answer], cancels=[answered],
                               api_visibility="private"))  # and empties the structured panel

    api_answer = gr.Textbox(visible=False)
    api = ApiBoxes(answer=api_answer, history=api_history)
    gr.Button(visible=False).click(
        api_chat, [box, api_history, max_new_tokens, temperature, top_p, seed], api.components(),
        api_name="chat", **queue)
    return box
