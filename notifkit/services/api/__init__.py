"""The HTTP API (API.md) on aiohttp: ``create_app(settings)`` and the ``ApiService``."""
