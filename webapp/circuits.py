"""The Circuits tab: where the language model reads the picture (attention from one text token to
every image token, by layer), which text tokens read a region of it (the reverse view), and what
blocking that reading changes (attention knockout), and which injection level carries the
difference between two pictures (patching). The work is :mod:`g4v.circuits`; every view
writes the same JSON and PNG files as ``python -m g4v circuits ... --out`` into the visitor's own
export folder."""

from dataclasses import dataclass, fields

import gradio as gr

from g4v.circuits.attention import image_attention
from g4v.circuits.common import ANSWER_TOKENS, CircuitSettings, check_new_tokens
from g4v.circuits.exports import draw, write_view
from g4v.circuits.knockout import WHY_LITTLE_CHANGES, attention_knockout
from g4v.circuits.patching import DIRECTION_CHOICES, patch_levels
from g4v.circuits.reverse import region_attention
from g4v.errors import G4VError, quoted
from g4v.images import open_image
from webapp.circuits_picker import wire_region_picker
from webapp.common import (MODEL_QUEUE, OutputBoxes, image_input, markdown_code, optional_whole,
                           refuse_non_pictures, shows_errors)
from webapp.pictures import picture_row
from webapp.runs import STATUS_HEIGHT, empties_on, live_progress, previous_run_mark, run_keeping_previous
from webapp.sessions import SessionStores, session_key

DEFAULTS = CircuitSettings()
LAYERS_HELP = "Layers: all, N, or A-B (inclusive)"
#: Which bundled examples share a tiling grid (tests/test_circuits_patching.py checks the pairs).
PATCH_PAIRS = (("shapes-wide.png", "chart-bars.png"), ("report-chart.png", "report-table.png"))
PICTURE_B_LABEL = "Picture B (tiled as A, the main picture)"  # a label of 179 characters was cut off over the box
PICTURE_B_HINT = ("Picture B must have A's tiling grid: a picture of A's size, or among the examples "
                  + " or ".join(f"`{a}` with `{b}`" for a, b in PATCH_PAIRS) + ".")


def settings_from_inputs(layers=None, token=None, window=None, max_new_tokens=DEFAULTS.max_new_tokens,
                         box=None, levels=None, direction=None, region=None,
                         complement=DEFAULTS.complement) -> CircuitSettings:
    """The checked settings from the tab's boxes (or from API values no box bounded); an empty
    text box keeps the default."""
    texts = {"layers": layers, "box": box, "levels": levels, "direction": direction, "region": region}
    for name, value in texts.items():
        if value is not None and not isinstance(value, str):
            raise G4VError(f"{name} must be text, got {quoted(value)}")
    given = {name: value.strip() for name, value in texts.items() if value is not None and value.strip()}
    tokens = optional_whole(max_new_tokens, ANSWER_TOKENS)  # named as the boxes say it, not by the settings field
    if not isinstance(complement, bool):
        raise G4VError(f"complement is true or false, got {quoted(complement)}")
    return CircuitSettings(**given, complement=complement, token=optional_whole(token, "the token position"),
                           window=optional_whole(window, "the window"),
                           max_new_tokens=DEFAULTS.max_new_tokens if tokens is None else check_new_tokens(tokens))


def code_cell(text: str) -> str:
    """``text`` (a token, an answer) as code in a Markdown table cell: its repr (a ``|`` escaped, as
    in ``<|end_of_text|>``: it would end the cell)."""
    return markdown_code(repr(text), in_table=True)


def attention_report(attention) -> str:
    """The per-layer share of the query's attention on the picture (an
    :class:`~g4v.circuits.attention.ImageAttention`), as a Markdown table."""
    kinds, shares = attention.share_by_kind(), attention.image_share.tolist()
    rows = [f"**Query:** position {attention.query_position} {markdown_code(repr(attention.query_token))}; "
            f"{attention.num_image_tokens} image tokens, {attention.num_heads} heads",
            "", "| layer | image share | base view | tiles | newlines | injected here |", "|---|---|---|---|---|---|"]
    for i, layer in enumerate(attention.layers):
        rows.append(f"| {layer} | {shares[i]:.3f} | {kinds['base'][i]:.3f} | {kinds['tile'][i]:.3f} "
                    f"| {kinds['newline'][i]:.3f} | {attention.injection_layers.get(layer, '')} |")
    return "\n".join(rows)


