"""Where jobs run: in this process, or on Slurm through submitit (`launchers`)."""
