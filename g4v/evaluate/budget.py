"""Token-budget sweeps: how accuracy and KL fall as an arm keeps fewer image tokens.

One sweep is a set of ordinary dataset runs (:func:`~g4v.evaluate.run.run_eval`) of the same arm
against itself with a token budget (``--b A,keep=K,policy=P``), one run per (policy, K), each in a
folder of its own under the sweep's folder (so each is resumable and readable like any run), on
one engine (the budget arms share the plain arm's). ``keep=100`` is the plain request for every
policy, so it runs once (folder ``keep100``) and is every policy's first point. Then the curve:
per policy and K, B's accuracy with its Wilson 95 % interval and the mean per-row KL(plain ||
budget) with a normal 95 % interval of the mean; ``budget.json`` holds it.

Random is the control: a policy is worth its ranking pass only where it beats random's curve.
"""

import json
import math
import re
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from g4v.errors import MAX_NUMBER_CHARS, WHOLE_TEXT, G4VError, quoted
from g4v.evaluate.arms import ArmSpec, open_arm
from g4v.evaluate.run import EvalConfig, RunResult, run_eval
from g4v.evaluate.stats import Z95
from g4v.model.token_budget import DEFAULT_KEEPS, POLICIES, TokenBudget

#: The sweep's own summary, beside the runs' folders.
CURVE_FILE = "budget.json"


@dataclass
class BudgetPoint:
    """One (policy, kept %) run: the budget arm's accuracy and its KL from the plain arm."""

    policy: str
    keep: int
    n: int
    accuracy: float | None
    ci95: list[float] | None  # Wilson 95 %
    agreement: float | None  # same greedy tokens as the plain arm
    kl_mean: float | None  # mean over rows of the per-row mean KL(plain || budget), nats
    kl_ci95: list[float] | None  # normal 95 % interval of that mean
    run: str  # the run's folder, relative to the sweep's

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class BudgetCurve:
    """Accuracy and KL against the kept fraction, per policy (``points`` sorted by policy, then K
    descending); ``arm`` is the plain arm's name."""

    arm: str
    keeps: list[int]
    policies: list[str]
    points: list[BudgetPoint] = field(default_factory=list)

    def by_policy(self) -> dict[str, list[BudgetPoint]]:
        return {policy: [p for p in self.points if p.policy == policy] for policy in self.policies}

    def to_dict(self) -> dict:
        return {"arm": self.arm, "keeps": self.keeps, "policies": self.policies,
                "points": [point.to_dict() for point in self.points]}


def parse_keeps(text) -> tuple[int, ...]:
    """``"100,75,50"`` (or numbers) -> the checked kept percentages, largest first, no repeats."""
    parts = [str(part).strip() for part in (text.split(",") if isinstance(text, str) else text)]
    if not parts or any(not part for part in parts):
        raise G4VError(f"kept percentages must be a comma-separated list like 100,75,50,25,10, got {quoted(str(text))}")
    keeps = []
    for part in parts:
        if not WHOLE_TEXT.fullmatch(part) or len(part) > MAX_NUMBER_CHARS:
            raise G4VError(f"kept percentage {quoted(part)} is not a whole number from 1 to 100 (digits 0-9)")
        keeps.append(TokenBudget(int(part)).keep)
    return tuple(sorted(set(keeps), reverse=True))


def parse_policies(text) -> tuple[str, ...]:
    """``"norm,random"`` (or a list; ``all``: every policy) -> the checked policies, in :data:`POLICIES` order."""
    parts = [str(part).strip() for part in (text.split(",") if isinstance(text, str) else text)]
    if parts == ["all"]:
        return POLICIES
    for part in parts:
        if part not in POLICIES:
            raise G4VError(f"token policy must be one of {', '.join(POLICIES)} (or all), got {quoted(part)}")
    return tuple(policy for policy in POLICIES if policy in parts)


def budget_arm(plain: ArmSpec, keep: int, policy: str) -> ArmSpec:
    """The plain arm with a token budget, named by it."""
    if plain.backend != "hf":
        raise G4VError(f"a token budget runs on hf arms only, not {plain.display}")
    if plain.keep is not None:
        raise G4VError(f"the sweep's arm {plain.display} has a token budget already: give the plain arm")
    return replace(plain, keep=keep, policy=policy, label=f"keep {keep}% {policy}")


def sweep_runs(keeps, policies) -> list[tuple[str, int, str]]:
    """``(policy, keep, folder)`` of every run of a sweep; ``keep=100`` once (``keep100``)."""
    runs = [(policies[0], 100, "keep100")] if 100 in keeps else []
    return runs + [(policy, keep, f"{policy}-keep{keep}") for policy in policies for keep in keeps if keep != 100]