def reverse_report(region) -> str:
    """The text tokens that read the region most (a :class:`~g4v.circuits.reverse.RegionAttention`)."""
    kinds = [token.kind for token in region.region_tokens]
    rows = [f"**Region** {','.join(map(str, region.region))}: {kinds.count('tile')} tile and "
            f"{kinds.count('base')} base-view tokens; layers {region.layers[0]}-{region.layers[-1]}. "
            "The text tokens that attend to it most (mean over those layers):",
            "", "| position | part | mean attention | token |", "|---|---|---|---|"]
    for token in region.top_text_tokens:
        rows.append(f"| {token.position} | {region.part(token.position)} | {token.mean_attention:.4f} "
                    f"| {code_cell(token.text)} |")
    return "\n".join(rows)


def knockout_report(knockout) -> str:
    """Before and after a :class:`~g4v.circuits.knockout.KnockoutResult`, as a Markdown table."""
    token = code_cell(knockout.answer_token)
    return "\n".join([
        f"**Knocked out** at layers {', '.join(map(str, knockout.layers))}: the answer positions (from "
        f"{knockout.answer_position} on) may not attend to the image there.",
        "", f"| run | log-probability of {token} | top first token | greedy answer |", "|---|---|---|---|",
        f"| unchanged | {knockout.logprob_before:.4f} | {token} | {code_cell(knockout.continuation_before)} |",
        f"| knocked out | {knockout.logprob_after:.4f} ({knockout.logprob_change:+.4f}) | "
        f"{code_cell(knockout.top_token_after)} | {code_cell(knockout.continuation_after)} |",
        *(["", WHY_LITTLE_CHANGES] if knockout.barely_changed else [])])


PATCH_COLUMNS = ["run", "levels patched", "log-odds", "moved", "top first token", "greedy answer"]


def patching_rows(patching) -> list[list]:
    """One row per patched run (each level alone, or every level but it, then every level: the
    bound), per direction of a :class:`~g4v.circuits.patching.PatchingResult`."""
    rows = []
    for direction in patching.directions:
        run = f"{direction.receiver} with {direction.donor}'s features"
        for patched in direction.runs:
            moved = "" if patched.moved is None else round(patched.moved, 3)
            rows.append([run, patched.label, round(patched.logodds, 3), moved,
                         repr(patched.top_token), repr(patched.continuation)])
    return rows


def patching_report(patching) -> str:
    lines = [f"**{patching.num_patched_tokens} of {patching.num_image_tokens} image tokens patched** "
             f"(region {markdown_code(patching.region)}). Log-odds: log p(donor's first answer token) - log p(receiver's); "
             "moved: the share of the way from the receiver's own log-odds (0) to the donor's (1)."]
    for direction in patching.directions:
        receiver, donor = direction.receiver, direction.donor
        note = " Both pictures give the same first token: nothing to move." if direction.same_first_token else ""
        lines.append(f"**{receiver} with {donor}'s features:** {receiver} answers "
                     f"{markdown_code(repr(direction.receiver_continuation))} "
                     f"(log-odds {direction.logodds_receiver:+.3f}), {donor} answers "
                     f"{markdown_code(repr(direction.donor_continuation))} ({direction.logodds_donor:+.3f}).{note}")
    return "\n\n".join(lines)


@dataclass
class AttentionBoxes(OutputBoxes):
    """The attention view's results, in ``/circuits_attention``'s order."""

    report: gr.Markdown
    share: gr.Image
    tiles: gr.Image
    base: gr.Image
    export: gr.File
    kept: gr.State  # (picture path, ImageAttention): the head picker redraws the maps from it (no API output)


#: The head picker's choice for the maps averaged over heads.
ALL_HEADS = "all heads (mean)"


def head_choices(kept) -> dict:
    """The head picker after a run: every head of the model, the mean first and chosen."""
    heads = kept[1].num_heads if kept else 0
    return gr.update(choices=[ALL_HEADS, *(f"head {h}" for h in range(heads))], value=ALL_HEADS)


def head_maps(view: AttentionBoxes):
    """The head picker's handler: the tile and base-view maps of the kept run redrawn for one head
    (or the mean), no model pass."""

    @shows_errors
    def redraw(kept, choice):
        if not kept:
            return gr.skip()
        from viz.circuits import attention_map_figure

        image_path, result = kept
        head = None if choice in (None, ALL_HEADS) else int(str(choice).removeprefix("head "))
        picture = open_image(image_path)
        return {view.tiles: attention_map_figure(picture, result, "tile", head),
                view.base: attention_map_figure(picture, result, "base", head)}

    return redraw


