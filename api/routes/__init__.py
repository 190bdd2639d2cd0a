"""The API's routers: jobs under /v1, health at the root."""
