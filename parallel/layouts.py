"""The one layout-name grammar: `fsdp2xtp2sp`, `ep2xtp2`, `cp2-ring`, `dp2xpp2-zb+ac` <-> ParallelConfig.

    pcfg = parse_layout("fsdp2xtp2sp+sac")          # ParallelConfig(dp_shard=2, tp=2, sequence_parallel=True, ...)
    layout_name(pcfg)                                # "fsdp2xtp2sp+sac"

Used by `scalelab parity`, the layout planner (its table's names) and the CLI. A name is `single`
(one device) or parts joined by `x`, each an axis and its size with options, then `+` modifiers:

    dpN                    DDP / HSDP replicas (dp_replicate)
    fsdpN[-zero2|-zero3]   FSDP2 shard group (dp_shard); -zero2 keeps parameters gathered until backward
    epN                    expert parallel inside dp_shard × cp; without an fsdp part (and unless cp
                           holds it) the shard group is the ep group: ep2 = fsdp2xep2
    tpN[sp]                tensor parallel; `sp` adds sequence parallel and loss-parallel cross-entropy
    ppN[-gpipe|-1f1b|-interleaved|-zb]   pipeline stages and schedule (default 1f1b; zb = zero-bubble V)
    cpN[-ring|-allgather]  context parallel (default all-gather K/V)
    +ac / +sac             full / selective activation checkpointing
    +compile / +bf16       torch.compile of each block / bf16 mixed precision

Parts may come in any order, each axis once; the name printed by `layout_name` has them in the
order above. Every degree is checked against the world and the model later, by ParallelDims.
"""

from __future__ import annotations

import dataclasses
import re

from scalelab.errors import UsageError
from scalelab.parallel.config import AC_MODES, ParallelConfig

SCHEDULE_NAMES = {
    "gpipe": "gpipe",
    "1f1b": "1f1b",
    "interleaved": "interleaved-1f1b",
    "interleaved-1f1b": "interleaved-1f1b",
    "zb": "zero-bubble",
    "zbv": "zero-bubble",
    "zero-bubble": "zero-bubble",
}
_SHORT_SCHEDULE = {"gpipe": "gpipe", "1f1b": "1f1b", "interleaved-1f1b": "interleaved", "zero-bubble": "zb"}
_PART = re.compile(r"^(dp|fsdp|tp|pp|cp|ep)(\d+)(.*)$")
_AC = {modifier[1:]: mode for mode, modifier in AC_MODES.items() if modifier}  # "sac" -> "selective"
_EXAMPLES = "use parts like dp2, fsdp2, fsdp2-zero2, tp2sp, pp2-1f1b, cp2-ring, ep2 joined by x"


def parse_layout(name: str, base: ParallelConfig | None = None) -> ParallelConfig:
    """The ParallelConfig a layout name describes (see the module docstring); UsageError if malformed.

    base: the options a name does not set (backend, mixed precision, ...); default ParallelConfig().
    The axes, sequence/loss parallel, the schedule, the cp variant, AC and compile come from the name.
    """
    text, *mods = name.strip().split("+")
    cfg = dataclasses.replace(
        base or ParallelConfig(),
        dp_replicate=1,
        dp_shard=1,
        tp=1,
        pp=1,
        cp=1,
        ep=1,
        sequence_parallel=False,
        loss_parallel=False,
        activation_checkpoint="none",
        compile=False,
    )
    seen: set[str] = set()
    if text != "single":
        for part in text.split("x"):
            m = _PART.match(part)
            if not m:
                raise UsageError(f"layout {name!r}: cannot read {part!r}; {_EXAMPLES}")
            axis, size, opt = m.group(1), int(m.group(2)), m.group(3)
            if axis in seen or size < 1:
                raise UsageError(f"layout {name!r}: {axis} given twice or with size < 1")
            seen.add(axis)
            _set_part(cfg, name, axis, size, opt)
        if "ep" in seen and "fsdp" not in seen and cfg.cp % cfg.ep:
            cfg.dp_shard = cfg.ep  # experts are sharded inside dp_shard × cp: ep2 alone is fsdp2xep2
    for mod in mods:
        if mod in _AC:
            cfg.activation_checkpoint = _AC[mod]
        elif mod == "compile":
            cfg.compile = True
        elif mod == "bf16":
            cfg.mixed_precision = "bf16"
        else:
            raise UsageError(f"layout {name!r}: unknown modifier +{mod}; use +ac, +sac, +compile or +bf16")
    return cfg


def _set_part(cfg: ParallelConfig, name: str, axis: str, size: int, opt: str) -> None:
    if axis == "dp" and not opt:
        cfg.dp_replicate = size
    elif axis == "fsdp" and opt in ("", "-zero3", "-zero2"):
        cfg.dp_shard = size
        cfg.fsdp_reshard_after_forward = opt != "-zero2"
    elif axis == "tp" and opt in ("", "sp"):
        cfg.tp = size
        cfg.sequence_parallel = cfg.loss_parallel = opt == "sp"
    elif axis == "pp" and (not opt or opt[1:] in SCHEDULE_NAMES):
        cfg.pp = size
        cfg.pp_schedule = SCHEDULE_NAMES[opt[1:]] if opt else "1f1b"
    elif axis == "cp" and opt in ("", "-ring", "-allgather"):
        cfg.cp = size
        cfg.cp_variant = opt[1:] or "allgather"
    elif axis == "ep" and not opt:
        cfg.ep = size
    else:
        raise UsageError(f"layout {name!r}: unknown option {opt!r} on {axis}; {_EXAMPLES}")


def layout_name(cfg: ParallelConfig) -> str:
    """The canonical name of a layout: parse_layout(layout_name(cfg)) has the same axes and options."""
    parts = []
    if cfg.dp_replicate > 1:
        parts.append(f"dp{cfg.dp_replicate}")
    implied_shard = cfg.ep > 1 and cfg.dp_shard == cfg.ep and cfg.cp % cfg.ep != 0
    if cfg.dp_shard > 1 and (not implied_shard or not cfg.fsdp_reshard_after_forward):
        parts.append(f"fsdp{cfg.dp_shard}" + ("" if cfg.fsdp_reshard_after_forward else "-zero2"))
    if cfg.ep > 1:
        parts.append(f"ep{cfg.ep}")
    if cfg.tp > 1:
        parts.append(f"tp{cfg.tp}" + ("sp" if cfg.sequence_parallel else ""))
    if cfg.pp > 1:
        parts.append(f"pp{cfg.pp}" + ("" if cfg.pp_schedule == "1f1b" else f"-{_SHORT_SCHEDULE[cfg.pp_schedule]}"))
    if cfg.cp > 1:
        parts.append(f"cp{cfg.cp}" + ("-ring" if cfg.cp_variant == "ring" else ""))
    text = "x".join(parts) or "single"
    text += AC_MODES[cfg.activation_checkpoint]
    if cfg.compile:
        text += "+compile"
    if cfg.mixed_precision == "bf16":
        text += "+bf16"
    return text
