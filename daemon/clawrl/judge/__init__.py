"""Judging: reading each next state as feedback on the turn before it (rules, the engine or an
OpenAI-compatible model, the probe), the judging loop, the feedback corpus and judge evaluation."""
