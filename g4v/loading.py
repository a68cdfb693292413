"""Loading a Granite 4 Vision model and its processor, the same way for the bundled and the real one.

The bundled checkpoint and ``ibm-granite/granite-vision-4.1-4b`` go through the same
``from_pretrained`` calls; only the source differs. ``trust_remote_code`` is never set: the model
classes are transformers' own. The way back out is here too: :func:`save_weights` writes a model's
weights in the hub layout that transformers and vLLM both load (the demo builder and the LoRA merge
write their checkpoints with it).

A folder that also holds a vision LoRA (the real model's layout, :mod:`g4v.checkpoint.vision_lora`)
is loaded as its base through a view without the adapter files, so transformers never attaches
it behind g4v's back; the LoRA is then applied in the mode asked for.
"""

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from g4v.errors import G4VError, first_line

MODEL_TYPE = "granite4_vision"


@dataclass
class LoadedModel:
    model: torch.nn.Module  # Granite4VisionForConditionalGeneration, in eval mode
    processor: object  # Granite4VisionProcessor
    source: str
    device: torch.device
    dtype: torch.dtype
    #: The checkpoint's vision LoRA (None: its weights are the vision model) and how it is applied:
    #: ``native`` (attached as the PEFT adapter :data:`VISION_ADAPTER`, disabled between requests),
    #: ``merged`` (in the weights) or ``off``.
    vision_lora: object = None
    vision_mode: str = "off"


#: The PEFT adapter name the vision LoRA is attached under in native mode.
VISION_ADAPTER = "g4v_vision_lora"


def pick_device(device: str | None = None) -> torch.device:
    """``device`` if given, else CUDA when present, else the CPU."""
    if device and device != "auto":
        try:
            chosen = torch.device(device)
        except (RuntimeError, ValueError):
            raise G4VError(f"unknown device {device!r} (try cpu or cuda)") from None
        if chosen.type == "cuda" and not torch.cuda.is_available():
            raise G4VError("device cuda was asked for, but no CUDA GPU is available")
        return chosen
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def pick_dtype(device: torch.device, dtype: str | None = None) -> torch.dtype:
    """``dtype`` if given; else bf16 on a GPU that supports it, float32 elsewhere."""
    if dtype and dtype != "auto":
        if dtype not in _DTYPES:
            raise G4VError(f"unknown dtype {dtype!r} (try {', '.join(sorted(_DTYPES))} or auto)")
        return _DTYPES[dtype]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def looks_like_local_path(model: str) -> bool:
    """A hub id is ``name`` or ``org/name``; anything else (``./x``, ``/x``, ``a/b/c``) is a folder, and
    so is ``org/name`` whose ``org`` is a folder here (``assets/typo``: refused now, not retried on the hub)."""
    return (model.startswith((".", "/", "~")) or model.count("/") > 1 or os.sep != "/" and os.sep in model
            or "/" in model and Path(model.split("/")[0]).is_dir())


def model_name(model) -> str:
    """How an export names a model: a hub id as it is, a local folder by its name only (an export
    leaves the server, its paths do not)."""
    text = str(model or "")
    return Path(text).name if looks_like_local_path(text) or Path(text).expanduser().exists() else text


def resolve_source(model: str) -> str:
    """Check a local folder (exists, has a Granite 4 Vision config) or pass a hub id through."""
    if not model or not model.strip():
        raise G4VError("no model given")
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise G4VError(f"model path is not a folder: {model}")
        config_path = path / "config.json"
        if not config_path.is_file():
            raise G4VError(f"model folder has no config.json: {model}")
        try:
            model_type = json.loads(config_path.read_text()).get("model_type")
        except (OSError, ValueError):
            raise G4VError(f"model folder has an unreadable config.json: {model}") from None
        if model_type != MODEL_TYPE:
            raise G4VError(f"{model} is not a Granite 4 Vision checkpoint (model_type {model_type!r})")
        return str(path)
    if looks_like_local_path(model):
        raise G4VError(f"model folder not found: {model}")
    return model  # a hub id such as ibm-granite/granite-vision-4.1-4b


