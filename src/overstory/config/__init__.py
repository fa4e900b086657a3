"""The configuration: its model, defaults, approval rules and the validated snapshot hot paths read."""
