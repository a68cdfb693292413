"""The Tiling tab: which anyres grid the model picks, and which pixels each image token covers."""

import hashlib

import gradio as gr

from g4v.errors import G4VError
from g4v.tiling import first_token_to_show, token_at
from g4v.tiling_view import highlight_token, mark_token, tiling_report, token_at_overlay
from viz.figures import original_point
from webapp.common import (QUIET_INPUT, image_input, last_chat_image_button, shows_errors, use_last_chat_image,
                           without_error_badges)
from webapp.documents import document_picker


#: The token-budget table's columns and their widths: the layout wraps between words in the
#: column beside the picture, so the token counts stay in view (they were cut off at the right).
BUDGET_COLUMNS = {"part": "24%", "layout": "56%", "tokens": "20%"}


def token_description(plan, index: int) -> str:
    token = plan.token(index)
    left, top, right, bottom = (round(v, 1) for v in token.box)
    where = f"tile {token.tile}, " if token.tile is not None else ""
    return (f"Token **{token.index}** of {plan.num_image_tokens}: {token.kind}, {where}row {token.row}, "
            f"column {token.col}; covers x {left}-{right}, y {top}-{bottom} of the original image.")


def fingerprint(image_path) -> str:
    """The file's SHA-256: a token picked later must be about the picture that was analysed, not
    merely one of the same size."""
    with open(image_path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def check_same_image(image_path, plan, analysed: str | None) -> None:
    if plan is None or not image_path:
        raise G4VError("analyse an image first")
    if analysed is not None and fingerprint(image_path) != analysed:
        raise G4VError("the image changed since it was analysed: analyse it again")


def make_handlers(config):
    def picked(image_path, plan, regions, overlay, index) -> tuple:
        """What every way of picking a token shows: the token view, its description and the
        overlay with the token framed (``overlay`` is the overlay as drawn, without a mark)."""
        view = highlight_token(image_path, plan, index)  # checks the index and the image's size
        return view, token_description(plan, index), mark_token(overlay, plan, regions, index)

    @shows_errors
    def analyse(image_path):
        """Overlay, token-budget table and plan for one image; the first tile token selected (and
        the overlay without its mark, kept for the next pick)."""
        if config is None:
            raise G4VError("the tiling inspector needs the model's config.json, which this backend does not expose")
        if not image_path:
            raise G4VError("upload an image first")
        overlay, rows, plan, regions = tiling_report(image_path, config)
        first = first_token_to_show(plan)
        view, info, marked = picked(image_path, plan, regions, overlay, first)
        return marked, rows, plan, regions, first, view, info, fingerprint(image_path), overlay

    @shows_errors
    def select_index(image_path, plan, analysed, regions, overlay, index):
        check_same_image(image_path, plan, analysed)
        return picked(image_path, plan, regions, overlay, index)

    @shows_errors
    def select_click(image_path, plan, analysed, regions, overlay, evt: gr.SelectData):
        """Clicking the token view picks the tile token under the pointer (else the base token)."""
        check_same_image(image_path, plan, analysed)
        height, width = plan.image_size
        x, y = original_point(*evt.index, (width, height))  # the token view may be drawn smaller
        token = token_at(plan, x, y) or token_at(plan, x, y, kind="base")
        if token is None:
            raise G4VError(f"no token covers pixel ({x}, {y})")
        return token.index, *picked(image_path, plan, regions, overlay, token.index)

    @shows_errors
    def select_on_overlay(image_path, plan, analysed, regions, overlay, evt: gr.SelectData):
        """Clicking the overlay picks the tile token of the canvas cell, or the base token, under the
        pointer (Gradio gives the point in the overlay picture's own pixels)."""
        check_same_image(image_path, plan, analysed)
        token = token_at_overlay(plan, regions or {}, *evt.index)
        if token is None:  # a title, a margin, a cut-off cell: a hint, the selection kept (no error badge)
            gr.Info("no token there: click a cell of the canvas (inside the dashed line) or of the base view")
            return (gr.skip(),) * 4
        return token.index, *picked(image_path, plan, regions, overlay, token.index)

    return analyse, select_index, select_click, select_on_overlay


def tiling_tab(config, last_chat_image: gr.State) -> None:
    gr.Markdown("Which anyres grid the model picks, how the image is resized and padded, and "
                "which pixels each image token covers.")
    with gr.Row():
        image = image_input(label="Image", height=320, elem_id="tiling-image")
        with gr.Column():
            from_chat = last_chat_image_button("tiling-from-chat")
            from_pdf = document_picker(image, elem_id="tiling-doc")  # a PDF page, then its token budget
            table = gr.Dataframe(headers=list(BUDGET_COLUMNS), label="Token budget", interactive=False, wrap=True,
                                 column_widths=list(BUDGET_COLUMNS.values()), elem_id="tiling-budget")
    overlay = gr.Image(label="Grid, tiles, padding and unpadded region (click a cell to pick its token)",
                       interactive=False, format="png", elem_id="tiling-overlay")
    with gr.Row():
        token_view = gr.Image(label="Selected token (click a spot to pick another)", interactive=False,
                              format="png", height=420, elem_id="tiling-token-view")
        with gr.Column():
            token_index = gr.Number(label="Token index", value=0, elem_id="tiling-token-index")  # whole numbers checked by the plan, not rounded
            token_info = gr.Markdown(elem_id="tiling-token-info")
    plan = gr.State(None)
    regions = gr.State(None)  # where the overlay shows the canvas and the base view
    analysed = gr.State(None)  # the analysed file's fingerprint
    unmarked = gr.State(None)  # the overlay as drawn, before the picked token is framed on it

    analyse, select_index, select_click, select_on_overlay = make_handlers(config)
    outputs = [overlay, table, plan, regions, token_index, token_view, token_info, analysed, unmarked]
    picking = [image, plan, analysed, regions, unmarked]
    # A refused upload (not a picture, too many pixels) leaves nothing behind: not the broken picture,
    # the previous picture's results, nor an "Error" badge over each output; the toast says why.
    image.upload(analyse, image, outputs, api_name="tiling").failure(
        lambda: (None, None, None, None, None, 0, None, "", None, None), None, [image, *outputs],
        api_visibility="private", queue=False, **QUIET_INPUT)
    use_last_chat_image(from_chat, last_chat_image, image).success(
        analyse, image, outputs, api_visibility="private")
    from_pdf.success(analyse, image, outputs, api_visibility="private")
    # A refused pick (an index out of range, no picture analysed) is its toast: the pictures stay.
    picked = [token_index, token_view, token_info, overlay]
    without_error_badges(token_index.submit(select_index, [*picking, token_index], picked[1:], api_name="tiling_token"),
                         picked[1:])
    without_error_badges(token_view.select(select_click, picking, picked, api_visibility="private"), picked)
    without_error_badges(overlay.select(select_on_overlay, picking, picked, api_visibility="private"), picked)
