"""`scalelab sweep plan|launch|resume|status|export|next`: sweeps of runs on Ray, the store, the next round.

    scalelab sweep plan examples/sweeps/isoflop_tiny.yaml            # dry run: table and total cost
    scalelab sweep plan SPEC --reference DIR --audit DIR --replication  # IsoFLOP: centring, shape, seeds' price
    scalelab sweep launch SPEC --out results/iso [--address ADDR] [--max-concurrent K] [--rounds R]
    scalelab sweep launch SPEC --out /shared/iso --address http://HEAD:8265 --detach   # driver as a Ray Job
    scalelab sweep launch ladder.yaml --out results/lad [--force]    # with `transfer:`: the LR gate first
    scalelab sweep launch study.yaml --out results/st --rounds 4 --decide   # a study, to its decisive measurement
    scalelab sweep resume results/iso                                # after the driver died
    scalelab sweep status results/iso [--json]
    scalelab sweep export results/iso --csv runs.csv
    scalelab sweep next results/iso --target-flops 1e13 [--budget-flops 3e12]
    scalelab sweep next results/iso --holdout 3,10,30 [--holdout-sizes 2]   # far runs, all predicted by one fit
    scalelab sweep next results/study [--decide] [--seeds 2]          # a study: narrow m(C), or decide
    scalelab sweep study results/study [--estimator separate] [--json]   # a study's arms, gaps, decision accuracy
    scalelab sweep study s3://bucket/studies/study-arch              # a study on object storage (read-only)
    scalelab sweep ledger results/iso [--json]                        # every fit and prediction, scored
    scalelab sweep audit results/audit [--design SPEC] [--json]       # a recipe audit: best LR(N, D), wd, beta2
    scalelab sweep eval results/iso --tasks bundled:stdlib_completion@100  # add a task to finished runs
    scalelab sweep wandb results/iso [--mode offline|online] [--force]   # log a finished store to W&B

Specs are validated before Ray starts; a bad spec exits 2 with one line naming the key. A spec with
`transfer: {check: true, ...}` (scalelab.sweeps.recipes.transfer) gets its LR-transfer check planned beside
it, and launched first: launch exits 2 with the check's table when the best LR drifts (--force
launches anyway); the ladder's runs take the transferred LR. A spec with `recipe_gate: {audit: DIR}`
(scalelab.sweeps.recipes.recipe_gate) is checked against a recipe audit (a sweep with the `audit:` generator,
analysed by `sweep audit`): `plan` shows what each run's LR and weight decay cost, and `launch`
exits 2 naming the runs over the allowed cost (--force launches anyway). `launch --rounds R` is the closed loop
(scalelab.sweeps.closed_loop.rounds.run_rounds): the spec, then R - 1 rounds of `sweep next` launched in turn.
A spec with `study:` arms (scalelab.sweeps.studies.study_spec) is a study: `plan` shows its cost per arm,
`next` fits every arm and proposes the study's next round (scalelab.sweeps.studies.study_propose), and
`study` prints what it found (scalelab.sweeps.studies.study_fit, scalelab.analysis.decision_accuracy).

W&B (docs/wandb.md): runs log live under the sweep's group with their design as tags; `sweep next`
(and each round of `--rounds`) logs its fit, gates, proposals and ledger as a fit run with the
round's plots; `sweep wandb` logs a store that trained without W&B.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from scalelab.errors import UsageError

SWEEP_DIR_HELP = "a sweep directory (the --out of `sweep launch`)"
STUDIES_DOC = "docs/studies.md"  # where studies are described, named by the errors of the study commands


def add_parser(sub) -> None:
    p = sub.add_parser(
        "sweep",
        help="plan, launch, resume and inspect sweeps; propose the next round",
        description=__doc__,
    )
    s = p.add_subparsers(dest="sweep_command", metavar="SUBCOMMAND")
    s.required = True
    for add in (  # in the order `scalelab sweep --help` lists them
        _add_plan,
        _add_launch,
        _add_resume,
        _add_status,
        _add_export,
        _add_next,
        _add_study,
        _add_eval,
        _add_ledger,
        _add_audit,
        _add_wandb,
    ):
        add(s)


def _add_plan(s) -> None:
    q = s.add_parser("plan", help="expand and validate a spec; print runs and cost (nothing starts)")
    q.add_argument("spec", help="a sweep spec (YAML; examples/sweeps/)")
    q.add_argument("--no-measure", action="store_true", help="skip the throughput measurement (no time estimates)")
    q.add_argument(
        "--reference",
        default=None,
        metavar="DIR",
        help="an IsoFLOP design: the N*(C) to place its sizes against (a sweep with fits, a recipe audit, a fit "
        "file; default: the design's center: {fit: ...})",
    )
    q.add_argument("--audit", default=None, metavar="DIR", help="a recipe audit whose shape cells price the shapes")
    q.add_argument("--replication", action="store_true", help="price seeds per point against more sizes per budget")
    q.add_argument(
        "--noise", type=float, default=None, help="run-to-run log-sd for --replication (default: fit.noise_floor)"
    )
    q.add_argument("--json", action="store_true", help="print the runs and totals as JSON")
    q.set_defaults(func=run_plan)


def _add_launch(s) -> None:
    q = s.add_parser("launch", help="run a spec on Ray into a sweep directory (finished runs are skipped)")
    q.add_argument("spec", help="a sweep spec (YAML; examples/sweeps/)")
    q.add_argument(
        "--out",
        required=True,
        help="the sweep directory (local, shared POSIX or s3://); its parent is the store root shared by sweeps",
    )
    _ray_args(q)
    q.add_argument("--rounds", type=int, default=1, help="alternate launch and `sweep next` this many times")
    q.add_argument("--target-flops", type=float, default=None, help="C* for --rounds > 1 (default: the spec's fit)")
    q.add_argument(
        "--budget-flops",
        type=float,
        default=None,
        help="FLOPs per proposed round (--rounds > 1; default: what `sweep next` proposes)",
    )
    q.add_argument(
        "--force", action="store_true", help="launch even when the LR-transfer gate or the recipe gate refuses"
    )
    q.add_argument(
        "--decide",
        action="store_true",
        help="a study with --rounds: each round remedies failed gates or is the matched decisive measurement; "
        "stop after that one (a round left unfinished is launched again)",
    )
    q.add_argument(
        "--inject-fault",
        action="append",
        default=[],
        metavar="RUN_ID:STEP",
        help="testing: make that run raise once at STEP (it is retried and resumes)",
    )
    q.add_argument(
        "--detach",
        action="store_true",
        help="submit the driver as a Ray Job (--address http://HEAD:8265, the dashboard) and return; "
        "--out must be a path every node sees, or s3://",
    )
    q.add_argument(
        "--spec-sha256",
        default=None,
        help="set by `sweep launch --detach` for its driver: the sha256 of the submitted spec, which the driver's "
        "copy in the store must match (default: no check)",
    )
    q.set_defaults(func=run_launch)


def _add_resume(s) -> None:
    q = s.add_parser("resume", help="finish a sweep whose driver died: done runs stay done, partial ones resume")
    q.add_argument("sweep_dir", help=SWEEP_DIR_HELP)
    _ray_args(q)
    _spec_arg(q)
    q.set_defaults(func=run_resume)


def _add_status(s) -> None:
    q = s.add_parser("status", help="runs by state with progress, losses and failures")
    q.add_argument("sweep_dir", help=SWEEP_DIR_HELP)
    q.add_argument("--json", action="store_true", help="print the status as JSON")
    q.set_defaults(func=run_status)


def _add_export(s) -> None:
    q = s.add_parser("export", help="write the run table for the fitter (done runs)")
    q.add_argument("sweep_dir", help=SWEEP_DIR_HELP)
    q.add_argument("--csv", required=True, metavar="PATH", help="output file (.csv, or .parquet)")
    q.add_argument("--all", action="store_true", help="include runs that are not done")
    q.set_defaults(func=run_export)


def _add_next(s) -> None:
    q = s.add_parser(
        "next",
        help="fit the store and write the next round's spec (rounds/round_K.yaml)",
        description="Fit the sweep's done runs (its spec's fit: section), score the ledger's earlier predictions, "
        "check the identification gates and propose the next round: the compute-optimal run at the next budget "
        "when every gate passes, else the runs that would pass the failed gates. Written into the sweep: "
        "rounds/round_K.yaml (the round's spec: `sweep launch` it into the same directory), fits/round_K.json "
        f"(the fit) and the ledger's predictions. A study (a spec with study: arms, {STUDIES_DOC}): each arm "
        "fitted, the round that narrows the multiplier m(C) at the target, or the decisive pair.",
    )
    q.add_argument("sweep_dir", help=SWEEP_DIR_HELP)
    q.add_argument(
        "--target-flops",
        type=float,
        default=None,
        help="C*: where the loss prediction should be tight (default: the spec's fit.target_flops; one of the two "
        "is needed)",
    )
    q.add_argument(
        "--budget-flops",
        type=float,
        default=None,
        help="FLOPs the next round may spend (default: 2x the next budget, which is --step x the largest done)",
    )
    q.add_argument("--step", type=float, default=3.0, help="next budget = step x the largest budget done")
    q.add_argument("--replicates", type=int, default=None, help="bootstrap replicates (default: the spec's fit)")
    q.add_argument(
        "--decide",
        action="store_true",
        help="a study: propose the matched decisive measurement at the target now, even while the arms are "
        "not told apart",
    )
    q.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="train the compute-optimal run with this many seeds (each one scored); a study: seeds per size of "
        "the decisive measurement (default: its study.decisive.seeds)",
    )
    q.add_argument(
        "--holdout",
        default=None,
        metavar="M1,M2,...",
        help="a holdout round instead: runs at these multiples of the largest budget (e.g. 3,10,30), all "
        "predicted by this fit whatever its gates say, to score how far it extrapolates",
    )
    q.add_argument("--holdout-sizes", type=int, default=1, help="runs per multiple, spread around N* (--holdout)")
    q.add_argument("--holdout-spread", type=float, default=1.5, help="largest over smallest size per multiple")
    _estimator_arg(q)
    q.add_argument("--json", action="store_true", help="print the proposal as JSON")
    q.set_defaults(func=run_next)


def _add_study(s) -> None:
    q = s.add_parser(
        "study",
        help="a study: each arm's fit, m(C), the gap at the target, ledger, decision accuracy",
        description="A study is a sweep whose spec has study: arms (config overrides crossed with one IsoFLOP "
        f"design; {STUDIES_DOC}). Print each arm's fit, the compute multiplier m(C) of each arm over the "
        "baseline with its interval at every budget and at the target, the predicted loss gap there, the "
        "ledger of predicted against measured gaps, and the decision accuracy of smaller budgets.",
    )
    q.add_argument("sweep_dir", help="a study's sweep directory (the --out of `sweep launch STUDY_SPEC`)")
    q.add_argument("--replicates", type=int, default=None, help="bootstrap replicates (default: the spec's fit)")
    q.add_argument("--no-decisions", action="store_true", help="skip decision accuracy (its refits take a while)")
    _estimator_arg(q)
    q.add_argument("--json", action="store_true", help="print the fit, ledger and decisions as JSON")
    q.set_defaults(func=run_study)


def _estimator_arg(q) -> None:
    q.add_argument(
        "--estimator",
        choices=("paired", "separate"),
        default=None,
        help="a study: the gap the verdict rests on: paired (the arms' matched design points) or separate (each "
        "arm's own law); default: the spec's study.estimator",
    )


def _add_eval(s) -> None:
    q = s.add_parser("eval", help="evaluate every checkpoint of the finished runs on tasks, as Ray tasks")
    q.add_argument("sweep_dir", help=SWEEP_DIR_HELP)
    q.add_argument("--tasks", nargs="*", default=[], help="bundled:NAME[@N] | olmes:TASK/VARIANT | PATH.jsonl")
    q.add_argument("--limit", type=int, default=None, help="examples per task (default: all)")
    q.add_argument("--val", action="store_true", help="also recompute held-out loss/bpb")
    q.add_argument("--final-only", action="store_true", help="only each run's newest checkpoint")
    q.add_argument("--batch-sequences", type=int, default=16, help="sequences per forward pass")
    q.add_argument("--address", default=None, help="an existing Ray cluster (default: start a local one)")
    q.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    _spec_arg(q)
    q.set_defaults(func=run_eval)


def _add_ledger(s) -> None:
    q = s.add_parser("ledger", help="every fit the loop made and its predictions against the measured runs")
    q.add_argument("sweep_dir", help=SWEEP_DIR_HELP)
    q.add_argument("--json", action="store_true", help="print the ledger as JSON")
    q.set_defaults(func=run_ledger)


def _add_audit(s) -> None:
    q = s.add_parser(
        "audit", help="a recipe audit's store: the best LR by size and horizon, LR(N, D), weight decay, beta2, shape"
    )
    q.add_argument("sweep_dir", help="the store of a spec with the audit: generator (trained by `sweep launch`)")
    q.add_argument("--design", default=None, metavar="SPEC", help="also the cost of each run of this spec's design")
    q.add_argument("--replicates", type=int, default=400, help="bootstrap replicates of every interval")
    q.add_argument("--json", action="store_true", help="print the audit's tables as JSON")
    q.set_defaults(func=run_audit)


def _add_wandb(s) -> None:
    q = s.add_parser("wandb", help="log a sweep's runs and rounds to W&B (those not logged while they ran)")
    q.add_argument("sweep_dir", help=SWEEP_DIR_HELP)
    q.add_argument(
        "--mode",
        choices=("offline", "online"),
        default=None,
        help="default: WANDB_MODE, else the spec's logging.wandb, else offline (`wandb sync` afterwards)",
    )
    q.add_argument("--force", action="store_true", help="log runs and rounds again that already have W&B records")
    q.set_defaults(func=run_wandb)


def _spec_arg(q) -> None:
    q.add_argument(
        "--spec",
        default=None,
        help="the spec you launched: the local paths it names (data, tokenizer, init_from) are the only "
        "ones the store's records may make workers read",
    )


def _given(spec: str | None) -> frozenset[str]:
    """The local paths the launcher's own spec names (scalelab.train.local_paths): none without one."""
    if spec is None:
        return frozenset()
    from scalelab.sweeps.specs.spec import load_sweep
    from scalelab.train.local_paths import given_paths

    return given_paths(r.config for r in load_sweep(spec).runs)


