"""What the tests, the CLI, the notebooks and bench/ share: seeded inputs, poisoning, comparisons and bounds, timing."""
