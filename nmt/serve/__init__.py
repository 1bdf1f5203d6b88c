"""The HTTP server: settings, request checks, the micro-batcher, the app and its page."""
