"""Deterministic orchestration. Decisions live in pure functions; every side effect is an activity."""
