"""The Slurm launcher: sbatch/srun attempts, followed through scontrol."""
