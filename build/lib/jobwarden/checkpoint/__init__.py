"""Complete-state checkpoints: container format, atomic commit, store, validation, writer lock."""
