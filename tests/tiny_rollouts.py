"""Helpers for tests that roll out the untrained tiny model on real envs."""

from __future__ import annotations


def accept_any(text: str, finish_reason: str):
    """Send whatever the untrained model says to the env, so rollouts are real multi-turn episodes."""
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "look"), None
