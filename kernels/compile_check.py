"""Compile every Triton kernel for an NVIDIA GPU target without a GPU (ahead of time) and report
shared memory, registers and spills per kernel and launch config.

The interpreter tests check the kernels' math on CPU; this checks that the same source also
compiles for the real target (Hopper sm_90 by default) with every autotune config, which the
interpreter cannot tell. It uses the ptxas bundled with Triton; no CUDA driver is needed.

  env -u TRITON_INTERPRET python -m scalelab.kernels.compile_check            # every config (~minutes)
  env -u TRITON_INTERPRET python -m scalelab.kernels.compile_check --quick    # first config of each

Must run with TRITON_INTERPRET unset (the kernels have to be compiled JIT functions).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from scalelab.kernels import attention as A
from scalelab.kernels import fused_ce as CE
from scalelab.kernels import rms_norm as RN
from scalelab.kernels import rope as RO
from scalelab.kernels import swiglu as SW

_FLOAT_ARGS = {"qk_scale", "sm_scale", "eps", "z_loss"}


def _ptxas() -> str | None:
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    for name in ("ptxas-blackwell", "ptxas"):  # the newer one reads the newest PTX versions
        path = os.path.join(bin_dir, name)
        if os.path.exists(path):
            return path
    return None


def _compile(fn, ptr_types: dict[str, str], consts: dict, num_warps: int, num_stages: int, target) -> str:
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in ptr_types:
            sig[name] = ptr_types[name]
        else:
            sig[name] = "fp32" if name in _FLOAT_ARGS else "i32"
    kernel = triton.compile(
        ASTSource(fn, sig, consts), target=target, options={"num_warps": num_warps, "num_stages": num_stages}
    )
    info = f"smem {kernel.metadata.shared} B"
    ptxas = _ptxas()
    if ptxas:  # registers and spills, from ptxas -v on the PTX Triton produced
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(kernel.asm["ptx"])
        res = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{target.arch}a", f.name, "-o", os.devnull],
                             capture_output=True, text=True, check=False)  # fmt: skip
        os.unlink(f.name)
        for line in (res.stdout + res.stderr).splitlines():
            if "registers" in line:
                info += ", " + line.split(":", 1)[-1].strip().split(",")[0]
            elif "spill stores" in line:
                info += ", " + line.split(",")[-2].strip()
    return info


def check(quick: bool, arch: int = 90, head_dims=(64, 128)) -> int:
    """Compile all kernels (first autotune config only when quick); print one line each; 0 if all compile."""
    target = GPUTarget("cuda", arch, 32)
    jobs = []
    # pointers, and each tensor's strides as one tuple (attention.py passes `t.stride()` whole)
    strides = {n: ("i32",) * 4 for n in ("sq", "sk", "sv", "so", "sdo", "sdq", "sdk", "sdv")}
    attn_ptrs = lambda dt: {**{n: f"*{dt}" for n in ("Q", "K", "V", "Out", "DO", "DQ", "DK", "DV")},
                            "LSE": "*fp32", "DELTA": "*fp32", **strides}  # fmt: skip
    for dt, tdt in (("bf16", tl.bfloat16), ("fp16", tl.float16)):
        for d in head_dims:
            base = dict(HEAD_DIM=d, BLOCK_D=d, DT=tdt, PREC="tf32", CAUSAL=True)
            for fn, tuned, extra in (
                (A._attn_fwd, A._attn_fwd_tuned, {"MASK_S": False}),
                (A._attn_bwd_dkdv, A._attn_bwd_dkdv_tuned, {}),
                (A._attn_bwd_dq, A._attn_bwd_dq_tuned, {"MASK_S": False}),
            ):
                for cfg in tuned.configs[:1] if quick else tuned.configs:
                    consts = {**base, **extra, **cfg.kwargs}
                    label = f"{fn.__name__} {dt} D={d} {cfg.kwargs} w{cfg.num_warps} s{cfg.num_stages}"
                    jobs.append((label, fn, attn_ptrs(dt), consts, cfg.num_warps, cfg.num_stages))
            consts = dict(HEAD_DIM=d, BLOCK_D=d, BLOCK_M=64)
            jobs.append((f"_attn_bwd_delta {dt} D={d}", A._attn_bwd_delta, attn_ptrs(dt), consts, 4, 3))
            if quick:
                break
        if quick:
            break
    bf = "*bf16"
    for res in (False, True):
        ptrs = {"X": bf, "R": bf, "W": bf, "Y": bf, "S_OUT": bf, "RSTD": "*fp32"}
        jobs.append((f"_rms_fwd residual={res}", RN._rms_fwd, ptrs, dict(HAS_RES=res, BLOCK_R=1, BLOCK_D=4096), 8, 3))
        ptrs = {"DY": bf, "X": bf, "W": bf, "RSTD": "*fp32", "DS": bf, "DX": bf, "DW_PART": "*fp32"}
        jobs.append((f"_rms_bwd ds={res}", RN._rms_bwd, ptrs, dict(HAS_DS=res, BLOCK_R=1, BLOCK_D=4096), 8, 3))
    ptrs = {"G": bf, "U": bf, "Out": bf, "DO": bf, "DG": bf, "DU": bf}
    for fn in (SW._swiglu_fwd, SW._swiglu_bwd):
        jobs.append((fn.__name__, fn, ptrs, dict(BLOCK_R=4, BLOCK_F=1024), 8, 3))
    ptrs = {"X": bf, "OUT": bf, "COS": "*fp32", "SIN": "*fp32"}
    for bwd in (False, True):
        jobs.append((f"_rope_kernel backward={bwd}", RO._rope_kernel, ptrs, dict(BACKWARD=bwd, BLOCK_R=32, BLOCK_D=64),
                     8, 3))  # fmt: skip
    ptrs = {"LOGITS": "*fp32", "TARGETS": "*i64", "LOSS": "*fp32", "SCALE": "*fp32"}
    for z in (False, True):
        consts = dict(HAS_Z=z, COMPUTE_GRAD=True, BLOCK_V=2048)
        jobs.append((f"_ce_rows z_loss={z}", CE._ce_rows, ptrs, consts, 8, 3))
    failures = 0
    for label, fn, ptrs, consts, warps, stages in jobs:
        try:
            print(f"ok   {label}: {_compile(fn, ptrs, consts, warps, stages, target)}", flush=True)
        except Exception as e:  # report every failing kernel, not just the first
            failures += 1
            print(f"FAIL {label}: {type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}", flush=True)
    print(f"{len(jobs) - failures}/{len(jobs)} kernels compiled for sm_{arch}")
    return 1 if failures else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="first autotune config, bf16, D=64 only")
    p.add_argument("--arch", type=int, default=90, help="CUDA compute capability x10 (90 = Hopper)")
    args = p.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("compile_check needs TRITON_INTERPRET unset (run with `env -u TRITON_INTERPRET ...`)")
        return 2
    return check(args.quick, args.arch)


if __name__ == "__main__":
    sys.exit(main())
