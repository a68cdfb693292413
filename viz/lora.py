"""Pictures of a LoRA token diff: highlighted answers (HTML and PNG) and a per-token plot.

Input is the typed diff, read by attribute (``g4v.lora.token_diff.LoraDiff``: its ``labels``, its
``first_divergence`` and each answer's ``tokens``, ``TokenScore`` each). Colour encodes ``delta = logprob_adapter - logprob_base``: green where the adapter likes the
token more than the base model, red where less; the first position where the two models' greedy
choices differ is boxed. No torch here; matplotlib draws off-screen (no pyplot state).
"""

import html

import numpy as np
from matplotlib.figure import Figure
from PIL import Image, ImageDraw, ImageFont

from viz.figures import ellipsized, text_points

#: |delta| (nats) at which the colour saturates.
DELTA_SCALE = 4.0
#: The plot's x axis names at most this many tokens (every few in a longer answer), each at most
#: this many characters: a longer one ends in "…" (the highlighted answers above the plot show it
#: whole, and each span's tooltip gives its numbers).
MAX_TOKEN_LABELS = 48
TOKEN_LABEL_CHARS = 16  # the tokenizer's special tokens whole (``<|end_of_text|>`` was ``<|end_of_te…``)
LEGEND_ROW_CHARS = 100  # the plot's legend labels, all told, that one row under it holds


def _answers(diff) -> tuple[tuple[list, str], tuple[list, str]]:
    """Each answer's scored tokens, with its title."""
    left, right = diff.labels
    return (diff.base.tokens, f"Answer: {left}"), (diff.tuned.tokens, f"Answer: {right}")


def delta_colour(delta: float) -> tuple[int, int, int]:
    """White at 0, towards green for positive and red for negative deltas."""
    strength = float(np.clip(abs(delta) / DELTA_SCALE, 0.0, 1.0))
    target = (60, 170, 80) if delta > 0 else (220, 70, 60)
    return tuple(round(255 + (channel - 255) * strength) for channel in target)


def _visible(text: str) -> str:
    """Token text as shown: line breaks and tabs drawn as symbols so every token has a box."""
    return text.replace("\n", "⏎").replace("\t", "⇥") or "∅"


def tick_label(text: str) -> str:
    """A token as the plot's x axis names it: :func:`_visible`, shortened to ``TOKEN_LABEL_CHARS``
    with an ellipsis, so a cut label never reads as another token (``<|end_of_tex``)."""
    return ellipsized(_visible(text), TOKEN_LABEL_CHARS)


def _tooltip(token, names: tuple[str, str] = ("base", "adapter")) -> str:
    return (
        f"position {token.position}: log p {names[0]} {token.logprob_base:.3f}, "
        f"{names[1]} {token.logprob_adapter:.3f}, delta {token.delta:+.3f}, KL {token.kl:.4f}"
    )


# ── HTML ───────────────────────────────────────────────────────────────────────────────────────


def diff_html(diff) -> str:
    """Both answers as coloured token spans with the numbers in each span's tooltip."""
    first = diff.first_divergence
    summary = "the greedy choices never differ" if first is None else f"greedy choices first differ at token {first}"
    left, right = (html.escape(name) for name in diff.labels)
    parts = [
        # Lines wrap at the spaces inside tokens only (no break between two tokens of a word); a run
        # longer than a line (a random model's) breaks anywhere rather than run past the page.
        '<div class="g4v-lora-diff" style="font-family: monospace; line-height: 1.9; overflow-wrap: anywhere">',
        f"<p><b>{left}</b> vs <b>{right}</b>: {summary}. "
        f"Green: {right} favours the token; red: {left} does.</p>",
    ]
    for tokens, title in _answers(diff):
        parts.append(f"<p><b>{html.escape(title)}</b><br>")
        for token in tokens:
            parts.append(_token_span(token, token.position == first, diff.labels))
        parts.append("</p>")
    parts.append("</div>")
    return "".join(parts)


def _token_span(token, divergent: bool, names: tuple[str, str]) -> str:
    r, g, b = delta_colour(token.delta)
    border = "2px solid #1f4fd1" if divergent else "1px solid #ddd"
    style = f"background: rgb({r},{g},{b}); border: {border}; padding: 0 1px; white-space: pre-wrap"
    text = html.escape(_visible(token.text))
    return f'<span style="{style}" title="{html.escape(_tooltip(token, names))}">{text}</span>'


