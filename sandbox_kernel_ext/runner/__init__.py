"""Run code and commands under confinement that the operating system enforces."""
