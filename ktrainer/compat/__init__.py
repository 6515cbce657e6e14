"""What ktrainer needs from other libraries beyond their public API, isolated and checked (see keras_internals)."""
