"""The run-config schema and the errors every layer raises (the bottom layer)."""
