"""Clients that speak the wire (never the files)."""
