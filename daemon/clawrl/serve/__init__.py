"""Serving: the daemon's lifecycle, its OpenAI-compatible HTTP API and the routes beside it
(control, dashboard, skills, OpenAPI), access control and systemd notification."""
