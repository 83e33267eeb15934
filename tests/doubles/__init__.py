"""Protocol doubles of servers that cannot run here (see each module)."""
