"""Helpers shared by the test suites (service selection for the fixtures)."""
