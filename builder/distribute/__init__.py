"""Images beyond this host: registries, publish and pull, bundles for air-gapped hosts."""
