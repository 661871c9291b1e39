"""One pretraining run: config tree, data, optimizer and schedules, loop, checkpoints, evals, records."""
