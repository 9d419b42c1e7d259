"""Broky: a low-latency publish/subscribe message broker on trio."""
