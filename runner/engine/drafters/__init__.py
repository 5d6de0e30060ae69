"""The drafters, one module per family, and the registry (`registry.py`) that names each kind, parses its spec, loads
what it needs and makes it."""
