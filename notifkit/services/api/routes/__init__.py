"""One module per resource; each holds an :class:`~notifkit.services.api.routing.Operations`
table that the app mounts and the OpenAPI document describes."""
