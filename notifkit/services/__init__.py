"""The eight services. Each is importable on its own; none imports another."""
