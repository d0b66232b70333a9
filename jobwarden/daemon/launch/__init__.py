"""How attempts are started and followed: the launcher seam, local process groups, spares, Slurm."""
