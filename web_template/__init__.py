"""Browser files copied into every package: package data, installed as pipeline.web_template (see setup.py)."""
