"""Security tools: risk graphs, image introspection, TEE overhead, timing faults."""
