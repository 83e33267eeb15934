"""clawrl: serve a model to OpenClaw, record every turn, and (soon) learn from use."""

__version__ = "0.1.0"
