"""The numbers against the references: the comparison table, and the checks of the integer model vs the
fake-quant one (top-1 agreement, mean logits cosine, SQNR) against the thresholds of the options."""

from __future__ import annotations

from .. import compare
from .options import DEFAULT_MIN_AGREEMENT, ValidateOptions
from .result import FAILED, PASSED, SKIPPED, Check


def comparison_table(stats: dict[str, dict[str, compare.PairStats]]) -> dict[str, dict]:
    """``{pair label: {output: metrics}}`` for every output that saw samples."""
    return {
        label: {o: s.as_dict() for o, s in per_out.items() if s.samples} for label, per_out in stats.items()
    }


def fake_quant_checks(fq: dict[str, compare.PairStats] | None, opts: ValidateOptions) -> list[Check]:
    """Top-1 agreement (on real data, or when asked), cosine and SQNR of the int model vs the fake-quant."""
    if fq is None:
        return []
    live = {o: s for o, s in fq.items() if s.samples}
    if not live:
        return [Check("top-1 agreement vs fake-quant", SKIPPED, "no comparable output")]
    checks = []
    agreements = {o: s.agreement for o, s in live.items() if s.agreement is not None}
    if agreements and opts.data is None and opts.min_agreement is None:
        # random inputs give low-margin logits: a correct model's top-1 flips on them, so it is no signal
        checks.append(
            Check(
                "top-1 agreement vs fake-quant",
                SKIPPED,
                f"{100 * min(agreements.values()):.2f}% (not checked on random inputs; "
                "give --data for real ones)",
            )
        )
    elif agreements:
        worst = min(agreements.values())
        want = DEFAULT_MIN_AGREEMENT if opts.min_agreement is None else opts.min_agreement
        ok = worst >= want
        checks.append(
            Check(
                "top-1 agreement vs fake-quant",
                PASSED if ok else FAILED,
                f"{100 * worst:.2f}% {'≥' if ok else '<'} {100 * want:.2f}%",
            )
        )
    else:
        checks.append(Check("top-1 agreement vs fake-quant", SKIPPED, "no [N, classes] output"))
    cos = min(s.cosine for s in live.values())
    ok = cos >= opts.min_cosine
    checks.append(
        Check(
            "output cosine vs fake-quant",
            PASSED if ok else FAILED,
            f"mean {cos:.5f} {'≥' if ok else '<'} {opts.min_cosine} "
            f"(min {min(s.cos_min for s in live.values()):.5f})",
        )
    )
    sqnr = min(s.sqnr for s in live.values())
    ok = sqnr >= opts.min_sqnr  # cosine ignores a wrong scale; the signal-to-error ratio does not
    checks.append(
        Check(
            "output SQNR vs fake-quant",
            PASSED if ok else FAILED,
            f"{sqnr:.2f} dB {'≥' if ok else '<'} {opts.min_sqnr:g} dB",
        )
    )
    return checks
