"""wardend, the supervisor daemon (spool intake, job state machine, recovery)."""
