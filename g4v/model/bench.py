"""What every model benchmark shares (``python -m g4v bench inspect`` and ``bench attribute``):
the models it runs on (the bundled checkpoint, a larger or the real config with random weights),
synthetic inputs, the timing and memory measurements, and the flags' checks.

Time: modes are interleaved round by round, in a rotating order (so drifting machine load hits all
of them alike), and the fastest round per mode is reported (on a shared machine the minimum is the
least disturbed measurement of what the code itself costs; ``timeit`` makes the same choice).
Peak memory: what the pass allocates above what was live before it (weights excluded): the CUDA
allocator's peak on a GPU, the profiler's CPU allocation events on a CPU.
"""

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

import torch

from g4v.errors import G4VError, check_value, read_whole, whole_number

TEXT_TOKENS = 32  # text tokens around the image tokens


@dataclass
class BenchSetup:
    """What a model benchmark ran on: the model, where, and the one input's size (its tokens, the
    image tokens among them). Each benchmark's result adds its own figures."""

    model: str
    device: str
    dtype: str
    parameters: int
    sequence_tokens: int
    image_tokens: int

    def headline(self) -> str:
        """The first line of a printed result: ``"bundled: 6.0M params, cpu float32, 330 tokens (256 image)"``."""
        return (f"{self.model}: {self.parameters / 1e6:.1f}M params, {self.device} {self.dtype}, "
                f"{self.sequence_tokens} tokens ({self.image_tokens} image)")


def larger_config():
    """The architecture at about 100M parameters (16x the bundled one): 12-layer SigLIP (hidden
    384, 384-pixel tiles and 16-pixel patches as in the real model), 8 window Q-Formers, a 16-layer
    Granite LM (hidden 512); injections spread over the first 12 LM layers, as the real model's
    spread over its first 22."""
    from transformers import Granite4VisionConfig

    tile = 384
    return Granite4VisionConfig(
        vision_config={"model_type": "siglip_vision_model", "hidden_size": 384, "intermediate_size": 1536,
                       "num_hidden_layers": 12, "num_attention_heads": 6, "image_size": tile, "patch_size": 16,
                       "vision_use_head": False},
        text_config={"model_type": "granite", "vocab_size": 1024, "hidden_size": 512, "intermediate_size": 1536,
                     "num_hidden_layers": 16, "num_attention_heads": 8, "num_key_value_heads": 2,
                     "max_position_embeddings": 8192, "embedding_multiplier": 12.0, "attention_multiplier": 0.015625,
                     "residual_multiplier": 0.22, "logits_scaling": 10.0},
        qformer_config={"model_type": "blip_2_qformer", "num_hidden_layers": 1, "intermediate_size": 3072,
                        "cross_attention_frequency": 1, "max_position_embeddings": 2048,
                        "use_qformer_text_input": False},
        image_token_index=1023,
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        image_grid_pinpoints=[[r * tile, c * tile] for r in range(1, 7) for c in range(1, 7) if r * c <= 6],
        downsample_rate="4/8",
        deepstack_layer_map=[[-10, 4], [-7, 3], [-4, 1], [-1, 0]],
        spatial_vision_layer=-1,
        spatial_target_layers=[5, 7, 9, 11],
    )


def build_model(name: str, device: torch.device, dtype: torch.dtype):
    """``(label, model)`` in eval mode on ``device``: the bundled checkpoint or random weights."""
    from transformers import Granite4VisionForConditionalGeneration

    from g4v.paths import BUNDLED_MODEL_DIR, REAL_CONFIG_DIR
    from g4v.loading import load_config

    if name == "bundled":
        model = Granite4VisionForConditionalGeneration.from_pretrained(str(BUNDLED_MODEL_DIR), dtype=dtype)
        return "bundled checkpoint", model.to(device).eval()
    if name == "larger":
        config, label = larger_config(), "larger random-weight config"
    elif name == "real":
        config, label = load_config(REAL_CONFIG_DIR), "granite-vision-4.1-4b config, random weights"
    else:
        config, label = load_config(name), f"{name} (random weights)"
    torch.manual_seed(0)
    with torch.device(device):
        model = Granite4VisionForConditionalGeneration._from_config(config, dtype=dtype)
    return label, model.eval()


