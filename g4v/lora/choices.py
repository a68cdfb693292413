"""The adapters a tab offers: every adapter in the configured folders, which base each was made
for, and whether that is the model being served (the LoRA and Evaluate tabs, ``chat`` and
``lora-diff``'s warning). Listing reads the adapters' configs only; nothing is loaded.
"""

from dataclasses import dataclass

from g4v.lora.folders import adapter_base, adapter_dirs, folder_label, list_adapters, same_base


@dataclass(frozen=True)
class AdapterChoice:
    """One adapter as the LoRA tab offers it: which base it was made for, and whether that is the
    model being served (an adapter trained on another base loads, but answers gibberish)."""

    name: str  # what to pass as ``adapter=`` (its path under the adapter folder)
    base: str | None  # the config's base_model_name_or_path as written; None: it names none
    matches: bool  # made for the model being served

    @property
    def label(self) -> str:
        """``demo-lora (made for assets/granite4-vision-tiny)``, for a dropdown entry."""
        return f"{self.name} (made for {self.base})" if self.base else f"{self.name} (base not named)"


def describe_adapter(name: str, adapters_dir=None, model: str | None = None) -> AdapterChoice:
    """Which base ``name`` was made for, and whether it is ``model`` (None: no model to match)."""
    base = adapter_base(name, adapter_dirs(adapters_dir))
    return AdapterChoice(name=name, base=base, matches=model is not None and same_base(base, model))


def describe_adapters(adapters_dir=None, model: str | None = None) -> list[AdapterChoice]:
    """Every adapter in the adapter folders, those made for ``model`` first, each group by name."""
    found = [describe_adapter(name, adapters_dir, model) for name in list_adapters(adapter_dirs(adapters_dir))]
    return sorted(found, key=lambda choice: (not choice.matches, choice.name))


def base_warning(name: str | None, adapters_dir=None, model: str | None = None) -> str:
    """One line when adapter ``name`` names another base than ``model``: it loads and runs (the
    layer shapes match), but its answers likely mean nothing. Empty when it was made for ``model``,
    names no base, or cannot be found (using it then says why)."""
    if not name or model is None:
        return ""
    choice = describe_adapter(name, adapters_dir, model)
    if choice.matches or choice.base is None:
        return ""
    return f"warning: adapter {name} was made for {choice.base}, not for the model in use; its answers are likely meaningless"


def adapter_choices(adapters_dir=None, model: str | None = None) -> list[str]:
    """Adapter names for a dropdown, those made for ``model`` first (no model: by name)."""
    return [choice.name for choice in describe_adapters(adapters_dir, model)]


def preselected_adapter(adapters_dir=None, model: str | None = None) -> str | None:
    """The adapter a dropdown should start on: the first one made for ``model``, else none
    (preselecting an adapter made for another base would show gibberish as its first answer)."""
    return next((choice.name for choice in describe_adapters(adapters_dir, model) if choice.matches), None)


def adapter_folder_help(adapters_dir=None) -> str:
    """One line for the tab: where adapters are looked up."""
    return "Adapters are read from: " + ", ".join(folder_label(d) for d in adapter_dirs(adapters_dir))


def adapter_note(options: list[AdapterChoice], vision_lora: bool) -> str:
    """Why the adapter dropdown starts blank, in one line (empty when it starts on an adapter made
    for this model): an empty folder, or only adapters made for other bases (listed, not chosen,
    as their answers are likely gibberish). On a checkpoint with a vision LoRA (``vision_lora``)
    that LoRA is no adapter here: the model pickers choose it, which the note says so a blank
    dropdown is not read as "the vision LoRA is missing"."""
    if any(option.matches for option in options):
        return ""
    found = ("no adapters in the adapter folder" if not options else
             f"no adapter in the adapter folder is made for this model ({len(options)} made for other bases "
             "are listed: pick one to run it anyway)")
    return found + ("; the vision LoRA is chosen in the model pickers below (base language model | vision model)"
                    if vision_lora else "")
