"""A user's own tools, tasks, reward and source, as a user would write them (imported by name in the tests)."""
