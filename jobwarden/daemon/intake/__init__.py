"""Requests taken in: the spool and the intake queue."""
