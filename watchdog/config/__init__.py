"""Settings: the daemon's TOML sections and their checks (read by every layer above model)."""
