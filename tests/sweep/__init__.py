"""embodied.sweep: grids of runs, their folders, local and Slurm launches."""
