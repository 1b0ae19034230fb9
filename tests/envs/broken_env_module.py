"""A user's module that fails while importing."""

raise RuntimeError("the sandbox client needs SANDBOX_URL")
