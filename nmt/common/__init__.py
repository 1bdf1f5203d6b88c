"""What every layer shares: durable files, settings checks, the device, metrics, progress and provenance."""
