"""The Tiling tab: which anyres grid the model picks, and which pixels each image token covers."""

import hashlib
from dataclasses import dataclass

import gradio as gr

from g4v.errors import G4VError
from g4v.tiling import token_at
from g4v.tiling.view import highlight_token, mark_token, tiling_report, token_at_overlay, token_to_show
from viz.figures import original_point
from webapp.common import QUIET_INPUT, OutputBoxes, shows_errors
from webapp.pictures import picture_row
from webapp.runs import emptied, without_error_badges


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


@dataclass
class TilingBoxes(OutputBoxes):
    """What analysing a picture fills, in ``/tiling``'s order (the states after the shown boxes)."""

    overlay: gr.Image
    table: gr.Dataframe
    plan: gr.State
    regions: gr.State  # where the overlay shows the canvas and the base view
    token_index: gr.Number
    token_view: gr.Image
    token_info: gr.Markdown
    analysed: gr.State  # the analysed file's fingerprint
    unmarked: gr.State  # the overlay as drawn, before the picked token is framed on it
    shown: gr.State  # the index of the token the pictures show (the number box goes back to it after a refusal)


def make_handlers(config, boxes: TilingBoxes) -> tuple:
    """The tab's handlers: analyse a picture, and pick a token by its index, by a click on the token
    view, or by a click on the overlay; each returns its values by box."""

    def picked(image_path, plan, regions, overlay, index) -> dict:
        """What every way of picking a token shows: the token view, its description and the
        overlay with the token framed (``overlay`` is the overlay as drawn, without a mark)."""
        view = highlight_token(image_path, plan, index)  # checks the index and the image's size
        return {boxes.token_view: view, boxes.token_info: token_description(plan, index),
                boxes.overlay: mark_token(overlay, plan, regions, index), boxes.shown: index}

    @shows_errors
    def analyse(image_path):
        """Tiling: how the model cuts one picture into tiles (which anyres grid, how it is resized
        and padded) and what its image tokens cost; the token at the picture's centre is selected.

        Args:
            image_path: the picture: a URL, or a data: URL for an upload.

        Returns:
            picture: the grid, tiles, padding and unpadded region drawn over the picture
            table: the token budget: part, layout and tokens for the base view, tiles, newlines and total
            token: the index of the selected token
            picture: the pixels the selected token covers
            text: the selected token's description (kind, tile, row, column, pixels covered)
        """
        if config is None:
            raise G4VError("the tiling inspector needs the model's config.json, which this backend does not expose")
        if not image_path:
            raise G4VError("upload an image first")
        overlay, rows, plan, regions = tiling_report(image_path, config)
        first = token_to_show(plan)
        return {**picked(image_path, plan, regions, overlay, first), boxes.table: rows, boxes.plan: plan,
                boxes.regions: regions, boxes.token_index: first, boxes.analysed: fingerprint(image_path),
                boxes.unmarked: overlay}

    @shows_errors
    def select_index(image_path, plan, analysed, regions, overlay, index):
        """Tiling: select another image token of the picture the tiling tool (in the same session)
        analysed last, by its index.

        Args:
            image_path: the same picture as that tiling call.
            index: the token's index, a whole number from 0 to the total the budget table gives, less 1.

        Returns:
            picture: the pixels the token covers
            text: the token's description (kind, tile, row, column, pixels covered)
            picture: the grid overlay with the token framed
        """
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
        return {boxes.token_index: token.index, **picked(image_path, plan, regions, overlay, token.index)}

    @shows_errors
    def select_on_overlay(image_path, plan, analysed, regions, overlay, evt: gr.SelectData):
        """Clicking the overlay picks the tile token of the canvas cell, or the base token, under the
        pointer (Gradio gives the point in the overlay picture's own pixels)."""
        check_same_image(image_path, plan, analysed)
        token = token_at_overlay(plan, regions or {}, *evt.index)
        if token is None:  # a title, a margin, a cut-off cell: a hint, the selection kept (no error badge)
            gr.Info("no token there: click a cell of the canvas (inside the dashed line) or of the base view")
            return gr.skip()
        return {boxes.token_index: token.index, **picked(image_path, plan, regions, overlay, token.index)}

    return analyse, select_index, select_click, select_on_overlay


def tiling_tab(config, last_chat_image: gr.State) -> None:
    gr.Markdown("Which anyres grid the model picks, how the image is resized and padded, and "
                "which pixels each image token covers.")
    # its own upload step refuses what is no picture (and empties the results)
    with picture_row("tiling", last_chat_image, height=320, refuse_on_upload=False) as row:
        table = gr.Dataframe(headers=list(BUDGET_COLUMNS), label="Token budget", interactive=False, wrap=True,
                             column_widths=list(BUDGET_COLUMNS.values()), elem_id="tiling-budget")
    image = row.image
    overlay = gr.Image(label="Grid, tiles, padding and unpadded region (click a cell to pick its token)",
                       interactive=False, format="png", elem_id="tiling-overlay")
    with gr.Row():
        # No label over the picture: it covered the top-left tokens (the Markdown beside it says what it shows).
        token_view = gr.Image(label="Selected token", show_label=False, interactive=False, format="png", height=420,
                              elem_id="tiling-token-view")
        with gr.Column():
            gr.Markdown("**Selected token** (click a spot on its picture, or type an index, to pick another)")
            token_index = gr.Number(label="Token index", value=0, elem_id="tiling-token-index")  # whole numbers checked by the plan, not rounded
            token_info = gr.Markdown(elem_id="tiling-token-info")
    boxes = TilingBoxes(overlay=overlay, table=table, plan=gr.State(None), regions=gr.State(None),
                        token_index=token_index, token_view=token_view, token_info=token_info,
                        analysed=gr.State(None), unmarked=gr.State(None), shown=gr.State(0))

    analyse, select_index, select_click, select_on_overlay = make_handlers(config, boxes)
    outputs = boxes.components()
    picking = [image, boxes.plan, boxes.analysed, boxes.regions, boxes.unmarked]
    # A refused upload (not a picture, too many pixels) leaves nothing behind: not the broken picture,
    # the previous picture's results, nor an "Error" badge over each output; the toast says why.
    image.upload(analyse, image, outputs, api_name="tiling").failure(
        lambda: {image: None, **emptied(outputs), token_index: 0, boxes.shown: 0}, None, [image, *outputs], api_visibility="private",
        queue=False, **QUIET_INPUT)
    row.from_chat.success(analyse, image, outputs, api_visibility="private")
    row.from_pdf.success(analyse, image, outputs, api_visibility="private")  # a PDF page, then its token budget
    # A refused pick (an index out of range, no picture analysed) is its toast: the pictures stay, and
    # the number box goes back to the token they show.
    shown_token = [token_view, token_info, overlay, boxes.shown]
    typed = token_index.submit(select_index, [*picking, token_index], shown_token, api_name="tiling_token")
    typed.failure(lambda index: index, boxes.shown, token_index, api_visibility="private", queue=False,
                  **QUIET_INPUT)
    without_error_badges(typed, shown_token)
    picked = [token_index, *shown_token]
    without_error_badges(token_view.select(select_click, picking, picked, api_visibility="private"), picked)
    without_error_badges(overlay.select(select_on_overlay, picking, picked, api_visibility="private"), picked)
