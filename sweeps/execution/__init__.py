"""Running a sweep on Ray: one Tune trial per run, retries that resume.

Dedupe and restart after a dead driver; the Ray cluster a command runs on (joined, or private on loopback) and what
it leaves behind; how credentials reach workers; the process group of a multi-process run; `sweep eval` and `sweep
status`.
"""
