"""Mooncake PG: placeholder."""
