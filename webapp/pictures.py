"""The picture-input row, written once for every tab that reads a picture.

The picture on the left; on the right "Use the last chat image", the PDF page picker, then the
tab's own controls (the ``with`` block's body). Its element ids come from the tab's prefix
(``#deepstack-image``, ``#deepstack-from-chat``, ``#deepstack-doc-...``), which the browser tests use.
It lives beside ``webapp.common`` rather than in it because the PDF picker (``webapp.documents``)
is built on ``webapp.common`` itself.
"""

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import gradio as gr

from webapp.common import ImageFile, image_input, last_chat_image_button, refuse_non_pictures, use_last_chat_image
from webapp.documents import document_picker
from webapp.runs import status_line


@dataclass
class PictureRow:
    """What a tab wires after the row: its picture, and the events that fill it, to chain the tab's
    own step after (``.success``: not after a refusal)."""

    image: ImageFile
    #: "Use the last chat image" copying the newest chat picture into :attr:`image`.
    from_chat: object
    #: The PDF picker's page put into :attr:`image` (None without a picker).
    from_pdf: object | None
    #: The line under the picture that a long run's progress bar is drawn over (None without one).
    status: gr.Markdown | None


@contextmanager
def picture_row(prefix: str, last_chat_image: gr.State, *, label: str = "Image", height: int = 240, value=None,
                status: str | None = None, pdf: bool = True, refuse_on_upload: bool = True):
    """Render the row and yield its :class:`PictureRow`; the block's body goes in the column beside the
    picture, under the row's two helpers.

    ``status``: a hint shown under the picture, over which the run's progress bar is drawn (the hint
    hidden meanwhile, :func:`webapp.runs.status_line`), so the bar is in view while the run works (under the
    tab's button it was below the fold). ``pdf``:
    offer the PDF page picker. ``refuse_on_upload``: take a file that is no picture out of the box
    at once, with a toast (:func:`webapp.common.refuse_non_pictures`); off for a tab whose own
    upload step does that."""
    with gr.Row():
        with gr.Column() if status is not None else nullcontext():
            image = image_input(label=label, value=value, height=height, elem_id=f"{prefix}-image")
            line = None if status is None else status_line(status, elem_id=f"{prefix}-status")
        if refuse_on_upload:
            refuse_non_pictures(image)
        with gr.Column():
            from_chat = use_last_chat_image(last_chat_image_button(f"{prefix}-from-chat"), last_chat_image, image)
            from_pdf = document_picker(image, elem_id=f"{prefix}-doc") if pdf else None
            yield PictureRow(image=image, from_chat=from_chat, from_pdf=from_pdf, status=line)