def _ray_args(q) -> None:
    q.add_argument("--address", default=None, help="an existing Ray cluster (default: start a local one)")
    q.add_argument("--max-concurrent", type=int, default=None, help="runs at a time (default: as resources allow)")
    q.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    q.add_argument(
        "--pass-env",
        action="append",
        default=[],
        metavar="NAME",
        help="a credential (WANDB_API_KEY, HF_TOKEN, ...) the runs may read: forwarded to the cluster's "
        "workers (never in clear text to another machine); others are never sent (repeatable)",
    )


def run_plan(args) -> int:
    from scalelab.sweeps.execution.execute import check_runnable
    from scalelab.sweeps.preview.dry_run import dry_run_table, format_dry_run
    from scalelab.sweeps.recipes.recipe_gate import check_sweep, format_recipe_gate
    from scalelab.sweeps.recipes.transfer import plan_transfer
    from scalelab.sweeps.specs.spec import load_sweep

    sweep = load_sweep(args.spec)
    check = plan_transfer(sweep.raw, sweep)
    check_runnable([r.to_dict() for r in sweep.runs])
    gate = check_sweep(sweep)
    rows, totals = dry_run_table(sweep, measure=not args.no_measure)
    check_rows = check_totals = None
    if check is not None:
        check_runnable([r.to_dict() for r in check.sweep.runs])
        check_rows, check_totals = dry_run_table(check.sweep, measure=not args.no_measure)
        check_totals["warnings"] += check.warnings
    if args.json:
        out = {"runs": rows, "totals": totals}
        if check is not None:
            out["transfer"] = {"runs": check_rows, "totals": check_totals}
        if gate is not None:
            out["recipe_gate"] = {"ok": gate.ok, "over": [r.run_id for r in gate.over],
                                  "cost": {r.run_id: r.cost for r in gate.rows}}  # fmt: skip
        print(json.dumps(out, indent=2))
        return 0
    slots = sweep.execution.max_concurrent or None
    if check is not None:
        s = check.spec
        print(
            f"LR-transfer check ({check.parametrization}): {len(s.lrs)} LRs x widths {s.widths} x depths {s.depths} "
            f"at {s.tokens_per_param:g} tokens/param, tolerance {s.tolerance} grid step(s); runs first"
        )
        print(format_dry_run(check_rows, check_totals, slots=slots))
        print("ladder (its LR: the check's best LR at the base size, set at launch; shown: the spec's)")
    print(f"sweep {sweep.name}: generator {sweep.generator}")
    print(format_dry_run(rows, totals, slots=slots))
    if gate is not None:
        print(format_recipe_gate(gate))
    if sweep.generator == "isoflop":
        print(_design_text(args, sweep, totals))
    return 0