def run_budget_sweep(config: EvalConfig, out_dir: Path, keeps=DEFAULT_KEEPS, policies=POLICIES, *,
                     adapters_dir=None, reuse=None, data_dirs=None,
                     progress: Callable[[int, int], None] | None = None,
                     cancel: threading.Event | None = None) -> BudgetCurve:
    """Run ``config.a`` against itself at each kept percentage and policy (``config.b`` is not
    used), into ``out_dir``; resumable like any run. ``progress(done, total)`` counts rows over
    all runs."""
    keeps, policies = parse_keeps(keeps), parse_policies(policies)
    plain = replace(config.a, label=config.a.label or config.a.display)
    runs = sweep_runs(keeps, policies)
    configs = [replace(config, a=plain, b=budget_arm(plain, keep, policy)) for policy, keep, _ in runs]
    for each in configs:
        each.check()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cancel = cancel or threading.Event()
    arm = open_arm(plain, adapters_dir=adapters_dir, reuse=reuse)  # one engine for every run
    shared = {**(reuse or {}), plain.engine_key(): arm.engine}
    results: list[tuple[tuple[str, int, str], RunResult]] = []
    try:
        for number, (run, each) in enumerate(zip(runs, configs)):
            if cancel.is_set():
                break

            def report(done: int, total: int, number=number) -> None:
                if progress is not None:
                    progress(number * total + done, len(runs) * total)

            results.append((run, run_eval(each, out_dir / run[2], adapters_dir=adapters_dir, reuse=shared,
                                          data_dirs=data_dirs, progress=report, cancel=cancel)))
    finally:
        arm.close()
    curve = make_curve(plain.display, keeps, policies, results)
    (out_dir / CURVE_FILE).write_text(json.dumps(curve.to_dict(), indent=2))
    return curve


def make_curve(arm: str, keeps, policies, results) -> BudgetCurve:
    """The curve from the runs' results (``keep100`` stands for every policy's first point)."""
    points = []
    found = {(policy, keep): (folder, result) for (policy, keep, folder), result in results}
    for policy in policies:
        for keep in keeps:
            folder, result = found.get((policies[0] if keep == 100 else policy, keep), (None, None))
            if result is not None:
                points.append(point_of(policy, keep, folder, result))
    return BudgetCurve(arm, list(keeps), list(policies), points)


def point_of(policy: str, keep: int, folder: str, result: RunResult) -> BudgetPoint:
    summary = result.summary
    arm_b = summary.arms.b
    kls = [row.kl_mean for row in result.rows if row.kl_mean is not None and math.isfinite(row.kl_mean)]
    return BudgetPoint(policy, keep, summary.n, arm_b.accuracy, arm_b.ci95, summary.agreement,
                       *mean_interval(kls), folder)


def mean_interval(values: list[float]) -> tuple[float | None, list[float] | None]:
    """The mean and its normal 95 % interval (mean +- z * sd / sqrt(n), sd with n - 1, clipped at 0); one value
    gives a zero-width interval, none gives None."""
    if not values:
        return None, None
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    half = Z95 * sd / math.sqrt(n)
    return mean, [max(0.0, mean - half), mean + half]  # a KL is never below 0


def read_curve(out_dir: Path) -> dict | None:
    """A sweep's ``budget.json`` as written, or None."""
    path = Path(out_dir) / CURVE_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def curve_table(curve: dict) -> str:
    """One line per (policy, kept %): accuracy with its interval, agreement, mean KL with its interval."""
    lines = [f"token budget of {spaced(curve['arm'])}",
             f"{'policy':<12}{'keep':>5}{'n':>5}  {'accuracy':>16}  {'agree':>6}  {'KL mean [95%]':>24}"]
    for point in curve["points"]:
        agree = "-" if point["agreement"] is None else f"{100 * point['agreement']:.1f}%"
        kl = "-" if point["kl_mean"] is None else (f"{point['kl_mean']:.4f} [{point['kl_ci95'][0]:.4f}-"
                                                   f"{point['kl_ci95'][1]:.4f}]")
        accuracy = accuracy_text(point["accuracy"], point["ci95"])
        lines.append(f"{point['policy']:<12}{point['keep']:>4}%{point['n']:>5}  {accuracy:>16}  {agree:>6}  {kl:>24}")
    return "\n".join(lines)


def spaced(arm: str) -> str:
    """An arm's name for a sentence: ``hf(granite4-vision-tiny-trained)`` reads as
    ``hf (granite4-vision-tiny-trained)``, its model in brackets after a space."""
    return re.sub(r"^(\w+)\(", r"\1 (", arm, count=1)


def accuracy_text(accuracy: float | None, ci95: list[float] | None) -> str:
    """``"75.0% [41-93]"``: an accuracy with its Wilson interval, or ``-``."""
    if accuracy is None:
        return "-"
    low, high = ci95
    return f"{100 * accuracy:.1f}% [{100 * low:.0f}-{100 * high:.0f}]"
