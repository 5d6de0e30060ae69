"""Sweeps: the plan of cells (prompt × mode × draft × k, baselines first), where the cells run (here or on Ray),
and the one loop that records each cell as one run."""
