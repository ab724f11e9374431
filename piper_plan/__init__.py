"""Piper planner: analytical resource model and layout search for MoE training.

Never imports torch at module level (see README: the planner must start fast on
machines without torch)."""

__version__ = "0.1.0"
