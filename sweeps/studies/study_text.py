"""A study's fit and comparisons in words: what `sweep study` prints.

    print(format_study(fit_study("results/studies/study-arch")))

Every gap is printed with the estimator it comes from and its interval's parts (sds in loss units,
added in quadrature), named by PARTS, so a reader can see which one decides the width.
Each comparison's verdict is written by scalelab.fitting.comparisons.comparison.verdict (the one writer, shared
with `scalelab compare`); PARTS and ESTIMATOR_TEXT are kept there too. Duck-typed on
scalelab.sweeps.studies.study_fit's StudyFit.
"""

from __future__ import annotations

import math

from scalelab.fitting.comparisons.comparison import ESTIMATOR_TEXT, PARTS
from scalelab.fitting.comparisons.gap_drift import SE_WEIGHT


def _iv(iv) -> str:
    return f"[{iv[0]:.3g}, {iv[1]:.3g}]"


def parts_text(gap) -> str:
    """`bootstrap 0.0123, drift 0.0200 at 1.00 decades, ...` for a GapInterval."""
    names = [k for k in PARTS.get(gap.estimator, {}) if k in gap.parts]
    out = []
    for k in names:
        v = gap.parts[k]
        text = f"{k} {v:.4f}" if math.isfinite(v) else f"{k} unmeasured"
        if k in ("drift", "extrapolation"):
            text += f" at {gap.parts.get('decades', 0.0):.2f} decades"
        out.append(text)
    return ", ".join(out)


def gap_line(label: str, gap) -> str:
    name = ESTIMATOR_TEXT.get(gap.estimator, gap.estimator)
    return f"{label}: {gap.point:+.4f} [{gap.lo:+.4f}, {gap.hi:+.4f}] ({name}; sds {parts_text(gap)})"


def _arm_lines(sf, pct: str) -> list[str]:
    lines = [f"  {'arm':12} {'runs':>4} {'gates':24} parameters ({pct} interval)"]
    for name, a in sf.arms.items():
        f = a.fit
        gates = "pass" if a.passed else "FAIL: " + ",".join(f.gates.failed if f.gates else ["none"])
        params = ", ".join(f"{k}={v:.4g} {_iv(f.intervals[k])}" for k, v in f.params.items() if k in f.intervals)
        lines.append(f"  {name:12} {a.n_runs:>4} {gates:24} {params}")
    return lines


def _drift_text(e) -> str:
    """The drift part's basis: noise-corrected (scalelab.fitting.comparisons.gap_drift) or the first version's k_gap."""
    t = e.drift_term
    if t is not None:
        if not math.isfinite(t.k2):
            return "drift unmeasured"
        return (
            f"drift {t.per_decade:.4f} per decade (noise-corrected k^2 {t.k2:.3g} + {SE_WEIGHT} se {t.se:.3g}, "
            f"{len(t.misses)} fold miss(es); pure error {e.noise.sigma:.4f}, size pattern {e.noise.tau:.4f})"
        )
    k = e.backtest.error
    return "backtested drift k_gap = " + (
        f"{k.per_decade:.4f} per decade over {k.n_folds} fold(s) (x Student's t)"
        if k.per_decade is not None
        else "unmeasured"
    )


def _paired_lines(c) -> list[str]:
    """The paired views: the gap model, its choice and backtest; the frontier gap; the joint law's."""
    p = c.paired
    if p is None:
        return []
    e = p.estimate
    lines = [
        f"  paired gap model ({p.n_pairs} matched pairs, {p.replicates} design-point replicates): {e.model} gap, "
        f"ln(L_{c.arm}/L_{c.baseline}) = {e.line.intercept:+.4f} at log10 C = {e.line.x_ref:.2f}"
        + (f", drift {e.line.slope:+.4f} per decade" if e.line.drift else "")
        + f"; scatter per point {e.line.scatter_sd:.4f} (residual {e.line.residual_sd:.4f})",
        f"    rule: leave-one-budget-out mean squared miss, constant {e.choice.cv_constant:.3g} vs drift "
        f"{e.choice.cv_drift:.3g}; " + _drift_text(e),
        f"    at the target, ln ratio {e.at_target.point:+.4f} [{e.at_target.lo:+.4f}, {e.at_target.hi:+.4f}]",
    ]
    if c.estimator != "paired":
        lines.append("  " + gap_line("gap at the decisive measurement", p.matched))
    lines.append("  " + gap_line("gap between the frontiers", p.frontier))
    if p.joint_matched is not None:
        lines.append("  " + gap_line("joint law, decisive measurement", p.joint_matched))
        lines.append("  " + gap_line("joint law, frontiers", p.joint_frontier))
    return lines


def format_study(sf) -> str:
    """Per arm: its fit and gates; per comparison: m(C), the gaps at the target, the verdict."""
    pct = f"{100 * sf.options.level:.0f}%"
    lines = [
        f"study {sf.sweep_dir.name}: baseline {sf.study.baseline}, target {sf.study.target_flops:.3g} FLOPs, "
        f"verdicts by the {ESTIMATOR_TEXT[sf.estimator]} (--estimator)"
    ]
    lines += _arm_lines(sf, pct)
    for c in sf.comparisons:
        lines.append(f"{c.arm} over {c.baseline}: multiplier m(C) = C_{c.baseline}(L*_{c.arm}(C)) / C")
        lines.append(f"  {'budget (FLOPs)':>16} {'m':>8} {pct + ' interval':>22}")
        for budget, m, iv in zip(c.budgets, c.multipliers, c.intervals):
            if budget != c.target_flops:  # once the target's runs are in, its row is the one below
                lines.append(f"  {budget:>16.3g} {m:>8.3f} {_iv(iv):>22}")
        lines.append(f"  {c.target_flops:>16.3g} {c.multiplier_at_target:>8.3f} {_iv(c.target_interval):>22}  (target)")
        lines.append(f"  slope d ln m / d ln C: {c.slope:.4f} {_iv(c.slope_interval)}")
        n_pts = len(c.runs[c.baseline])
        for arm, pts in c.runs.items():
            sizes = ", ".join(f"{n:,.0f}" for n in sorted({n for n, _ in pts}))
            lines.append(
                f"  {arm:12} at the target: {n_pts} run(s), N = {sizes}: mean predicted loss {c.mean_loss(arm):.4f}"
            )
        lines.append("  " + gap_line(f"gap L_{c.arm} - L_{c.baseline}, the verdict's", c.gap))
        lines += _paired_lines(c)
        if c.estimator != "separate":
            lines.append("  " + gap_line("each arm's own law (for comparison)", c.separate_gap))
        lines.append("  " + c.verdict)
    lines += [f"warning: {w}" for w in sf.warnings]
    return "\n".join(lines)
