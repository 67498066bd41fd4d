"""Tools an agent can call: the registry, the context a call sees, the shipped toolsets."""
