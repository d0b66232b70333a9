"""The training process: tasks run in a step loop that emits events and commits checkpoints."""
