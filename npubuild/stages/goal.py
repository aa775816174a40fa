"""A precision goal as a user writes it, for messages and reports: 'cosine >= 0.99'."""

from __future__ import annotations


def goal_text(goal: dict) -> str:
    return ", ".join(f"{k} >= {v:g}" for k, v in goal.items() if v is not None) or "none"