def load_processor(model: str):
    from transformers import AutoProcessor

    source = resolve_source(model)
    try:
        return AutoProcessor.from_pretrained(source)
    except Exception as err:  # hub and file errors come in many types; the user needs one line
        raise G4VError(f"could not load the processor of {model}: {first_line(err)}") from None


@dataclass(frozen=True)
class ModelOutline:
    """What a model folder says before any weight is read, checked as loading checks it: the
    app builds its page from this while the weights load (:mod:`g4v.engines.deferred`)."""

    model: str
    source: str
    device: torch.device
    dtype: torch.dtype
    config: object  # Granite4VisionConfig
    vision_lora: object = None  # as in LoadedModel
    vision_mode: str = "off"


def outline_model(model: str, device: str | None = None, dtype: str | None = None,
                  vision_lora: str | None = None) -> ModelOutline:
    """The checks :func:`load_model` makes before it reads weights (the folder, the vision LoRA
    mode, device and dtype, the config, the vision LoRA's files), and what they find."""
    from g4v.checkpoint.vision_lora import check_mode, find_vision_lora

    source = resolve_source(model)
    mode = check_mode(vision_lora)
    torch_device = pick_device(device)
    torch_dtype = pick_dtype(torch_device, dtype)
    config = load_config(source)
    lora = find_vision_lora(source)
    return ModelOutline(model=model, source=source, device=torch_device, dtype=torch_dtype, config=config,
                        vision_lora=lora, vision_mode=mode if lora is not None else "off")


def load_model(model: str, device: str | None = None, dtype: str | None = None,
               vision_lora: str | None = None, outline: ModelOutline | None = None) -> LoadedModel:
    """Load model and processor; dtype and device are chosen automatically unless given.
    ``vision_lora``: the mode for a checkpoint that carries one (default native). ``outline``:
    :func:`outline_model`'s, when it was made already (the other arguments are then its own)."""
    from g4v.checkpoint.vision_lora import BaseView, merge_into

    outline = outline or outline_model(model, device, dtype, vision_lora)
    source, lora, mode = outline.source, outline.vision_lora, outline.vision_mode
    processor = load_processor(source)
    if lora is None:
        loaded = _from_pretrained(source, model, outline.config, outline.dtype)
    else:
        with BaseView(lora.folder) as view:
            loaded = _from_pretrained(str(view.path), model, outline.config, outline.dtype)
        if mode == "merged":
            merge_into(loaded, lora)
        elif mode == "native":
            try:
                loaded.load_adapter(str(lora.folder), adapter_name=VISION_ADAPTER)
            except Exception as err:  # PEFT and file errors come in many types
                raise G4VError(f"could not attach the vision LoRA of {model}: {first_line(err)}") from None
            loaded.disable_adapters()
    loaded = loaded.to(outline.device).eval()
    return LoadedModel(model=loaded, processor=processor, source=source, device=outline.device, dtype=outline.dtype,
                       vision_lora=lora, vision_mode=mode)


def _from_pretrained(path: str, model: str, config, torch_dtype):
    """transformers' own loading of ``path`` (a folder without adapter files, or a hub id)."""
    from transformers import AutoModelForImageTextToText

    try:
        loaded = AutoModelForImageTextToText.from_pretrained(path, config=config, dtype=torch_dtype)
    except Exception as err:
        raise G4VError(f"could not load model {model}: {first_line(err)}") from None
    if loaded.config.model_type != MODEL_TYPE:
        raise G4VError(f"{model} is not a Granite 4 Vision checkpoint (model_type {loaded.config.model_type!r})")
    return loaded


# ── configs without weights ─────────────────────────────────────────────────────────────────────


