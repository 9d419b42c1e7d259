"""Transport security: TLS contexts for the broker's listener and its clients."""
