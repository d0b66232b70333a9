"""What the daemon tells outside: metrics, the exporter, hooks, systemd notify."""
