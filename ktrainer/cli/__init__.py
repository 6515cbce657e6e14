"""The `ktrainer` command."""