# ── PNG ────────────────────────────────────────────────────────────────────────────────────────


def diff_png(diff, width: int = 900) -> Image.Image:
    """The highlighted answers drawn as a picture (for reports and the CLI)."""
    font = ImageFont.load_default(size=15)
    line_height, margin = 24, 10
    lines: list[list] = []  # per line: (x, title or token, divergent)
    first = diff.first_divergence
    for tokens, title in _answers(diff):
        lines.append([(margin, title, False)])
        x, line = margin, []
        for token in tokens:
            text = _visible(token.text)
            box_width = font.getlength(text) + 4
            if x + box_width > width - margin and line:
                lines.append(line)
                x, line = margin, []
            line.append((x, token, token.position == first))
            x += box_width + 1
        lines.append(line)
    image = Image.new("RGB", (width, margin * 2 + line_height * len(lines)), "white")
    draw = ImageDraw.Draw(image)
    for row, line in enumerate(lines):
        y = margin + row * line_height
        for x, item, divergent in line:
            if isinstance(item, str):
                draw.text((x, y), item, fill="black", font=font)
                continue
            text = _visible(item.text)
            box = (x, y, x + font.getlength(text) + 4, y + line_height - 3)
            outline = (31, 79, 209) if divergent else (220, 220, 220)
            draw.rectangle(box, fill=delta_colour(item.delta), outline=outline, width=2 if divergent else 1)
            draw.text((x + 2, y + 2), text, fill="black", font=font)
    return image


# ── plot ───────────────────────────────────────────────────────────────────────────────────────


def diff_plot(diff) -> Figure:
    """Per answer: the token's log-probability under each model, and the KL between the two
    next-token distributions; the first divergence is a dashed line. The x axis names the tokens
    (every few, in a long answer); one legend for both panels, under them, never over the data
    or the right-hand KL axis (beside the axes it covered that axis's labels once they were wide)."""
    figure = Figure(figsize=(9, 6.5), layout="constrained")
    small = text_points(figure.get_figwidth())
    axes = figure.subplots(2, 1, sharex=False)
    first = diff.first_divergence
    left, right = diff.labels
    legend = []  # the handles of one panel: both draw the same series
    for ax, (tokens, title) in zip(axes, _answers(diff)):
        positions = np.array([t.position for t in tokens])
        handles = []
        if len(positions):
            handles += ax.plot(positions, [t.logprob_base for t in tokens], "o-", ms=3, label=f"log p ({left})", color="#555")
            handles += ax.plot(positions, [t.logprob_adapter for t in tokens], "o-", ms=3, label=f"log p ({right})",
                               color="#1f77b4")
            kl_axis = ax.twinx()
            handles.append(kl_axis.bar(positions, [t.kl for t in tokens], color="#ff7f0e", alpha=0.35,
                                       label=f"KL({right} || {left})"))
            kl_axis.set_ylabel("KL (nats)", fontsize=small)
            kl_axis.tick_params(labelsize=small)
            step = max(1, -(-len(tokens) // MAX_TOKEN_LABELS))  # ceil: at most MAX_TOKEN_LABELS labels
            shown = tokens[::step]
            ax.set_xticks([t.position for t in shown], [tick_label(t.text) for t in shown],
                          rotation=90, fontsize=small)
        if first is not None:
            handles.append(ax.axvline(first, color="#1f4fd1", linestyle="--", linewidth=1, label="first divergence"))
        ax.set_title(title, fontsize=small + 2)
        ax.set_xlabel("answer token", fontsize=small)
        ax.set_ylabel("log-probability", fontsize=small)
        ax.tick_params(axis="y", labelsize=small)
        legend = legend or handles
    if legend:  # one row while the names are short; long ones (an adapter's) a column
        one_row = sum(len(handle.get_label()) for handle in legend) <= LEGEND_ROW_CHARS
        figure.legend(handles=legend, loc="outside lower center", ncol=len(legend) if one_row else 1, fontsize=small)
    return figure
