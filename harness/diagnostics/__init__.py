"""Diagnostics of training health: collapse monitor, episode metrics, mutual-information proxy."""
