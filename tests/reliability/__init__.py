"""Short variants of bench/reliability.py's sections, asserting their acceptance conditions."""
