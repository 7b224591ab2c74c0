"""The ablation axes: registries of small pure torch functions (see shared REFERENCE.md)."""
