"""Training and evaluation data: batch sources (numpy arrays, iterables, datasets), one-shot streams,
which data a stage uses (stage_data) and the checks on data (checks)."""
