"""Model declarations: stages, topology, process-safe edges and recommended fractions."""
