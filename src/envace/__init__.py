"""EnvACE."""