def _design_text(args, sweep, totals) -> str:
    """`sweep plan`'s design report of an IsoFLOP spec (scalelab.sweeps.preview.design_report)."""
    from scalelab.sweeps.preview.design_report import design_report, format_design_report
    from scalelab.sweeps.recipes.recipe_audit import load_audit
    from scalelab.sweeps.recipes.recipe_gate import parse_gate
    from scalelab.sweeps.specs.isoflop_grid import read_frontier

    if args.noise is not None and not 0 < args.noise < 0.5:
        raise UsageError(f"--noise {args.noise}: a log-sd in (0, 0.5), e.g. 0.0056")
    center = (sweep.raw["isoflop"].get("center") or {}) if isinstance(sweep.raw["isoflop"], dict) else {}
    source = args.reference or center.get("fit")
    reference = read_frontier(source, "--reference") if source else None
    gate = parse_gate(sweep.raw.get("recipe_gate"))
    audit_dir = args.audit or (gate.audit if gate else None)
    audit = load_audit(audit_dir) if audit_dir else None
    per_flop = totals["serial_s"] / totals["cost_flops"] if totals.get("serial_s") else None
    report = design_report(sweep, reference=reference, audit=audit, noise=args.noise or sweep.fit.noise_floor or None,
                           replication=args.replication, seconds_per_flop=per_flop)  # fmt: skip
    return format_design_report(report)


