"""The list of subcommand modules (module under scalelab.cli, command name).

Add a line here when adding a command module; each module defines add_parser(sub) that sets
`func` on its parser.
"""

COMMANDS: list[tuple[str, str]] = [
    ("run_cmd", "run"),
    ("fit_cmd", "fit"),  # also registers predict and allocate
    ("data_cmd", "data"),
    ("models_cmd", "models"),
    ("eval_cmd", "eval"),
    ("export_cmd", "export"),
    ("eval_parity_cmd", "eval-parity"),
    ("sweep_cmd", "sweep"),
    ("demo_cmd", "demo"),
    ("parity_cmd", "parity"),
    ("analysis_cmd", "noise"),  # also registers predict-task, compare, plot, report
    ("plan_cmd", "plan-layout"),
    ("plan_run_cmd", "plan-run"),
    ("coordcheck_cmd", "coordcheck"),
    ("profile_cmd", "profile"),
]
