"""The Chat tab's history as Gradio keeps it, read as a g4v conversation and written from one.

Gradio's chat history is a list of entries (role and content, an uploaded picture and the text sent
with it as separate entries, every text kept escaped because the chat renders Markdown); the model
takes a conversation of :class:`~g4v.conversation.Message`. This module goes both ways, and fits
a long conversation: the oldest turns go when the pictures exceed
:data:`~g4v.conversation.MAX_IMAGES_PER_CONVERSATION`, and a history picture that Gradio's cache
has since deleted is left out and counted.

Memory stays bounded however long a conversation grows: the history's pictures are read as paths,
and only those of the turns the prompt keeps are decoded (:func:`opened`), each reduced as soon as
it is decoded to the size the model's processor resizes it to anyway
(:class:`~g4v.evaluate.data.PictureFit`, as dataset pictures are).
"""

import os
from dataclasses import dataclass, field

from g4v.conversation import MAX_IMAGES_PER_CONVERSATION, MAX_IMAGES_PER_MESSAGE, Message, validate_conversation
from g4v.errors import G4VError
from g4v.evaluate.data import PictureFit
from g4v.images import open_image
from webapp.common import escape_markdown, unescape_markdown


# ── Gradio messages -> g4v conversation ────────────────────────────────────────────────────────


def file_path(item) -> str | None:
    """The server path of an uploaded file in any of the shapes Gradio uses for it."""
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        if item.get("type") == "file":
            item = item.get("file") or {}
        return item.get("path")
    return getattr(item, "path", None)


def content_parts(content) -> tuple[list[str], list[str]]:
    """(texts, file paths) of one Gradio message's content."""
    texts, files = [], []
    for part in content if isinstance(content, (list, tuple)) else [content]:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type") == "text":
            texts.append(part.get("text") or "")
        elif (path := file_path(part)) is not None:
            files.append(path)
    return texts, files


def read_message(message, context_window: int | None = None, fit: PictureFit | None = None) -> Message:
    """The textbox value (``{"text", "files"}``) as a checked user message with opened pictures
    (each reduced by ``fit`` as it is decoded); its text is checked against the limit of the
    engine's ``context_window`` (the limit the engine itself would name), so the first refusal
    states the real one."""
    if not isinstance(message, dict):
        raise G4VError("the message is empty: type a question")
    files = [file_path(f) for f in message.get("files") or []]
    if len(files) > MAX_IMAGES_PER_MESSAGE:
        raise G4VError(f"too many images: {len(files)} in one message, the limit is {MAX_IMAGES_PER_MESSAGE}")
    if any(path is None for path in files):
        raise G4VError("an attached file could not be read: attach it again")
    user = Message("user", message.get("text") or "", [open_image(path, fit=fit) for path in files])
    validate_conversation([user], context_window=context_window)
    return user


@dataclass
class History:
    """The earlier turns as g4v messages, and what could not be carried over. Their pictures are
    still the files' paths: :func:`opened` decodes those of the turns the prompt keeps."""

    messages: list[Message] = field(default_factory=list)
    missing_images: int = 0  # history pictures no longer on disk (Gradio's cache deleted them)


def read_history(history: list) -> History:
    """Chat history entries -> g4v messages, pictures as paths. Consecutive entries of one role are
    merged (Gradio stores an uploaded file and the text sent with it as separate entries)."""
    out = History()
    for entry in history or []:
        entry = entry if isinstance(entry, dict) else {"role": getattr(entry, "role", None),
                                                       "content": getattr(entry, "content", None)}
        role = entry.get("role")
        texts, files = content_parts(entry.get("content"))
        texts = [unescape_markdown(text) for text in texts]  # shown as text (see user_entry), read as written
        images = [path for path in files if path and os.path.isfile(path)]
        out.missing_images += len(files) - len(images)
        text = "\n".join(t for t in texts if t)
        if out.messages and out.messages[-1].role == role:
            previous = out.messages[-1]
            previous.text = "\n".join(t for t in (previous.text, text) if t)
            previous.images.extend(images)
        else:
            out.messages.append(Message(role, text, images))
    return out


# ── fitting a long conversation ────────────────────────────────────────────────────────────────


def opened(messages: list[Message], fit: PictureFit | None = None) -> list[Message]:
    """``messages`` with the pictures still named by path decoded (each reduced by ``fit``)."""
    return [Message(m.role, m.text, [open_image(image, fit=fit) if isinstance(image, (str, os.PathLike)) else image
                                     for image in m.images]) for m in messages]


def drop_oldest_turn(messages: list[Message]) -> list[Message]:
    """The conversation without its oldest exchange (a user message and the replies up to the next
    user message); a leading system message stays."""
    head = [m for m in messages[:1] if m.role == "system"]
    rest = messages[len(head):]
    next_user = next((i for i, m in enumerate(rest) if i > 0 and m.role == "user"), len(rest))
    return head + rest[next_user:]


def within_image_limit(messages: list[Message], limit: int = MAX_IMAGES_PER_CONVERSATION) -> tuple[list[Message], int]:
    """Drop the oldest turns until the conversation carries at most ``limit`` pictures; returns the
    conversation and how many turns were dropped. The newest message is never dropped."""
    dropped = 0
    while sum(len(m.images) for m in messages) > limit and len(messages) > 1:
        messages, dropped = drop_oldest_turn(messages), dropped + 1
    return messages, dropped


# ── g4v conversation -> Gradio messages ────────────────────────────────────────────────────────


def user_entry(message: dict) -> dict:
    """The message as one chat-history entry: pictures first, then the text. The chat renders
    Markdown and HTML, so every text of the history is kept escaped (:func:`escape_markdown`: a
    dataset prompt sent with "Open in Chat", a model's answer, shows as written, never as markup),
    and :func:`read_history` reads it back as written."""
    files = [{"path": file_path(f)} for f in message.get("files") or []]  # Gradio shows images as images
    text = [{"type": "text", "text": escape_markdown(message["text"])}] if message.get("text") else []
    return {"role": "user", "content": files + text}


def answer_entry(text: str) -> dict:
    """An answer as one chat-history entry, escaped as :func:`user_entry` says."""
    return {"role": "assistant", "content": escape_markdown(text)}


def newest_image(message: dict | None, history: list) -> str | None:
    """The newest picture of the conversation, for the "Use the last chat image" buttons."""
    paths = []
    for entry in history or []:
        paths.extend(content_parts(entry.get("content") if isinstance(entry, dict) else None)[1])
    paths.extend(file_path(f) for f in (message or {}).get("files") or [])
    return next((p for p in reversed(paths) if p and os.path.isfile(p)), None)
