"""The GCS emulator the tests run against: bench/gcs_emulator.py's (one launcher for the tests and
`python -m bench storage`)."""

from bench.gcs_emulator import BUCKET, create_bucket, environment, running

__all__ = ["BUCKET", "create_bucket", "environment", "running"]