def _faults(items: list[str]) -> dict[str, int]:
    out = {}
    for item in items:
        run_id, _, step = item.partition(":")
        if not run_id or not step.isdigit():
            raise UsageError(f"--inject-fault {item!r}: expected RUN_ID:STEP")
        out[run_id] = int(step)
    return out


def run_launch(args) -> int:
    from scalelab.store import files, objects
    from scalelab.sweeps.closed_loop.rounds import LaunchOptions, check_rounds, run_rounds
    from scalelab.sweeps.specs.spec import load_sweep

    _check_spec_copy(args.spec, args.spec_sha256)
    sweep = load_sweep(args.spec)  # every run validated before Ray starts
    out = args.out if objects.is_url(args.out) else Path(args.out)
    check, target = check_rounds(sweep, out, rounds=args.rounds, target_flops=args.target_flops)
    if args.decide and sweep.study is None:
        raise UsageError(f"--decide: {args.spec} is not a study (it has no study: section)")
    faults = _faults(args.inject_fault)
    if args.detach:
        return _detach(args, sweep, check is None, out)
    print(f"sweep {sweep.name}: {len(sweep.runs)} runs -> {out}")

    fit_images = None
    if args.rounds > 1:  # the rounds' W&B fit runs draw their plots (matplotlib: only when there are rounds)
        from scalelab.analysis.wandb_images import fit_images

    def announce(i: int, proposal) -> None:
        print(f"round {i} of {args.rounds - 1}: {len(proposal.runs)} proposed run(s) from {proposal.spec_path}")

    result = run_rounds(
        sweep,
        out,
        spec_text=files.read_text(args.spec),  # a detached driver's spec copy may be an object
        spec_name=files.stem(args.spec),
        rounds=args.rounds,
        target_flops=target,
        budget_flops=args.budget_flops,
        force_transfer=args.force,
        force_recipe=args.force,
        decide=args.decide,
        until_passed=args.decide,
        reopen=args.decide,
        options=LaunchOptions(
            address=args.address,
            max_concurrent=args.max_concurrent,
            num_cpus=args.num_cpus,
            fault_steps=faults,
            pass_env=args.pass_env,
        ),
        before_launch=announce,
        fit_images=fit_images,
    )
    if result.transfer_refused:
        print(result.transfer.table, file=sys.stderr)
        print(
            f"scalelab sweep launch: error: transfer: the best LR drifts beyond {result.transfer.gate.tolerance} grid "
            "step(s) (or sits on the grid's edge); under sp set each size's LR from a fitted LR law (recipe.lr), "
            "use parametrization mup/completep, widen transfer.lrs, or pass --force",
            file=sys.stderr,
        )
    elif result.recipe_refused(args.force):
        from scalelab.sweeps.recipes.recipe_gate import format_recipe_gate

        print(format_recipe_gate(result.recipe_gate), file=sys.stderr)
        over = ", ".join(f"{r.run_id} ({r.cost:+.2%})" for r in result.recipe_gate.over)
        print(
            f"scalelab sweep launch: error: recipe_gate: run(s) {over} would lose more than "
            f"{result.recipe_gate.max_cost:.2%} of the loss to their LR and weight decay; set the recipe from the "
            "audit's recipe.yaml, raise recipe_gate.max_cost, or pass --force",
            file=sys.stderr,
        )
    return result.exit_code(args.force)


