"""jobwarden: supervise JAX training jobs and prove their recoveries exact."""

__version__ = "0.1.0"
