"""`nebula simulate`: a lab month, its workloads, baselines and figures (the NebulaGrid
replay itself is head/replay.py)."""
