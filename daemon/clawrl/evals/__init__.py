"""`clawrl eval`: simulated users (personas) against fresh daemons, and the reports it writes."""
