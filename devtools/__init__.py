"""Development harness shared by the tests and the bin/ scripts (not installed with the package)."""
