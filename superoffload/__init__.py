"""SuperOffload: exact, overlapped optimizer offload for Superchips."""

__version__ = "0.1.0"