@dataclass
class ReverseBoxes(OutputBoxes):
    """The reverse view's results, in ``/circuits_reverse``'s order."""

    report: gr.Markdown
    picture: gr.Image
    export: gr.File


@dataclass
class KnockoutBoxes(OutputBoxes):
    """The knockout's results, in ``/circuits_knockout``'s order."""

    report: gr.Markdown
    export: gr.File


@dataclass
class PatchBoxes(OutputBoxes):
    """Patching's results, in ``/circuits_patch``'s order."""

    report: gr.Markdown
    table: gr.Dataframe
    picture: gr.Image
    export: gr.File


@dataclass
class CircuitBoxes:
    """Each view's result boxes (what :func:`circuits_tab` builds and returns)."""

    attention: AttentionBoxes
    reverse: ReverseBoxes
    knockout: KnockoutBoxes
    patch: PatchBoxes

    def views(self) -> list[OutputBoxes]:
        return [getattr(self, view.name) for view in fields(self)]


def make_handlers(engine, sessions: SessionStores, gpu_task, boxes: CircuitBoxes):
    """The tab's four runs, in :class:`CircuitBoxes`' order, each wrapped for one-line refusals and
    returning its values by box (``boxes``); each writes its export files into the visitor's own
    store and shows their paths."""

    def run_view(view: str, work, image_path, prompt, settings, request, progress, other_path=None):
        if not image_path:
            raise G4VError("the circuits views need an image: upload one first")
        picture = open_image(image_path)
        if view == "patch" and not other_path:
            raise G4VError("patching needs picture B too: upload it in the second box")
        with live_progress(progress) as tell:
            tell(0.0, "preparing the picture and the prompt")
            others = (open_image(other_path),) if view == "patch" else ()
            result = work(engine, picture, *others, prompt, settings, progress=tell)
            pictures = draw(view, picture, result)
        with sessions.using(session_key(request)) as visitor:
            paths = write_view(visitor.stores["inspect"].new_folder(), view, result, pictures)
        return result, pictures, [str(path) for path in paths]

    @gpu_task
    @shows_errors
    def attention(image_path, prompt, layers, token, request: gr.Request = None, progress=gr.Progress()):
        """Attention from one text token (empty: the last prompt token, which produces the first
        answer token) to every image token at the chosen layers."""
        result, pictures, files = run_view("attention", image_attention, image_path, prompt,
                                           settings_from_inputs(layers, token=token), request, progress)
        shown = boxes.attention
        return {shown.report: attention_report(result), shown.share: pictures["image_share.png"],
                shown.tiles: pictures["attention_tiles.png"], shown.base: pictures["attention_base.png"],
                shown.export: files, shown.kept: (image_path, result)}

    @gpu_task
    @shows_errors
    def reverse(image_path, prompt, layers, region, max_new_tokens, request: gr.Request = None,
                progress=gr.Progress()):
        """Which text tokens (prompt and first greedy answer tokens) attend to a region of the picture."""
        settings = settings_from_inputs(layers, max_new_tokens=max_new_tokens, box=region)
        result, pictures, files = run_view("reverse", region_attention, image_path, prompt, settings, request, progress)
        shown = boxes.reverse
        return {shown.report: reverse_report(result), shown.picture: pictures["reverse.png"], shown.export: files}

    @gpu_task
    @shows_errors
    def knockout(image_path, prompt, layers, window, max_new_tokens, request: gr.Request = None,
                 progress=gr.Progress()):
        """The answer positions may not attend to the image at the chosen layers (or a window around
        every injection layer): the first answer token's log-probability and the answer, before and after."""
        settings = settings_from_inputs(layers, window=window, max_new_tokens=max_new_tokens)
        result, _, files = run_view("knockout", attention_knockout, image_path, prompt, settings, request, progress)
        return {boxes.knockout.report: knockout_report(result), boxes.knockout.export: files}

    @gpu_task
    @shows_errors
    def patch(image_path, other_path, prompt, levels, direction, region, max_new_tokens, complement=False,
              request: gr.Request = None, progress=gr.Progress()):
        """Picture A (the main box) run with each level's injected features from picture B, and the
        reverse; every level at once as the bound."""
        settings = settings_from_inputs(max_new_tokens=max_new_tokens, levels=levels, direction=direction,
                                        region=region, complement=complement)
        result, pictures, files = run_view("patch", patch_levels, image_path, prompt, settings, request, progress,
                                           other_path)
        shown = boxes.patch
        return {shown.report: patching_report(result), shown.table: patching_rows(result),
                shown.picture: pictures["patching.png"], shown.export: files}

    return attention, reverse, knockout, patch


