"""clawrl: serve a model to OpenClaw, record every turn, and learn from use."""

__version__ = "0.1.0"
