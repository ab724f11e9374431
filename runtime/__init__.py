"""Piper runtime: executes a plan.json with torch (installed as `piper_runtime`)."""
