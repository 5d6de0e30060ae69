"""Sweeps: the prompt suite, the plan of cells (prompt × mode × draft × k, baselines first), and recording
each cell as one run."""
