"""Re-export of the user-input errors the CLI maps to exit code 2 (defined in scalelab.errors)."""

from scalelab.errors import ConfigError, UsageError

__all__ = ["ConfigError", "UsageError"]
