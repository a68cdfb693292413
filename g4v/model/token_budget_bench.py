"""``python -m g4v bench token-budget``: prefill time against the kept fraction of image tokens, in one run.

On one synthetic image prompt (``g4v.model.bench``: the bundled checkpoint, a larger or the real
config with random weights, the same compute) it measures, interleaved round by round and taking
each mode's fastest round:

* ``encode``: the vision tower and the 8 projectors (:func:`~g4v.model.encoding.encode_images`),
  which every budget pays in full (the picture is encoded before tokens are chosen);
* ``prefill K%``: the language model's prefill (one forward to the first answer token's logits)
  on the sequence with K % of the image tokens, features given pre-encoded, for each K; the
  speed-up is ``prefill 100%`` over it;
* ``rank POLICY``: what each policy's choice costs on top (norm and random: nothing but a sort;
  attention: a full eager forward; attribution: a forward and a backward pass).
"""

import argparse
from dataclasses import dataclass
from functools import partial

import torch

from g4v.model.bench import add_model_flags, build_model, fastest_seconds, run_benchmarks, synthetic_inputs
from g4v.model.encoding import encode_images
from g4v.model.token_budget import DEFAULT_KEEPS, POLICIES, SCORERS, TokenBudget, kept_indices, without_tokens


@dataclass
class TokenBudgetBench:
    model: str
    device: str
    seq_len: int
    image_tokens: int
    keeps: list[int]
    seq_lens: dict  # "prefill K%" -> tokens in the sequence
    seconds: dict  # mode -> fastest seconds

    def ratios(self) -> dict:
        """Prefill speed-up at each K (100 % over K %) and each policy's ranking cost in 100 % prefills."""
        full = self.seconds["prefill 100%"]
        speedups = {f"prefill speed-up {k}%": full / self.seconds[f"prefill {k}%"] for k in self.keeps}
        ranks = {f"rank {p} / prefill 100%": self.seconds[f"rank {p}"] / full for p in POLICIES}
        return {**speedups, **ranks, "encode / prefill 100%": self.seconds["encode"] / full}


def _prefill(model, inputs: dict) -> None:
    with torch.inference_mode():
        model(**inputs, logits_to_keep=1, use_cache=False)


def _rank(model, inputs: dict, encoded, policy: str) -> None:
    with torch.inference_mode(policy != "attribution"):
        SCORERS[policy](model, inputs, encoded, TokenBudget(50, policy))


def bench(name: str, device: torch.device, dtype: torch.dtype, image_size_hw: tuple[int, int], repeats: int,
          keeps=DEFAULT_KEEPS) -> TokenBudgetBench:
    label, model = build_model(name, device, dtype)
    inputs = synthetic_inputs(model.config, image_size_hw, device, dtype)
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    encoded = encode_images(model, inputs)
    keeps = sorted({100, *keeps}, reverse=True)
    runs, seq_lens = {"encode": partial(encode_images, model, inputs)}, {}
    for keep in keeps:
        kept = kept_indices(SCORERS["random"](model, inputs, encoded, TokenBudget(keep, "random")), TokenBudget(keep))
        reduced = without_tokens(model, inputs, encoded, kept)
        seq_lens[f"prefill {keep}%"] = int(reduced["input_ids"].shape[1])
        runs[f"prefill {keep}%"] = partial(_prefill, model, reduced)
    for policy in POLICIES:
        runs[f"rank {policy}"] = partial(_rank, model, inputs, encoded, policy)
    seconds = fastest_seconds(runs, device, repeats)
    image_tokens = int((inputs["input_ids"] == model.config.image_token_index).sum())
    return TokenBudgetBench(label, str(device), int(inputs["input_ids"].shape[1]), image_tokens, keeps, seq_lens,
                            seconds)


def format_result(result: TokenBudgetBench) -> str:
    ratios = result.ratios()
    lines = [f"{result.model} on {result.device}: {result.seq_len} tokens ({result.image_tokens} image)",
             f"  encode (vision tower + 8 projectors, every budget) {result.seconds['encode'] * 1e3:.1f} ms"]
    for keep in result.keeps:
        mode = f"prefill {keep}%"
        lines.append(f"  {mode:<13} {result.seq_lens[mode]:>6} tokens {result.seconds[mode] * 1e3:9.1f} ms  "
                     f"speed-up x{ratios[f'prefill speed-up {keep}%']:.2f}")
    for policy in POLICIES:
        lines.append(f"  rank {policy:<12} {result.seconds[f'rank {policy}'] * 1e3:9.1f} ms  "
                     f"(x{ratios[f'rank {policy} / prefill 100%']:.2f} of a full prefill)")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_flags(parser)
    parser.add_argument("--keeps", default=",".join(map(str, DEFAULT_KEEPS)), metavar="K,K,...",
                        help="kept percentages of image tokens (100 is always measured: the reference)")


def run(args) -> int:
    from g4v.errors import WHOLE_TEXT, G4VError

    parts = [part.strip() for part in args.keeps.split(",")]
    if not all(WHOLE_TEXT.fullmatch(part) and len(part) <= 3 for part in parts):
        raise G4VError(f"--keeps wants whole percentages like 100,75,50,25,10, got {args.keeps!r}")
    keeps = [TokenBudget(int(part)).keep for part in parts]
    return run_benchmarks(args, partial(_bench_keeps, keeps=keeps), format_result)


def _bench_keeps(name, device, dtype, image_size_hw, repeats, keeps):
    return bench(name, device, dtype, image_size_hw, repeats, keeps)
