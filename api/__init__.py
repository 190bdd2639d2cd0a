"""HTTP API (FastAPI) that accepts the same jobs as the CLI."""
