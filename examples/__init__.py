"""Tasks of one's own, registered with envs.task (README: Add a task)."""