def synthetic_inputs(config, image_size_hw: tuple[int, int], device: torch.device, dtype: torch.dtype) -> dict:
    """One image of ``image_size_hw`` (random pixels) in a prompt of TEXT_TOKENS text tokens."""
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

    from g4v.tiling import plan_tiling

    plan = plan_tiling(image_size_hw, config)
    tile = config.vision_config.image_size
    views = image_size_to_num_patches(list(image_size_hw), config.image_grid_pinpoints, tile)
    generator = torch.Generator().manual_seed(0)
    pixel_values = torch.randn(1, views, 3, tile, tile, generator=generator)  # (batch, views, 3, tile, tile)
    image_id = config.image_token_index
    text_ids = torch.randint(0, image_id, (TEXT_TOKENS,), generator=generator)
    half = TEXT_TOKENS // 2
    input_ids = torch.cat([text_ids[:half], torch.full((plan.num_image_tokens,), image_id), text_ids[half:]])
    return {
        "input_ids": input_ids[None].to(device),  # (1, seq)
        "pixel_values": pixel_values.to(device, dtype),
        "image_sizes": torch.tensor([list(image_size_hw)], device=device),  # (1, 2) as (height, width)
    }


def fastest_seconds(runs: dict[str, Callable[[], object]], device: torch.device, repeats: int) -> dict:
    """Fastest seconds per named run; one warm-up each, then ``repeats`` rounds of all runs."""
    names = list(runs)
    timings = {name: [] for name in names}
    for name in names:
        runs[name]()
    for round_index in range(repeats):
        # Rotate the order each round, so no run always comes right after the same neighbour.
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            sync_device(device)
            start = time.perf_counter()
            runs[name]()
            sync_device(device)
            timings[name].append(time.perf_counter() - start)
    return {name: min(values) for name, values in timings.items()}


def peak_bytes(run: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated while ``run()`` runs, above what was allocated before it (on the CPU,
    from the profiler's allocation events)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        run()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def measure_modes(run: Callable[[str], object], modes, device: torch.device, repeats: int) -> tuple[dict, dict]:
    """Fastest seconds and peak bytes of ``run(mode)`` for each mode: what every benchmark reports."""
    runs = {mode: partial(run, mode) for mode in modes}
    return fastest_seconds(runs, device, repeats), {mode: peak_bytes(runs[mode], device) for mode in modes}


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_benchmarks(args, bench_one, describe) -> int:
    """The flags every model benchmark shares (``--models``, ``--device``, ``--dtype``,
    ``--image-size``, ``--repeats``, ``--threads`` where it has one, ``--json``): check them, run
    ``bench_one`` per model, print ``describe(result)``, write the results (with their ratios)."""
    from g4v.loading import pick_device, pick_dtype

    device = pick_device(args.device)
    dtype = pick_dtype(device, args.dtype)
    image_size = parse_size(args.image_size)
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    check_value("--repeats", args.repeats, whole_number(1))
    results = []
    for name in args.models:
        result = bench_one(name, device, dtype, image_size, args.repeats)
        print(describe(result), flush=True)
        results.append(result)
    if args.json:
        rows = [{**asdict(r), "ratios": r.ratios()} for r in results]
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


def parse_size(text: str) -> tuple[int, int]:
    try:
        height, width = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise G4VError(f"--image-size wants HxW such as 384x768, got {text!r}") from None
    if height < 1 or width < 1:
        raise G4VError(f"--image-size must be positive, got {text!r}")
    return height, width


def add_model_flags(parser, models: tuple[str, ...] = ("bundled",), repeats: int = 5) -> None:
    """The flags every model benchmark shares (which models, device, dtype, picture size, rounds,
    JSON output); each bench adds its own after them."""
    parser.add_argument("--models", nargs="+", default=list(models), metavar="MODEL",
                        help="bundled, larger, real, or a config.json / model folder")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    parser.add_argument("--dtype", default="auto", help="float32, bfloat16, float16 or auto (default)")
    parser.add_argument("--image-size", default="384x768", metavar="HxW", help="synthetic image size")
    parser.add_argument("--repeats", type=read_whole, default=repeats, help="timed rounds per mode")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON")

