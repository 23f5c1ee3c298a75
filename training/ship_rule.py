"""The rule that decides whether a trained artifact replaces the shipped default (issue 28): validation and a
product check, never the evaluation questions.

Three conditions, all required (``scripts/ship_check.py`` gathers the inputs and prints the verdict):

1. **Validation** (the recipe's fixed validation examples per task, :func:`training.samples.task_losses`):
   the mean over tasks of NLL(candidate) / NLL(shipped) is below 1 *and* no task's ratio exceeds
   ``max_task_ratio`` (1.10: one task's large gain, such as key-value retrieval's, may not pay for another's
   loss; the 2026-12-06 mixture artifact had nq 1.08 beside kv 0.23).
2. **Contrast check** (:mod:`evaluation.contrast`, 48 hand-written cases in both orders, 96 prompts, linked
   answers): the candidate answers at least as many prompts right as the shipped artifact. Until 2026-12-06d
   the check was the first 16 cases (32 prompts), where one prompt decided the polarity artifact's verdict and
   one run's checkpoints read 0.28 / 0.50 / 0.41; the 32 cases added in 2026-12-06e were written, and this
   condition restated, before any artifact was run on them.
3. **The newcomer case** (the README's first example, issue 17): "What does the warranty cover?" over the
   coverage note and the exclusions FAQ, in both orders, answered from the coverage (the contrast check's
   case 0). ``make test`` asserts the first order for the shipped default.

No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_TASK_RATIO = 1.10


@dataclass(frozen=True)
class Verdict:
    """Whether the candidate ships, and why not (one line per failed condition)."""

    ships: bool
    rule_score: float
    ratios: dict[str, float]
    contrast: tuple[int, int]
    newcomer_ok: bool
    reasons: list[str] = field(default_factory=list)


def verdict(shipped_nll: dict[str, float], candidate_nll: dict[str, float], contrast_shipped: list[float],
            contrast_candidate: list[float], newcomer_ok: bool, max_task_ratio: float = MAX_TASK_RATIO) -> Verdict:
    """The rule (module docstring) over per-task validation NLL (nats/token), the contrast check's per-prompt
    scores (0/1, the same prompts in the same order) and the newcomer case.

    Raises:
        ValueError: the two NLL dicts name different tasks, a shipped NLL is not above 0, or the contrast
            lists differ in length or are empty.
    """
    if set(shipped_nll) != set(candidate_nll) or not shipped_nll:
        raise ValueError(f"validation tasks differ: {sorted(shipped_nll)} vs {sorted(candidate_nll)}")
    if any(v <= 0 for v in shipped_nll.values()):
        raise ValueError(f"shipped NLL must be > 0 per task, got {shipped_nll}")
    if len(contrast_shipped) != len(contrast_candidate) or not contrast_shipped:
        raise ValueError(f"contrast scores differ in length: {len(contrast_shipped)} vs {len(contrast_candidate)}")
    ratios = {t: candidate_nll[t] / shipped_nll[t] for t in sorted(shipped_nll)}
    score = sum(ratios.values()) / len(ratios)
    counts = (int(sum(contrast_shipped)), int(sum(contrast_candidate)))
    reasons = []
    if score >= 1:
        reasons.append(f"validation: mean NLL ratio {score:.3f} >= 1")
    worse = {t: r for t, r in ratios.items() if r > max_task_ratio}
    if worse:
        reasons.append("validation: " + ", ".join(f"{t} {r:.2f}" for t, r in worse.items())
                       + f" above {max_task_ratio:.2f} of the shipped NLL")
    if counts[1] < counts[0]:
        reasons.append(f"contrast check: {counts[1]} of {len(contrast_shipped)} right against the shipped "
                       f"artifact's {counts[0]}")
    if not newcomer_ok:
        reasons.append("newcomer case: the warranty question is not answered from the coverage note")
    return Verdict(not reasons, score, ratios, counts, newcomer_ok, reasons)
