"""The benchmark harness: model zoo, data, FLOPs, the System protocol, the runner, telemetry."""
