"""A study's fit and comparisons in words: the verdict and what `sweep study` prints.

    print(format_study(fit_study("results/studies/study-arch")))
    verdict(cmp, largest=2e12)          # one comparison's answer, naming its estimator and interval parts

Every gap is printed with the estimator it comes from and its interval's parts (sds in loss units,
added in quadrature), named by PARTS below, so a reader can see which one decides the width.
Duck-typed on scalelab.sweeps.study_fit's StudyFit and ArmComparison (that module imports this one).
"""

from __future__ import annotations

import math

from scalelab.fitting.gap_drift import SE_WEIGHT

# what each part of a gap's interval is, per estimator (sds in loss units)
PARTS = {
    "paired": {
        "bootstrap": "the gap model's spread over the design-point bootstrap shared by both arms",
        "drift": "the gap model's out-of-sample drift per decade (its own backtests, the budget means' noise taken "
        "out) times the target's distance from the design's centroid",
        "scatter": "the decisive measurement's own spread (the size pattern over its sizes, pure error over its pairs)",
        "baseline": "the baseline's predicted loss the log ratio is converted at",
    },
    "joint": {
        "bootstrap": "the shared-exponent law's spread over the same design-point bootstrap",
        "drift": "that law's gap backtested the same way, times the decades to the target",
        "scatter": "the decisive measurement's own spread",
    },
    "separate": {
        "bootstrap": "the spread of the arms' own laws over their bootstrap replicates, paired by index",
        "noise": "the measured runs' noise over the measurement's pairs",
        "extrapolation": "the arms' laws' paired backtests per decade times the decades to the target",
    },
}
ESTIMATOR_TEXT = {
    "paired": "paired gap model",
    "joint": "shared-exponent law",
    "separate": "each arm's own law",
}


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


def verdict(cmp, *, largest: float) -> str:
    """The study's answer for one arm, in words (scalelab.sweeps.study_fit)."""
    pct = f"{100 * cmp.level:.0f}%"
    a, b, g = cmp.baseline, cmp.arm, cmp.gap
    where = f"at C = {cmp.target_flops:.3g} FLOPs ({cmp.target_flops / largest:.3g}x the largest budget)"
    rel = abs(g.point) / cmp.mean_loss(a)
    loser = a if cmp.winner == b else b
    by = f"by the {ESTIMATOR_TEXT[cmp.estimator]}"
    if cmp.paired is not None and cmp.estimator == "paired":
        by += f" ({cmp.paired.estimate.model} gap in log C, {cmp.paired.n_pairs} matched pairs)"
    if g.decided:
        head = (
            f"{cmp.winner} wins {where}: predicted loss {abs(g.point):.4f} below {loser}'s ({rel:.2%}) {by}; "
            f"{pct} interval of L_{b} - L_{a} [{g.lo:+.4f}, {g.hi:+.4f}] excludes 0."
        )
    else:
        head = (
            f"The data cannot tell {a} and {b} apart {where}: predicted L_{b} - L_{a} = {g.point:+.4f} {by}, "
            f"{pct} interval [{g.lo:+.4f}, {g.hi:+.4f}] contains 0 (leaning {cmp.winner})."
        )
    m, iv = cmp.multiplier_at_target, cmp.target_interval
    mult = f" Multiplier of {b} over {a} at the target: {m:.3g} {pct} {_iv(iv)}"
    if not math.isnan(iv[0]) and (iv[0] > 1 or iv[1] < 1):
        mult += " (excludes 1"
        mult += "; the frontiers differ, but the runs at the target may not show it)." if not g.decided else ")."
    else:
        mult += " (contains 1)."
    s, s_iv = cmp.slope, cmp.slope_interval
    if math.isnan(s_iv[0]):
        trend = ""
    elif s_iv[0] > 0 or s_iv[1] < 0:
        trend = f" It changes with scale: d ln m / d ln C = {s:.3f} {_iv(s_iv)} excludes 0."
    else:
        trend = f" No evidence that it changes with scale: slope {s:.3f} {_iv(s_iv)} contains 0."
    return head + mult + trend


def _arm_lines(sf, pct: str) -> list[str]:
    lines = [f"  {'arm':12} {'runs':>4} {'gates':24} parameters ({pct} interval)"]
    for name, a in sf.arms.items():
        f = a.fit
        gates = "pass" if a.passed else "FAIL: " + ",".join(f.gates.failed if f.gates else ["none"])
        params = ", ".join(f"{k}={v:.4g} {_iv(f.intervals[k])}" for k, v in f.params.items() if k in f.intervals)
        lines.append(f"  {name:12} {a.n_runs:>4} {gates:24} {params}")
    return lines


def _drift_text(e) -> str:
    """The drift part's basis: noise-corrected (scalelab.fitting.gap_drift) or the first version's k_gap."""
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
