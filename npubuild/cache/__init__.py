"""The content-addressed store, the action cache and the stat cache, on one diskcache directory."""
