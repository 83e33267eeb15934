"""The turn log: one SQLite file that records every turn, its next state, judgment and
training state; its migrations, redaction, deletion and export."""
