"""The operator's side: wardenctl and the tools it runs (verify, inspect)."""
