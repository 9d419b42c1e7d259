"""Connection tasks: the trio side of the protocol, one per client."""
