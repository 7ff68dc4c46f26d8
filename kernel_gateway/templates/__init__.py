"""Templates: kernel images the gateway builds from a base and steps (E2B's templates)."""
