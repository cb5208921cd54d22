"""Infrastructure tools: cluster validation, provisioning, storage middle tier."""
