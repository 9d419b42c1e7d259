"""Routing: the subscription index, outboxes and the router that owns them."""
