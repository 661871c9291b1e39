"""Loss-curve laws: one law fitted on every logged checkpoint of every run.

The curve fit and what it predicts, the learning-rate areas of a schedule that the schedule-aware laws read, and
where a run leaves its curve.
"""
