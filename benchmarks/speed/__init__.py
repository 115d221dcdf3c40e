"""Timings: against a peer implementation, the machine's roofline or the budget."""
