"""What a result is made of: probes, oracles, the candidates of a design choice."""
