"""A real multi-node Docker Swarm on one machine, for tests and benches (see swarm.py)."""
