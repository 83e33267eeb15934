"""Test-only: with this folder on PYTHONPATH and TINKER_DOUBLE_ROOT set, every Python process (the
daemon, the trainer it starts) gets the Tinker double as `tinker.ServiceClient` at start-up; the
rest of the real SDK (types, futures, exceptions) stays. See tests/doubles/tinker_double.py."""
import os

if os.environ.get("TINKER_DOUBLE_ROOT"):
    import importlib.util
    import sys
    from pathlib import Path

    _spec = importlib.util.spec_from_file_location(
        "tinker_double", Path(__file__).resolve().parents[1] / "tinker_double.py")
    _double = importlib.util.module_from_spec(_spec)
    sys.modules["tinker_double"] = _double
    _spec.loader.exec_module(_double)
    _double.install()