def load_config(source: str | Path):
    """A Granite4VisionConfig from a model folder (its config.json), a config.json file or a hub id
    (only its config.json is fetched); never weights. The Tiling tab and CLI, the adapter checks
    and the inspectors all read configs through here."""
    path = Path(str(source)).expanduser()
    if not path.exists():
        if str(source).strip() and not looks_like_local_path(str(source)) and str(source).count("/") == 1:
            return _hub_config(str(source))
        raise G4VError(f"config not found: {source}")
    config_file = path / "config.json" if path.is_dir() else path
    data = read_raw_config(config_file)
    if data.get("model_type") != MODEL_TYPE:
        raise G4VError(f"{config_file} is not a Granite 4 Vision config (model_type {data.get('model_type')!r})")
    from transformers import AutoConfig

    try:
        return with_qformer_widths(AutoConfig.from_pretrained(str(config_file)), data.get("qformer_config") or {})
    except Exception as err:  # transformers raises many types for bad configs; the user needs one line
        raise G4VError(f"could not read {config_file}: {first_line(err)}") from None


def with_qformer_widths(config, written: dict):
    """``config`` with the Q-Former widths that config.json leaves out taken from the vision tower,
    as transformers >= 5.21 and vLLM build them (hidden and encoder width = vision width, one head
    per 64 channels); ``written`` is config.json's own ``qformer_config``, whose values are kept.

    The real checkpoint's config.json leaves these out, and transformers < 5.21 (the vLLM
    environment's) then builds BLIP-2's defaults: 768 wide, reading 1408-wide features, which
    cannot hold the real weights."""
    width = config.vision_config.hidden_size
    derived = {"hidden_size": width, "encoder_hidden_size": width, "num_attention_heads": width // 64}
    for name, value in derived.items():
        if name not in written:
            setattr(config.qformer_config, name, value)
    return config


def read_raw_config(source: str | Path) -> dict:
    """``config.json`` (of a folder, or the file itself) exactly as written: transformers' config
    class may rewrite some fields (5.23 resets the Q-Former's head count), so what the checkpoint
    *says* is read here."""
    path = Path(source)
    config_file = path / "config.json" if path.is_dir() else path
    if not config_file.is_file():
        raise G4VError(f"model folder has no config.json: {source}")
    try:
        data = json.loads(config_file.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        raise G4VError(f"unreadable config file: {config_file}") from None
    if not isinstance(data, dict):
        raise G4VError(f"{config_file} is not a JSON object")
    return data


def _hub_config(model_id: str):
    from transformers import AutoConfig, PretrainedConfig

    try:
        config = AutoConfig.from_pretrained(model_id)
        written, _ = PretrainedConfig.get_config_dict(model_id)  # config.json as written (cached by the hub)
    except Exception as err:  # offline, unknown id, ...: one line
        raise G4VError(f"could not fetch the config of {model_id}: {first_line(err)}") from None
    if getattr(config, "model_type", None) != MODEL_TYPE:
        raise G4VError(f"{model_id} is not a Granite 4 Vision model (model_type {config.model_type!r})")
    return with_qformer_widths(config, written.get("qformer_config") or {})


# ── writing weights ─────────────────────────────────────────────────────────────────────────────

#: The weights file of a checkpoint that g4v writes (the bundled ones, a merged LoRA).
CHECKPOINT_WEIGHTS_FILE = "model.safetensors"


def save_weights(model: torch.nn.Module, folder: Path, dtype: torch.dtype) -> str:
    """Write ``model.safetensors`` into ``folder`` in the hub layout, every tensor in ``dtype``;
    returns its SHA-256. The demo builder and the LoRA merge both write their checkpoints here."""
    from safetensors.torch import save_file

    tensors = to_hub_layout(model.state_dict(), dtype)
    path = Path(folder) / CHECKPOINT_WEIGHTS_FILE
    save_file(tensors, str(path), metadata={"format": "pt"})
    return sha256_file(path)


def to_hub_layout(state_dict: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Rename transformers' in-memory names to the hub layout that both transformers and vLLM load:
    the vision tower under ``model.vision_tower.vision_model.*`` (transformers saves
    ``model.vision_tower.*``, which vLLM rejects; transformers loads both)."""
    hub = {}
    for name, tensor in state_dict.items():
        if name.startswith("model.vision_tower.") and not name.startswith("model.vision_tower.vision_model."):
            name = "model.vision_tower.vision_model." + name[len("model.vision_tower.") :]
        hub[name] = tensor.detach().to(dtype).contiguous().clone()
    return hub


def sha256_file(path: Path) -> str:
    """A file's SHA-256 (hex), read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
