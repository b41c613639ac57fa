"""The launcher backends: every module in this package is one backend and registers its class by name."""
