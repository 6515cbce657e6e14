"""What every engine's compiled step speaks: its outputs (step outputs), the Module's step hooks,
the logged metrics and gradient accumulation."""
