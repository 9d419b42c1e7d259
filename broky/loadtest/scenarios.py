"""The scenarios ``broky bench`` runs (its flags and its runner both need them)."""

from typing import Final

SCENARIOS: Final = ("fan-in", "fan-out", "latency", "slow-subscriber", "receive")
