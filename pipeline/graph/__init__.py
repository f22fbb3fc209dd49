"""Graph stage: load/save models, detect hazards, and run repair passes (see passes/base.py)."""
