"""What a client sends, checked before any handler runs: the page's ``gr.Blocks`` puts Gradio's
own refusals of a request's values in one line that names the value.

Gradio reads every value of a request (moves uploads into its cache, validates them, runs each
input's ``preprocess``) before the handler is called, and refuses a bad one in its own words:
several lines with its internals (a component's index, a pydantic report, component objects and
their memory addresses) or the server's working folder. A browser never sends such values; a
client of the API (``gradio_client``, MCP, a hand-written request) may.
"""

import inspect
import re

import gradio as gr

from g4v.errors import quoted


#: What a client is told when it names a file instead of sending one (a path, ``file:///etc/passwd``).
NOT_UPLOADED = "a file must be sent to the app (uploaded), not named by a path or an address"


class WorkbenchBlocks(gr.Blocks):
    """The page's ``gr.Blocks``, with the refusals Gradio makes before any handler runs put in one
    line that names the value (:func:`check_sent_values`). Gradio's own words are several lines
    with its internals: "Could not preprocess input component at index 2 (a `slider` component)
    ...", a pydantic report, a list of component objects and their memory addresses; and a file
    input whose value names a file the app did not receive (``{"path": "file:///etc/passwd"}``) held
    the server's working folder ("Cannot move <folder>/file:/etc/passwd to the gradio cache dir"):
    here it is :data:`NOT_UPLOADED`."""

    async def preprocess_data(self, block_fn, inputs, state, explicit_call=False):
        from gradio.exceptions import InvalidPathError

        check_sent_values(block_fn, inputs, state)
        try:
            return await super().preprocess_data(block_fn, inputs, state, explicit_call)
        except InvalidPathError:
            raise gr.Error(NOT_UPLOADED, print_exception=False) from None


def check_sent_values(block_fn, inputs: list, state=None) -> None:
    """Refuse, in one line naming the value (as its box's label and the handler's parameter, which
    the API names it by), what a client sent that Gradio would refuse in its own words: too few
    values, a slider's or number box's value that is not a number or outside its range (as this
    session's copy of the box has it, in ``state``), a value not in the form its input takes (a
    message that is not ``{"text": ..., "files": [...]}``). NaN passes here: each handler names it."""
    from pydantic import ValidationError

    if len(inputs) < len(block_fn.inputs):  # how many a client sends for a state depends on the route: no count
        sent = [name for name, block in zip(_input_names(block_fn), block_fn.inputs)
                if not getattr(block, "stateful", False)]
        raise gr.Error(f"too few values: this takes {', '.join(sent)}", print_exception=False)
    props = getattr(block_fn, "component_prop_inputs", ())
    for index, (block, value) in enumerate(zip(block_fn.inputs, inputs)):
        if getattr(block, "stateful", False) or index in props:
            continue  # a state is the server's; a box's properties are Gradio's to read
        if state is not None and block._id in state:
            block = state[block._id]
        if isinstance(block, (gr.Slider, gr.Number)) and block_fn.preprocess and _compared(block):
            if value is None and not isinstance(block, gr.Slider):
                continue  # an empty number box: its handler reads None
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise _refusal(block_fn, index, block, f"must be a number, got {quoted(value)}")
            low, high = block.minimum, block.maximum
            if (low is not None and value < low) or (high is not None and value > high):
                bounds = (f"from {low:g} to {high:g}" if low is not None and high is not None else
                          f"at least {low:g}" if low is not None else f"at most {high:g}")
                raise _refusal(block_fn, index, block, f"must be {bounds}, got {quoted(value)}")
        elif getattr(block, "data_model", None) is not None and value is not None:
            try:
                block.data_model.model_validate(value, context={"validate_meta": True})
            except (ValidationError, AttributeError, TypeError):  # gradio_client's meta check raises the latter two
                shape = ' {"text": ..., "files": [...]}' if isinstance(block, gr.MultimodalTextbox) else ""
                raise _refusal(block_fn, index, block, f"is not in the form this input takes{shape}") from None


def _refusal(block_fn, index: int, block, problem: str) -> gr.Error:
    """``problem`` of input ``index`` as one line naming it (named only when refused)."""
    return gr.Error(f"{_named(block, _input_names(block_fn)[index])} {problem}", print_exception=False)


def _compared(block) -> bool:
    """Whether Gradio compares or rounds this box's value (a slider; a number box with a bound or a
    precision). A number box with neither passes on whatever was sent, which its handler reads
    (an API client's ``"5"`` included)."""
    return isinstance(block, gr.Slider) or any(v is not None for v in (block.minimum, block.maximum, block.precision))


def _named(block, parameter: str) -> str:
    """A value as a refusal names it: ``Rows (limit)``; the parameter alone where the label says
    the same (``Max new tokens``, ``Top-p``) or there is none. A label's note in brackets is left
    out (``Temperature (0 = greedy)``)."""
    label = getattr(block, "label", None)
    label = re.sub(r"\s*\([^)]*\)$", "", label) if isinstance(label, str) else ""
    if not label or re.sub(r"[\s-]+", "_", label.lower()) == parameter:
        return parameter
    return f"{label} ({parameter})"


def _input_names(block_fn) -> list[str]:
    """The names of the handler's parameters, one per input (``input N`` where it has none)."""
    try:
        parameters = [p.name for p in inspect.signature(block_fn.fn).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        parameters = []
    return [parameters[i] if i < len(parameters) else f"input {i + 1}" for i in range(len(block_fn.inputs))]
