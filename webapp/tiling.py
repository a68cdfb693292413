"""The Tiling tab: which anyres grid the model picks, and which pixels each image token covers."""

import gradio as gr

from g4v.errors import G4VError
from g4v.tiling import first_token_to_show, highlight_token, tiling_report, token_at
from viz.figures import original_point
from webapp.common import image_input, shows_errors, use_last_chat_image


def token_description(plan, index: int) -> str:
    token = plan.token(index)
    left, top, right, bottom = (round(v, 1) for v in token.box)
    where = f"tile {token.tile}, " if token.tile is not None else ""
    return (f"Token **{token.index}** of {plan.num_image_tokens}: {token.kind}, {where}row {token.row}, "
            f"column {token.col}; covers x {left}-{right}, y {top}-{bottom} of the original image.")


def make_handlers(config):
    @shows_errors
    def analyse(image_path):
        """Overlay, token-budget table and plan for one image; the first tile token selected."""
        if config is None:
            raise G4VError("the tiling inspector needs the model's config.json, which this backend does not expose")
        if not image_path:
            raise G4VError("upload an image first")
        overlay, rows, plan = tiling_report(image_path, config)
        first = first_token_to_show(plan)
        return overlay, rows, plan, first, highlight_token(image_path, plan, first), token_description(plan, first)

    @shows_errors
    def select_index(image_path, plan, index):
        if plan is None or not image_path:
            raise G4VError("analyse an image first")
        view = highlight_token(image_path, plan, index)  # checks the index and that the image is the plan's
        return view, token_description(plan, index)

    @shows_errors
    def select_click(image_path, plan, evt: gr.SelectData):
        """Clicking the token view picks the tile token under the pointer (else the base token)."""
        if plan is None or not image_path:
            raise G4VError("analyse an image first")
        height, width = plan.image_size
        x, y = original_point(*evt.index, (width, height))  # the token view may be drawn smaller
        token = token_at(plan, x, y) or token_at(plan, x, y, kind="base")
        if token is None:
            raise G4VError(f"no token covers pixel ({x}, {y})")
        return token.index, highlight_token(image_path, plan, token.index), token_description(plan, token.index)

    return analyse, select_index, select_click


def tiling_tab(config, last_chat_image: gr.State) -> None:
    gr.Markdown("Which anyres grid the model picks, how the image is resized and padded, and "
                "which pixels each image token covers.")
    with gr.Row():
        image = image_input(label="Image", height=320)
        with gr.Column():
            from_chat = gr.Button("Use the last chat image", elem_id="tiling-from-chat")
            table = gr.Dataframe(headers=["part", "layout", "tokens"], label="Token budget", interactive=False)
    overlay = gr.Image(label="Grid, tiles, padding and unpadded region", interactive=False, format="png",
                       elem_id="tiling-overlay")
    with gr.Row():
        token_view = gr.Image(label="Selected token (click a spot to pick its token)", interactive=False,
                              format="png")
        with gr.Column():
            token_index = gr.Number(label="Token index", precision=0, value=0)
            token_info = gr.Markdown()
    plan = gr.State(None)

    analyse, select_index, select_click = make_handlers(config)
    outputs = [overlay, table, plan, token_index, token_view, token_info]
    image.upload(analyse, image, outputs, api_name="tiling")
    use_last_chat_image(from_chat, last_chat_image, image).success(
        analyse, image, outputs, api_visibility="private")
    token_index.submit(select_index, [image, plan, token_index], [token_view, token_info], api_name="tiling_token")
    token_view.select(select_click, [image, plan], [token_index, token_view, token_info], api_visibility="private")