def _detach(args, sweep, pre_record: bool, out: str | Path) -> int:
    """Copy the spec into the sweep directory and submit `sweep launch` of it as a Ray Job.

    A spec without a transfer check is recorded in the store first, so `sweep status` shows its
    runs (pending) before the job's driver starts. On object storage the copy is an object of the
    sweep (`<out>/driver/<spec>`), which the job's driver reads from the bucket."""
    from scalelab import store
    from scalelab.store import files, objects
    from scalelab.store.atomic import atomic_write_bytes
    from scalelab.sweeps.execution.execute import check_object_store, check_runnable, save_execution
    from scalelab.sweeps.execution.ray_cluster import check_dashboard_address, check_pass_env, submit_driver

    check_dashboard_address(args.address)
    check_pass_env(args.address, args.pass_env, detach=True)  # before anything is written
    out = out if objects.is_url(out) else out.resolve()
    text = Path(args.spec).read_text()
    if pre_record:
        entries = [r.to_dict() for r in sweep.runs]
        check_runnable(entries)
        if objects.is_url(out):
            check_object_store(out, text, entries)
        store.init_sweep(out, text, Path(args.spec).stem, entries, sweep.name)
        save_execution(out, sweep.execution)
    elif objects.is_url(out):
        objects.check_sweep(out, "--out")
    spec_copy = files.join(out, "driver", Path(args.spec).name)
    atomic_write_bytes(spec_copy, text.encode())
    argv = ["sweep", "launch", str(spec_copy), "--out", str(out), "--address", "auto", "--rounds", str(args.rounds)]
    argv += ["--spec-sha256", hashlib.sha256(text.encode()).hexdigest()]  # the copy is the store's: checked
    for flag, value in (
        ("--max-concurrent", args.max_concurrent),
        ("--target-flops", args.target_flops),
        ("--budget-flops", args.budget_flops),
    ):
        if value is not None:
            argv += [flag, str(value)]
    argv += ["--force"] if args.force else []
    argv += ["--decide"] if args.decide else []
    for item in args.inject_fault:
        argv += ["--inject-fault", item]
    job_id = submit_driver(args.address, out, argv, pass_env=args.pass_env)
    print(f"sweep {sweep.name}: driver submitted as Ray job {job_id} on {args.address} -> {out}")
    print(f"  follow: ray job logs --address {args.address} --follow {job_id};  scalelab sweep status {out}")
    return 0


