"""ParallelDims: the arithmetic of one layout, checked against the world and the model, and its meshes.

    dims = ParallelDims.from_config(cfg.parallel, world_size=4, model=cfg.model, seq_len=256)
    dims.build_mesh("cpu")                 # named axes: pp, dp_replicate, dp_shard, cp, tp
    dims.mesh_for("tp"), dims.fsdp_mesh    # the named sub-meshes the parallelize steps use
    dims.ep_mesh                           # the expert mesh (pp, dp_replicate, dp_mod_ep, ep, tp)
    dims.dp_coords()                       # (dp_rank, dp_size): this rank's slice of the batch

`ParallelConfig` (scalelab.parallel.config) is the one user-facing description of a layout;
ParallelDims is built from it once per process and owns the DeviceMesh and every sub-mesh cut from
it, so code that needs a process group asks the dims for the named mesh instead of carrying a
`(dims, mesh)` pair around. A world of 1 has no mesh (`dims.mesh is None`).

Vocabulary (torchtitan's): a mesh *axis* (pp, dp_replicate, dp_shard, cp, tp) vs a tensor *dim*.
The mesh is laid out outer→inner as pp × dp_replicate × dp_shard × cp × tp, so tensor-parallel
ranks are adjacent (fastest interconnect) and pipeline stages are the outermost split.
Every check raises `ConfigError("parallel.<key>", problem, fix)` before any process is started.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from scalelab.errors import ConfigError
from scalelab.parallel.config import AC_MODES

AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")  # outer → inner
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")
BACKENDS = ("auto", "gloo", "nccl")
MIXED_PRECISION = ("auto", "fp32", "bf16")
GRAD_COMPRESSION = ("none", "bf16", "powersgd")  # scalelab.parallel.compression


def stages_per_rank(schedule: str) -> int:
    """Model chunks held by one pipeline rank: 2 for interleaved / V-shaped schedules, else 1."""
    return 2 if schedule in ("interleaved-1f1b", "zero-bubble") else 1


@dataclass(kw_only=True, slots=True)
class ParallelDims:
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    mesh: DeviceMesh | None = field(default=None, repr=False, compare=False)  # set by build_mesh
    _ep_mesh: DeviceMesh | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_config(
        cls,
        pcfg,
        world_size: int | None = None,
        model=None,
        seq_len: int | None = None,
        global_batch_sequences: int | None = None,
        micro_batch_sequences: int = 0,
    ) -> ParallelDims:
        """Validated dims for a `ParallelConfig` (and optionally the world, model and batch)."""
        dims = cls(
            dp_replicate=pcfg.dp_replicate, dp_shard=pcfg.dp_shard, tp=pcfg.tp, pp=pcfg.pp, cp=pcfg.cp, ep=pcfg.ep
        )
        dims.validate(world_size)
        validate_options(pcfg)
        if model is not None:
            dims.validate_model(model, pcfg, seq_len=seq_len)
        if global_batch_sequences is not None:
            dims.validate_batch(global_batch_sequences, pcfg, micro_batch_sequences)
        dims.check_supported(model)
        return dims

    # --- arithmetic ---------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp * self.pp * self.cp

    @property
    def dp_size(self) -> int:
        """Data-parallel degree: how many different slices of the global batch are processed."""
        return self.dp_replicate * self.dp_shard

    @property
    def fsdp_size(self) -> int:
        """Ranks a parameter is sharded over by FSDP (dp_shard × cp, as in torchtitan)."""
        return self.dp_shard * self.cp

    def validate(self, world_size: int | None = None) -> None:
        for key in ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"parallel.{key}", f"{value!r} must be an integer >= 1", "use 1 to disable it")
        if world_size is not None and self.world_size != world_size:
            raise ConfigError(
                "parallel",
                f"dp_replicate*dp_shard*tp*pp*cp = {self.dp_replicate}*{self.dp_shard}*{self.tp}*"
                f"{self.pp}*{self.cp} = {self.world_size} but the world has {world_size} processes",
                f"make the product equal {world_size} (e.g. raise dp_shard) or start {self.world_size} processes",
            )
        if self.ep > 1 and (self.dp_shard * self.cp) % self.ep:
            raise ConfigError(
                "parallel.ep",
                f"{self.ep} does not divide dp_shard*cp = {self.dp_shard * self.cp}",
                "pick ep dividing dp_shard*cp",
            )

    def validate_model(self, model, pcfg=None, seq_len: int | None = None) -> None:
        """Shape rules: heads, kv-heads, vocab, ffn (and seq under SP) by tp; layers by pp stages; seq by cp."""
        tp = self.tp
        if tp > 1:
            for key in ("num_heads", "num_kv_heads"):
                n = getattr(model, key)
                if n % tp:
                    raise ConfigError(
                        "parallel.tp",
                        f"{tp} does not divide model.{key}={n}",
                        f"pick tp from the divisors of {key} ({_divisors(n)})",
                    )
            for key in ("d_ff", "vocab_size"):
                n = getattr(model, key)
                if n % tp:
                    raise ConfigError(
                        "parallel.tp",
                        f"{tp} does not divide model.{key}={n}",
                        f"pick tp from the divisors of {key} ({_divisors(n)[:8]}...) or pad model.{key}",
                    )
            if getattr(model, "family", "dense") == "moe" and model.expert_d_ff % tp:
                raise ConfigError(
                    "parallel.tp",
                    f"{tp} does not divide the experts' hidden width {model.expert_d_ff} (model.moe_d_ff)",
                    f"pick tp from the divisors of {model.expert_d_ff} ({_divisors(model.expert_d_ff)[:8]}...)",
                )
            sp = pcfg is None or getattr(pcfg, "sequence_parallel", True)
            if sp and seq_len is not None and (seq_len // self.cp) % tp:  # SP splits a cp rank's rows
                raise ConfigError(
                    "parallel.tp",
                    f"sequence parallel splits data.seq_len={seq_len}"
                    + (f" / cp={self.cp}" if self.cp > 1 else "")
                    + f" over tp={tp} unevenly",
                    "choose seq_len as a multiple of tp, or set parallel.sequence_parallel=false",
                )
            if getattr(model, "tied_embeddings", False):
                raise ConfigError(
                    "parallel.tp",
                    "tensor parallel with tied_embeddings is not supported (the embedding is "
                    "row-sharded, the output column-sharded)",
                    "set model.tied_embeddings=false or tp=1",
                )
        if self.pp > 1:
            schedule = getattr(pcfg, "pp_schedule", "1f1b") if pcfg is not None else "1f1b"
            num_stages = self.pp * stages_per_rank(schedule)
            if num_stages > model.num_layers:
                raise ConfigError(
                    "parallel.pp",
                    f"{num_stages} pipeline stages (pp={self.pp} × {stages_per_rank(schedule)} per "
                    f"rank for {schedule}) exceed model.num_layers={model.num_layers}",
                    f"use pp <= {model.num_layers // stages_per_rank(schedule)} or more layers",
                )
            if getattr(model, "tied_embeddings", False):
                raise ConfigError(
                    "parallel.pp",
                    "pipeline parallel with tied_embeddings is not supported (first and last "
                    "stage would share a matrix)",
                    "set model.tied_embeddings=false or pp=1",
                )
        if self.cp > 1 and seq_len is not None and seq_len % (2 * self.cp):
            raise ConfigError(
                "parallel.cp",
                f"data.seq_len={seq_len} is not divisible by 2*cp={2 * self.cp}",
                "choose seq_len as a multiple of 2*cp (load-balanced causal chunks)",
            )

    def validate_batch(self, global_batch_sequences: int, pcfg, micro_batch_sequences: int = 0) -> None:
        """The global batch splits over dp ranks, and each rank's share over pipeline micro-batches."""
        if global_batch_sequences % self.dp_size:
            raise ConfigError(
                "train.global_batch_tokens",
                f"{global_batch_sequences} sequences do not split over {self.dp_size} data-parallel ranks",
                "make the sequence count a multiple of dp_replicate*dp_shard",
            )
        if self.pp > 1:
            local = global_batch_sequences // self.dp_size
            if micro_batch_sequences:
                local = micro_batch_sequences  # each loop micro-batch is one pipeline step
            micro = num_microbatches(pcfg, self.pp)
            if local % micro:
                raise ConfigError(
                    "parallel.pp_microbatches",
                    f"{micro} pipeline micro-batches do not divide the {local} "
                    "sequences of one step on a data-parallel rank",
                    "pick pp_microbatches dividing them (or change train.global_batch_tokens)",
                )

    def check_supported(self, model=None) -> None:
        """Combinations the arithmetic allows but parallelize() does not build (every cp one is built)."""
        if self.ep == 1:
            return
        if model is not None and getattr(model, "family", None) != "moe":
            raise ConfigError(
                "parallel.ep",
                "expert parallel needs an MoE model; the dense family has no experts",
                "set parallel.ep=1 or model.family=moe",
            )
        if model is not None and model.num_experts % self.ep:
            raise ConfigError(
                "parallel.ep",
                f"{self.ep} does not divide model.num_experts={model.num_experts}",
                "pick ep dividing num_experts",
            )

    # --- mesh ---------------------------------------------------------------------------------
    def mesh_shape(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The named axes with size > 1 (outer → inner); a 1-process layout gets ('dp_shard',)."""
        sizes = {
            "pp": self.pp,
            "dp_replicate": self.dp_replicate,
            "dp_shard": self.dp_shard,
            "cp": self.cp,
            "tp": self.tp,
        }
        # DDP is HSDP with a dp_shard axis of size 1, so dp_shard is kept whenever dp_replicate is.
        keep = {a for a in AXES if sizes[a] > 1} | ({"dp_shard"} if self.dp_replicate > 1 else set())
        names = tuple(a for a in AXES if a in keep) or ("dp_shard",)
        return names, tuple(sizes[a] for a in names)

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """Build (once) the DeviceMesh over the default process group, with flattened 'dp' / 'dp_shard_cp' views."""
        if self.mesh is None:
            names, shape = self.mesh_shape()
            mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)
            dp_axes = tuple(a for a in ("dp_replicate", "dp_shard") if a in names)
            if len(dp_axes) > 1:
                mesh[dp_axes]._flatten("dp")  # the data loader's split and the loss average
            shard_axes = tuple(a for a in ("dp_shard", "cp") if a in names)
            if len(shard_axes) > 1:
                mesh[shard_axes]._flatten("dp_shard_cp")
            self.mesh = mesh
        return self.mesh

    def has(self, axis: str) -> bool:
        return getattr(self, axis) > 1

    def mesh_for(self, axis: str) -> DeviceMesh:
        """The 1-D sub-mesh of a named axis (pp, dp_replicate, dp_shard, cp, tp, dp, dp_shard_cp)."""
        if self.mesh is None:
            raise RuntimeError("ParallelDims.build_mesh has not been called (a world of 1 has no mesh)")
        return self.mesh[axis]

    def group(self, axis: str):
        """The process group of a named axis, or None when the axis has size 1 (nothing to reduce)."""
        return self.mesh_for(axis).get_group() if self.has(axis) else None

    @property
    def fsdp_mesh(self) -> DeviceMesh | None:
        """The mesh FSDP2 shards (and replicates) the dense parameters over, or None (no data parallel).

        dp_shard, or dp_shard × cp flattened when cp > 1 (the cp ranks hold the same parameters and
        see different tokens, so their gradients are averaged like data parallel's); with
        dp_replicate > 1 the 2-D HSDP mesh (dp_replicate, that shard axis), which with a shard size
        of 1 is plain DDP.
        """
        if self.mesh is None:
            return None
        names = self.mesh.mesh_dim_names or ()
        shard = "dp_shard_cp" if self.cp > 1 and "dp_shard" in names else ("cp" if self.cp > 1 else "dp_shard")
        if self.dp_replicate > 1:
            return self.mesh[("dp_replicate", shard)]
        if self.dp_shard > 1 or self.cp > 1:
            return self.mesh[shard]
        return None

    @property
    def ep_mesh(self) -> DeviceMesh:
        """The expert mesh: axes (pp, dp_replicate, dp_mod_ep, ep, tp) over the same ranks (built once).

        dp_shard × cp (flattened, cp inner) is split into (dp_mod_ep, ep) with ep the inner factor,
        so an ep group is made of adjacent shard ranks; axes of the mesh that are absent stay
        absent, and ep and dp_mod_ep are always present (size 1 allowed). Every (pp, dp_replicate,
        tp) coordinate gets its own ep and dp_mod_ep groups; tp stays innermost, so (ep, tp) is a
        valid 2-D sub-mesh.
        """
        if self._ep_mesh is None:
            mesh = self.mesh_for("dp_shard") if self.mesh is None else self.mesh  # raises without a mesh
            names = list(mesh.mesh_dim_names or ())
            shard_axes = [n for n in ("dp_shard", "cp") if n in names]
            front = [n for n in ("pp", "dp_replicate") if n in names]
            back = [n for n in ("tp",) if n in names]
            ranks = mesh.mesh.permute(*[names.index(n) for n in front + shard_axes + back])
            shard = self.dp_shard * self.cp
            lead = [mesh[n].size() for n in front]
            tail = [mesh[n].size() for n in back]
            ranks = ranks.reshape(*lead, shard // self.ep, self.ep, *tail)
            self._ep_mesh = DeviceMesh(mesh.device_type, ranks, mesh_dim_names=(*front, "dp_mod_ep", "ep", *back))
        return self._ep_mesh

    def dp_coords(self) -> tuple[int, int]:
        """(dp_rank, dp_size) of this process: which slice of the global batch it consumes."""
        if self.mesh is None:
            return 0, 1
        names = self.mesh.mesh_dim_names or ()
        rank, size = 0, 1
        for axis in ("dp_replicate", "dp_shard"):  # row-major over the two dp axes
            if axis in names:
                rank = rank * self.mesh[axis].size() + self.mesh[axis].get_local_rank()
                size *= self.mesh[axis].size()
        return rank, size

    def coords(self) -> dict[str, int]:
        """This rank's coordinate on every named axis of the mesh ({} without a mesh)."""
        if self.mesh is None:
            return {}
        return {n: self.mesh[n].get_local_rank() for n in self.mesh.mesh_dim_names or ()}


def num_microbatches(pcfg, pp: int) -> int:
    """Pipeline micro-batches per step: the config's value, or one per stage (pp × chunks per rank).

    One per stage is the fewest that fills the pipeline; more shrink the bubble further but need
    a batch divisible by them.
    """
    if pcfg.pp_microbatches:
        return pcfg.pp_microbatches
    return pp * stages_per_rank(pcfg.pp_schedule)


def validate_options(pcfg) -> None:
    """The non-numeric parallel options (schedule, AC mode, backend, precision)."""
    if pcfg.pp_schedule not in PP_SCHEDULES:
        raise ConfigError(
            "parallel.pp_schedule", f"{pcfg.pp_schedule!r} unknown", f"use one of {', '.join(PP_SCHEDULES)}"
        )
    if pcfg.activation_checkpoint not in AC_MODES:
        raise ConfigError(
            "parallel.activation_checkpoint",
            f"{pcfg.activation_checkpoint!r} unknown",
            f"use one of {', '.join(AC_MODES)}",
        )
    if getattr(pcfg, "cp_variant", "allgather") not in ("allgather", "ring"):
        raise ConfigError("parallel.cp_variant", f"{pcfg.cp_variant!r} unknown", "use allgather or ring")
    if pcfg.backend not in BACKENDS:
        raise ConfigError("parallel.backend", f"{pcfg.backend!r} unknown", f"use one of {', '.join(BACKENDS)}")
    if pcfg.mixed_precision not in MIXED_PRECISION:
        raise ConfigError(
            "parallel.mixed_precision", f"{pcfg.mixed_precision!r} unknown", f"use one of {', '.join(MIXED_PRECISION)}"
        )
    if pcfg.pp > 1 and pcfg.pp_schedule == "zero-bubble" and pcfg.dp_shard * pcfg.cp > 1:
        if pcfg.fsdp_reshard_after_forward:
            # Under ZB-V with ZeRO-3 the last stage's parameters end every step after the first
            # without gradients (`scalelab parity` fsdp2xpp2-zb); ZeRO-2 (fsdp2-zero2xpp2-zb) matches.
            raise ConfigError(
                "parallel.pp_schedule",
                "zero-bubble with FSDP resharding after forward (ZeRO-3) gives wrong gradients",
                "set parallel.fsdp_reshard_after_forward=false (ZeRO-2), or use 1f1b or interleaved-1f1b",
            )
    _validate_compression(pcfg)
    if pcfg.pp_microbatches < 0:
        raise ConfigError("parallel.pp_microbatches", f"{pcfg.pp_microbatches} must be >= 0", "use 0 for one per stage")
    if pcfg.pp > 1 and pcfg.pp_microbatches and pcfg.pp_schedule != "gpipe":
        stages = pcfg.pp * stages_per_rank(pcfg.pp_schedule)
        if pcfg.pp_schedule in ("interleaved-1f1b",) and pcfg.pp_microbatches % pcfg.pp:
            raise ConfigError(
                "parallel.pp_microbatches",
                f"{pcfg.pp_microbatches} is not a multiple of pp={pcfg.pp}",
                "interleaved 1F1B needs micro-batches in multiples of pp",
            )
        if pcfg.pp_microbatches < pcfg.pp:
            raise ConfigError(
                "parallel.pp_microbatches",
                f"{pcfg.pp_microbatches} < pp={pcfg.pp} ({stages} stages)",
                f"use at least {pcfg.pp} micro-batches (or 0 for the default)",
            )


def _validate_compression(pcfg) -> None:
    """parallel.grad_compression / powersgd_rank (scalelab.parallel.compression): what a method
    compresses must exist in the layout."""
    method = getattr(pcfg, "grad_compression", "none")
    if method not in GRAD_COMPRESSION:
        raise ConfigError(
            "parallel.grad_compression", f"{method!r} unknown", f"use one of {', '.join(GRAD_COMPRESSION)}"
        )
    rank = getattr(pcfg, "powersgd_rank", 1)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ConfigError("parallel.powersgd_rank", f"{rank!r} must be an integer >= 1", "use 1, 2 or 4")
    if method == "bf16" and pcfg.dp_replicate * pcfg.dp_shard * pcfg.cp == 1:
        raise ConfigError(
            "parallel.grad_compression",
            "bf16 compresses the data-parallel gradient reduction but this layout has none",
            "set grad_compression=none, or dp_replicate/dp_shard > 1",
        )
    if method == "powersgd" and pcfg.dp_replicate == 1:
        raise ConfigError(
            "parallel.grad_compression",
            "powersgd compresses the replicate (DDP/HSDP) all-reduce but dp_replicate=1",
            "set parallel.dp_replicate > 1, or grad_compression=bf16 for FSDP's reduce-scatter",
        )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