def circuits_tab(engine, last_chat_image: gr.State, sessions: SessionStores, concurrency: int = 1,
                 gpu_task=lambda fn: fn) -> CircuitBoxes:
    """Render the Circuits tab into the current ``gr.Blocks``; returns its result boxes."""
    gr.Markdown("Where the language model reads the picture: the attention of one text token on every image "
                "token, by layer (the 8 injection layers marked); which text tokens read a region of the "
                "picture; and what blocking the answer's attention to the picture changes. Each run is one "
                "or two passes on eager attention, for that pass only.")
    with picture_row("circuits", last_chat_image) as row:
        prompt = gr.Textbox(label="Prompt", value="What colour is the shape?", elem_id="circuits-prompt")
        layers = gr.Textbox(label=LAYERS_HELP, value=DEFAULTS.layers, elem_id="circuits-layers")
    image = row.image
    model_bound = {"concurrency_id": MODEL_QUEUE, "concurrency_limit": concurrency}
    pictures = {"show_label": False, "format": "png"}  # each picture carries its own title

    with gr.Tab("Attention on the picture", id="circuits-attention"):
        token = gr.Textbox(label="Query token position (empty: the last prompt token, which produces the first "
                                 "answer token; negative counts from the end)", value="", elem_id="circuits-token")
        run = gr.Button("Show attention", variant="primary", elem_id="circuits-attention-run")
        # each view's report is its result, the bar drawn over it: not a status_line, whose text the
        # bar hides, so the previous report stays readable (marked as such) while a run works
        report = gr.Markdown(min_height=STATUS_HEIGHT, elem_id="circuits-attention-report")
        share = gr.Image(label="Share of attention on the picture by layer", elem_id="circuits-share", **pictures)
        head = gr.Dropdown([ALL_HEADS], value=ALL_HEADS, label="Maps of", elem_id="circuits-head")
        tiles = gr.Image(label="Attention on each tile token", elem_id="circuits-tiles", **pictures)
        base = gr.Image(label="Attention on each base-view token", elem_id="circuits-base", **pictures)
        export = gr.File(interactive=False, label="Export (attention.json, PNGs)", file_count="multiple",
                         elem_id="circuits-attention-export")
    attention = AttentionBoxes(report=report, share=share, tiles=tiles, base=base, export=export, kept=gr.State(None))

    with gr.Tab("Reverse view: a region", id="circuits-reverse"):
        with gr.Row():
            picker = gr.Image(label="The region on the picture", show_label=False, interactive=False, format="png",
                              elem_id="circuits-region-picker")
            with gr.Column():
                region = gr.Textbox(label="Region x0,y0,x1,y1 in the picture's pixels (or click two corners on the "
                                          "picture at the left)",
                                    value="", elem_id="circuits-region")
                answer_tokens = gr.Number(label="Answer tokens read with the prompt", value=DEFAULTS.max_new_tokens,
                                          precision=None, elem_id="circuits-answer-tokens")
                run_reverse = gr.Button("Which text tokens read it", variant="primary", elem_id="circuits-reverse-run")
        reverse_text = gr.Markdown(min_height=STATUS_HEIGHT, elem_id="circuits-reverse-report")
        reverse_picture = gr.Image(label="Attention on the region", elem_id="circuits-reverse-picture", **pictures)
        reverse_export = gr.File(interactive=False, label="Export (reverse.json, reverse.png)", file_count="multiple",
                                 elem_id="circuits-reverse-export")
    wire_region_picker(image, region, picker)
    reverse = ReverseBoxes(report=reverse_text, picture=reverse_picture, export=reverse_export)

    with gr.Tab("Knockout", id="circuits-knockout"):
        with gr.Row():
            window = gr.Textbox(label="Window W: every layer within W of an injection layer (empty: the Layers box)",
                                value="", elem_id="circuits-window")
            new_tokens = gr.Number(label="Greedy answer tokens", value=DEFAULTS.max_new_tokens, precision=None,
                                   elem_id="circuits-new-tokens")
        run_knockout = gr.Button("Knock out", variant="primary", elem_id="circuits-knockout-run")
        knockout_text = gr.Markdown(min_height=STATUS_HEIGHT, elem_id="circuits-knockout-report")
        knockout_export = gr.File(interactive=False, label="Export (knockout.json)", file_count="multiple",
                                  elem_id="circuits-knockout-export")
    knockout = KnockoutBoxes(report=knockout_text, export=knockout_export)

    with gr.Tab("Patching: picture A with B's features", id="circuits-patching"):
        with gr.Row():
            other = image_input(label=PICTURE_B_LABEL, height=240, elem_id="circuits-image-b")
            refuse_non_pictures(other)
            with gr.Column():
                gr.Markdown(PICTURE_B_HINT, elem_id="circuits-image-b-hint")
                levels = gr.Textbox(label="Levels patched one at a time: all, or names or indices (e.g. deepstack0,4)",
                                    value=DEFAULTS.levels, elem_id="circuits-levels")
                direction = gr.Radio(list(DIRECTION_CHOICES), value=DEFAULTS.direction, label="Direction",
                                     elem_id="circuits-direction")
                patch_region = gr.Textbox(label="Image tokens patched: all, tokens:A-B or box:X0,Y0,X1,Y1 (A's pixels)",
                                          value=DEFAULTS.region, elem_id="circuits-patch-region")
                patch_tokens = gr.Number(label="Greedy answer tokens", value=DEFAULTS.max_new_tokens, precision=None,
                                         elem_id="circuits-patch-tokens")
                complement = gr.Checkbox(label="Complement: patch every level but each chosen one (is the one kept "
                                               "needed?)", value=DEFAULTS.complement, elem_id="circuits-complement")
        run_patch = gr.Button("Patch", variant="primary", elem_id="circuits-patch-run")
        patch_text = gr.Markdown(min_height=STATUS_HEIGHT, elem_id="circuits-patch-report")
        patch_table = gr.Dataframe(headers=PATCH_COLUMNS, label="Per level", interactive=False,
                                   elem_id="circuits-patch-table")
        patch_picture = gr.Image(label="Log-odds per level", elem_id="circuits-patch-picture", **pictures)
        patch_export = gr.File(interactive=False, label="Export (patching.json, patching.png)", file_count="multiple",
                               elem_id="circuits-patch-export")
    patch = PatchBoxes(report=patch_text, table=patch_table, picture=patch_picture, export=patch_export)
    boxes = CircuitBoxes(attention=attention, reverse=reverse, knockout=knockout, patch=patch)
    handlers = dict(zip((view.name for view in fields(CircuitBoxes)), make_handlers(engine, sessions, gpu_task, boxes),
                        strict=True))
    # view -> its button and inputs; its endpoint is circuits_<view>
    runs = {"attention": (run, [image, prompt, layers, token]),
            "reverse": (run_reverse, [image, prompt, layers, region, answer_tokens]),
            "knockout": (run_knockout, [image, prompt, layers, window, new_tokens]),
            "patch": (run_patch, [image, other, prompt, levels, direction, patch_region, patch_tokens, complement])}
    for name, (button, inputs) in runs.items():
        # a refused run leaves the view's results, its report marked as the previous run's; so does a
        # run whose picture changed while it worked (the new picture emptied them, the run's end refilled)
        view = getattr(boxes, name)
        event = run_keeping_previous(button, handlers[name], inputs, view.components(), view.report,
                                     picture=image, api_name=f"circuits_{name}", show_progress_on=view.report,
                                     **model_bound)
        if name == "attention":  # each head's maps, redrawn from the run kept
            event.success(head_choices, attention.kept, head, api_visibility="private", queue=False)
    # a new picture (uploaded, from Chat, a PDF page): every view's results were the old one's;
    # a new picture B: the patching results were the old pair's
    empties_on(image.change, [box for view in boxes.views() for box in view.components()])
    empties_on(other.change, patch.components())
    # another region (typed, or set by the two clicks): the reverse results, whose report names the
    # old one, stay until the next run, marked as the previous run's (a refused region keeps them)
    region.change(**previous_run_mark(reverse.report))
    head.input(head_maps(attention), [attention.kept, head], [attention.tiles, attention.base], api_visibility="private",
               show_progress="hidden")
    return boxes