def _check_spec_copy(spec: str, sha256: str | None) -> None:
    """A detached driver's spec is a copy in the store, which others may write: it must be the one
    its launcher submitted (the digest came in the job's command line)."""
    from scalelab.store import files

    if sha256 is not None and hashlib.sha256((files.read_text(spec) or "").encode()).hexdigest() != sha256:
        raise UsageError(f"{spec}: not the spec that was submitted (its sha256 differs); launch it again")


def run_resume(args) -> int:
    from scalelab import store
    from scalelab.sweeps.execution.execute import resume

    result = resume(
        args.sweep_dir,
        address=args.address,
        max_concurrent=args.max_concurrent,
        num_cpus=args.num_cpus,
        pass_env=args.pass_env,
        given=_given(args.spec),
    )
    return 0 if all(s in store.TERMINAL for s in result["states"].values()) else 1  # stopped early: finished


def run_status(args) -> int:
    from scalelab.sweeps.execution.status import format_status, sweep_status

    info = sweep_status(args.sweep_dir)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        print(format_status(info))
    return 0


def run_eval(args) -> int:
    from scalelab.sweeps.execution.evaluate import evaluate_sweep

    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit {args.limit}: must be >= 1 (examples per task); omit it for all")
    if args.batch_sequences < 1:
        raise UsageError(f"--batch-sequences {args.batch_sequences}: must be >= 1, e.g. 16")
    result = evaluate_sweep(
        args.sweep_dir,
        args.tasks,
        limit=args.limit,
        with_val=args.val,
        final_only=args.final_only,
        batch_sequences=args.batch_sequences,
        address=args.address,
        num_cpus=args.num_cpus,
        given=_given(args.spec),
        log=lambda line: print(line, file=sys.stderr),
    )
    return 1 if result["failed"] else 0


