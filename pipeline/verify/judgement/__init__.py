"""What decides whether outputs are right: the figures (`metrics.py`), the bounds (`thresholds.py`)
and the check records and their comparisons (`checks.py`). No model runs here: engines/ run them."""
