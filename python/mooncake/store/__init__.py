"""Mooncake store: placeholder."""