def run_export(args) -> int:
    from scalelab.store import export_table

    n = export_table(args.sweep_dir, args.csv, done_only=not args.all)
    print(f"{n} run(s) -> {args.csv}", file=sys.stderr)
    return 0


def run_next(args) -> int:
    from scalelab.sweeps.closed_loop.proposal_text import format_proposal
    from scalelab.sweeps.closed_loop.propose import propose_next
    from scalelab.sweeps.studies.study_propose import is_study

    if is_study(args.sweep_dir):
        return _next_study(args)
    if args.decide:
        raise UsageError(
            f"--decide: {args.sweep_dir} is not a study (its sweep.yaml has no study: section; {STUDIES_DOC})"
        )
    holdout = None
    if args.holdout:
        from scalelab.sweeps.closed_loop.propose import Holdout

        try:
            multiples = tuple(float(m) for m in args.holdout.split(","))
        except ValueError:
            raise UsageError(f"--holdout {args.holdout!r}: multiples of the largest budget, e.g. 3,10,30") from None
        holdout = Holdout(multiples=multiples, sizes=args.holdout_sizes, spread=args.holdout_spread)
    if args.estimator:
        raise UsageError(
            f"--estimator: {args.sweep_dir} is not a study (its sweep.yaml has no study: section; {STUDIES_DOC})"
        )
    proposal = propose_next(
        args.sweep_dir,
        target_flops=args.target_flops,
        budget_flops=args.budget_flops,
        step=args.step,
        replicates=args.replicates,
        holdout=holdout,
        seeds=args.seeds or 1,
        log=(lambda m: None) if args.json else print,
    )
    _log_fit_runs(args.sweep_dir, (lambda m: print(m, file=sys.stderr)) if args.json else print)
    if args.json:
        print(json.dumps(proposal, indent=2, default=str))
    else:
        print(format_proposal(proposal))
    return 0


def _next_study(args) -> int:
    from scalelab.store import objects
    from scalelab.sweeps.studies.study_propose import format_study_proposal, propose_study_round

    if objects.is_url(args.sweep_dir):
        raise UsageError(f"{args.sweep_dir}: a study's rounds need a local or shared POSIX store (not s3:// yet)")
    if args.target_flops is not None:
        raise UsageError("--target-flops: a study's target is its study.target_flops; edit the spec's study section")
    proposal = propose_study_round(
        args.sweep_dir,
        budget_flops=args.budget_flops,
        step=args.step,
        decide=args.decide,
        replicates=args.replicates,
        seeds=args.seeds,
        estimator=args.estimator,
        log=(lambda m: print(m, file=sys.stderr)) if args.json else print,
    )
    print(json.dumps(proposal.to_dict(), indent=2, default=str) if args.json else format_study_proposal(proposal))
    return 0


