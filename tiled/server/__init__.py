"""The compile daemon: gRPC service, worker pool, metrics."""
