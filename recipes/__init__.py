"""Built-in recipes: TOML package data, installed as pipeline.recipes (see setup.py)."""