def run_study(args) -> int:
    from scalelab import store
    from scalelab.analysis.decision_accuracy import decision_accuracy, format_decisions
    from scalelab.store.ledger import format_studies, read_ledger, score
    from scalelab.sweeps.closed_loop.propose import readable
    from scalelab.sweeps.studies.study_fit import fit_study
    from scalelab.sweeps.studies.study_propose import is_study
    from scalelab.sweeps.studies.study_text import format_study

    if not store.is_sweep_dir(args.sweep_dir):
        raise UsageError(f"{args.sweep_dir} is not a sweep directory (no sweep.yaml)")
    if not is_study(args.sweep_dir):
        raise UsageError(
            f"{args.sweep_dir} is not a study: its sweep.yaml has no study: section (arms over one design); "
            f"{STUDIES_DOC} describes them and their spec"
        )
    score(args.sweep_dir)  # on object storage too: the ledger is one object, updated by conditional puts
    local = readable(args.sweep_dir)  # an s3:// study is read through one local copy, made after scoring
    sf = fit_study(local, replicates=args.replicates, estimator=args.estimator)
    studies = read_ledger(args.sweep_dir)["studies"]
    table = None if args.no_decisions else decision_accuracy(local)
    if args.json:
        out = {"fit": sf.to_dict(), "ledger": studies, "decisions": table.to_dict() if table else None}
        print(json.dumps(out, indent=2, default=str))
        return 0
    print(format_study(sf))
    print(format_studies(studies) if studies else "ledger: no study prediction yet (`scalelab sweep next DIR`)")
    if table is not None:
        print(format_decisions(table))
    return 0


def _log_fit_runs(sweep_dir, log) -> None:
    """The rounds `sweep next` wrote, as W&B fit runs with their plots (off when W&B is disabled)."""
    from scalelab.analysis.wandb_images import fit_images
    from scalelab.sweeps.tracking.wandb_fit import log_rounds

    for wandb_id in log_rounds(sweep_dir, images=fit_images, log=log):
        log(f"W&B: fit run {wandb_id} (fit, gates, proposals, ledger, plots)")


def run_wandb(args) -> int:
    from scalelab.analysis.wandb_images import fit_images
    from scalelab.sweeps.tracking.wandb_export import export_sweep

    result = export_sweep(args.sweep_dir, mode=args.mode, images=fit_images, force=args.force)
    if result.mode == "disabled":
        print("W&B is disabled (WANDB_MODE=disabled); nothing logged", file=sys.stderr)
        return 0
    print(
        f"W&B ({result.mode}, group {result.group}): {len(result.runs)} run(s) and {len(result.fits)} fit run(s) "
        f"logged; {len(result.skipped)} run(s) already logged or not started"
    )
    if result.mode == "offline" and (result.runs or result.fits):
        d = Path(args.sweep_dir)
        print(f"  upload: wandb sync {d}/runs/*/wandb/offline-run-* {d}/wandb/offline-run-*")
    return 0


def run_audit(args) -> int:
    from scalelab.sweeps.recipes.recipe_audit import audit_store, format_audit, save_audit
    from scalelab.sweeps.recipes.recipe_gate import GateSpec, check_runs, format_recipe_gate, parse_gate
    from scalelab.sweeps.specs.spec import load_sweep

    if args.replicates < 0:
        raise UsageError(f"--replicates {args.replicates}: must be >= 0")
    design = load_sweep(args.design) if args.design else None  # a bad spec fails before the fits
    result = audit_store(args.sweep_dir, n_boot=args.replicates)
    text = format_audit(result)
    gate = None
    if design is not None:
        section = parse_gate(design.raw.get("recipe_gate"))  # its max_cost, or the gate's default
        cost = section.max_cost if section else GateSpec(audit=args.sweep_dir).max_cost
        gate = check_runs(design.runs, result, max_cost=cost, source=args.sweep_dir)
        text += f"\nthe design of {args.design}: the loss its recipe's LR and weight decay cost at each run\n"
        text += format_recipe_gate(gate)
    path = save_audit(args.sweep_dir, result, text)
    if args.json:
        out = result.to_dict()
        if gate is not None:
            keys = ("run_id", "params", "tokens", "lr", "best_lr", "lr_cost", "timescale", "wd_cost")
            out["design"] = [{k: getattr(r, k) for k in keys} for r in gate.rows]
        print(json.dumps(out, indent=1))
    else:
        print(text)
        print(f"written: {path}, audit.txt and recipe.yaml beside it")
    return 0


def run_ledger(args) -> int:
    from scalelab import store
    from scalelab.store.ledger import format_ledger, scored

    if not store.is_sweep_dir(args.sweep_dir):
        raise UsageError(f"{args.sweep_dir} is not a sweep directory (no sweep.yaml)")
    book = scored(args.sweep_dir)  # measured losses filled in here; the store is not written
    print(json.dumps(book, indent=2) if args.json else format_ledger(book))
    return 0
