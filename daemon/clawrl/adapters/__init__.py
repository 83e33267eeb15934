"""Adapter versions: the folder format every stage reads (versions.py) and the hot-swap that
guards, loads and routes to them (adapters/swap.py)."""
