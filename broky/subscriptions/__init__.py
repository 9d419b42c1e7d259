"""Durable subscriptions: who consumed what, redelivery, dead letters (sans-IO core)."""
