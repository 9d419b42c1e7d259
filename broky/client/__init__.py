"""The trio client library."""
