"""Tests on a real single-node Slurm, brought up by `tests.slurm.cluster`."""
