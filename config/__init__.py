"""The run's config: the TOML loader, `--set` overrides, ConfigError, and the settings read from the environment."""
