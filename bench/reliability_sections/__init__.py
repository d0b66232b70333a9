"""The sections of bench/reliability.py, one module each, and what they share.

Imported relatively, so that they work both when bench/reliability.py runs as a script
(bench/ on the path) and when the tests import it as ``bench.reliability``.
"""
